"""``stallfree simulate``: continuous traffic through one or more policies, side by side.

Ctrl-C or SIGTERM during the simulation stops it between two steps: what finished is kept (the
policies run, and the requests the running one had finished) and written where the options say,
its summary marked partial, exit code 130 (143 after a SIGTERM). A second one abandons that."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from stallfree.cli.classes_args import (
    add_classes_arg,
    add_shed_args,
    classes_text,
    classes_workload,
    shed_rule,
)
from stallfree.cli.common import UsageError, non_negative_float, positive_float, positive_int
from stallfree.cli.cost_args import (
    add_kv_link_arg,
    add_roofline_args,
    add_roofline_dtype_arg,
    cost_choice,
    dtype_bytes_arg,
    picked_choice,
)
from stallfree.cli.deployment_args import (
    add_deployment_file_arg,
    add_deployment_out_arg,
    apply_deployment_file,
    write_deployment,
)
from stallfree.cli.serving_args import (
    acceptance_arg,
    add_acceptance_arg,
    add_serving_args,
    serving_config,
    serving_configs,
)
from stallfree.cli.workload_args import (
    DEFAULT_NUM_REQUESTS,
    add_traffic_args,
    agent_workload,
    traffic_workload,
    workload_text,
)
from stallfree.core.router import ROUTER_NAMES
from stallfree.costs.kv_transfer import DEFAULT_HOST_LINK, DEFAULT_KV_LINK, DEFAULT_SHARED_LINK, KV_CONNECTORS
from stallfree.tune.sigint import stop_on_signal  # light: stdlib only

if TYPE_CHECKING:
    from stallfree.core.serving import ServingConfig
    from stallfree.costs.choice import CostChoice
    from stallfree.sim import SimulationResult
    from stallfree.sim.deployment import Autoscale, Deployment, ReplicaGroup
    from stallfree.sim.disagg import Disaggregation
    from stallfree.sim.kv_tiers import KvTierConfig
    from stallfree.sim.speculative import Acceptance

_DESCRIPTION = """\
Simulate a serving replica under continuous traffic: requests arrive (Poisson, gamma, all at
once, or replayed from a trace), the stall-free scheduler (or a baseline policy) plans each
step under a token budget and the KV-cache memory, and a cost model prices each step.
Several policies (--policy a,b,c) run the same requests and print one table side by side.
Metrics follow `vllm bench serve`: TTFT, TPOT, ITL, E2EL (mean/median/std/p90/p99, ms), plus
the longest inter-token gap, scheduling delay, preemptions, rejections and goodput.
KV capacity = GPU memory x TP x --gpu-memory-utilization - weights - an activation reserve.
The default cost model is `auto`: `measured` from --profile when one is given, else measured GPU
tables (aiconfigurator-core's where installed and covering the model and GPU, else Vidur's on an
a100-*/h100-*/a40 preset); otherwise `full`, the roofline that charges attention over each chunk's
earlier context and the KV-cache reads. `seed` is the weights-only
roofline. The header says which model ran and why.
"""

_EPILOG = """\
examples:
  stallfree simulate                                   # 1,000 arXiv-length requests at QPS 2
  stallfree simulate --policy prefill-first,decode-first,chunked --qps 4 --lengths sharegpt
  stallfree simulate --trace splitwise-conv --num-requests 5000 --model llama-3-70b \\
      --hardware h100-sxm --tp 4 --json
  stallfree simulate --workload gamma --qps 3 --burstiness 0.5 --lengths lognormal:2000,200 \\
      --goodput ttft:500 tpot:50 --requests-out out/requests.csv --trace-out out/steps.json --plot out/
  stallfree simulate --replicas 4 --router cache-aware --trace mooncake-conversation \
      --model llama-3.1-8b --hardware h100-sxm --num-requests 500
lengths: a trace path or name (sharegpt, arxiv, bwb, splitwise-conv, splitwise-code,
  mooncake-conversation, mooncake-synthetic), fixed:P,O  uniform:PMIN-PMAX,OMIN-OMAX
  lognormal:PMEDIAN,OMEDIAN[,SIGMA]
"""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "simulate",
        help="continuous traffic through the scheduler on a simulated clock: TTFT/TPOT/ITL by policy",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_deployment_file_arg(p.add_argument_group("deployment"))
    _add_fleet_args(p)
    _add_disaggregation_args(p)
    _add_kv_tier_args(p)
    _add_model_args(p)
    _add_scheduler_args(p)
    workload = p.add_argument_group("workload")
    add_traffic_args(workload)
    add_classes_arg(workload)
    add_shed_args(workload)
    _add_output_args(p)
    p.set_defaults(handler=run)
    p.set_defaults(flag_defaults=vars(p.parse_args([])))  # last: every flag's default


def _add_fleet_args(p: argparse.ArgumentParser) -> None:
    """The "fleet" group: the replicas behind a router, alike or not."""
    f = p.add_argument_group("fleet")
    f.add_argument(
        "--replicas",
        type=positive_int,
        default=1,
        help="replicas of the deployment behind a router (default 1)",
    )
    f.add_argument(
        "--router",
        choices=ROUTER_NAMES,
        default="round-robin",
        help="how arrivals are spread over the replicas: cache-aware is vllm-router's rule (prefix match "
        "rate over 0.3 follows the prefix, else the least loaded; imbalanced loads go to the least loaded; "
        "vLLM replicas need --enable-scale-out for the router to see their tokens, else it is "
        "least-requests) (default %(default)s)",
    )
    f.add_argument(
        "--fleet",
        metavar="NxHARDWARE[:tpK],...",
        help="replicas that differ, instead of --replicas: e.g. 4xh100-sxm:tp2,4xa100-80gb (each priced "
        "as --cost-model says, with its own KV cache)",
    )
    f.add_argument(
        "--route-delay-ms",
        type=non_negative_float,
        default=0.0,
        help="time from the router's choice to the replica's queue, counted in TTFT (default 0)",
    )
    _add_autoscale_args(p.add_argument_group("autoscaling (a fleet through the day)"))


def _add_autoscale_args(a: argparse._ArgumentGroup) -> None:
    a.add_argument(
        "--autoscale",
        metavar="RULE",
        help="resize the fleet as the Kubernetes HPA (KEDA) does on a per-replica target of vLLM's "
        "num_requests_waiting (waiting), num_requests_running (running) or kv_cache_usage_perc (kv), "
        "e.g. keda:waiting=8; or as a forecast of the rate, sla:qps=CAPACITY[,interval=S][,window=N]; "
        "or as NVIDIA Dynamo Planner 1.4.2's load-based rule on each replica's KV load, "
        "dynamo-load:[throughput|latency][,interval=S] or dynamo-load:up=PCT,down=PCT[,interval=S] "
        "(its tick is 5 s: give --scrape-s 5); --replicas is then the starting size (default --min-replicas)",
    )
    a.add_argument("--min-replicas", type=positive_int, default=1, help="the autoscaler's floor (default 1)")
    a.add_argument(
        "--max-replicas", type=positive_int, default=8, help="the autoscaler's ceiling (default 8)"
    )
    a.add_argument(
        "--startup-s",
        type=non_negative_float,
        default=120.0,
        help="a new replica's time from the decision to routable: scheduling, pulling, loading weights, "
        "warm-up (default %(default)s)",
    )
    a.add_argument(
        "--scrape-s",
        type=positive_float,
        default=15.0,
        help="how often the autoscaler reads the replicas' metrics and decides (default %(default)s)",
    )
    a.add_argument(
        "--scale-down-window-s",
        type=non_negative_float,
        default=300.0,
        help="the HPA's scale-down stabilization window: a scale-down takes the highest count wanted "
        "over this long (KEDA's behavior.scaleDown.stabilizationWindowSeconds; default %(default)s)",
    )
    a.add_argument(
        "--window-s",
        type=positive_float,
        default=3600.0,
        help="rows of the day's table, by arrival (default %(default)s: hourly)",
    )
    a.add_argument(
        "--gpu-hour-cost", type=positive_float, metavar="USD", help="price of a GPU-hour, for the cost"
    )


def _add_disaggregation_args(p: argparse.ArgumentParser) -> None:
    """The "disaggregation" group: the prefill and decode pools and the KV link between them."""
    d = p.add_argument_group("disaggregation")
    d.add_argument(
        "--disaggregate",
        metavar="xPyD",
        help="serve from x prefill and y decode replicas, each request's KV moved between them over "
        "--kv-link (same as --policy disagg:xPyD; list it beside chunked to compare on the same GPUs)",
    )
    add_kv_link_arg(d.add_argument, "between the pools")
    for pool in ("prefill", "decode"):
        d.add_argument(
            f"--{pool}-tp", type=positive_int, metavar="N", help=f"GPUs a {pool} replica (default --tp)"
        )
    d.add_argument(
        "--kv-connector",
        choices=tuple(KV_CONNECTORS),
        default=next(iter(KV_CONNECTORS)),
        help="what moves: nixl, every prompt token's KV; shared-storage, its full blocks short of the last "
        "token (vLLM's ExampleConnector: the decode replica computes the rest again) (default %(default)s)",
    )
    d.add_argument(
        "--prefill-profile",
        metavar="FILE",
        help="with --profile: the prefill replicas' own profile (default: --profile for both pools)",
    )
    d.add_argument(
        "--prefill-token-budget",
        type=positive_int,
        metavar="N",
        help="tokens a prefill replica's step may hold (default --token-budget)",
    )


def _add_kv_tier_args(p: argparse.ArgumentParser) -> None:
    """The "KV tiers" group: a host tier per replica and a store the fleet shares, below the GPU's
    prefix cache."""
    from stallfree.costs.kv_transfer import HOST_LINKS, LINKS

    t = p.add_argument_group("KV tiers (below each replica's GPU prefix cache; docs/kv-tiers.md)")
    t.add_argument(
        "--kv-host-gb",
        type=positive_float,
        metavar="GB",
        help="host memory for KV a replica: every block cached on the GPU is written through, "
        "evicted least recently used, loaded back over --kv-host-link when a prompt needs it",
    )
    t.add_argument(
        "--kv-host-link",
        default=DEFAULT_HOST_LINK,
        metavar="LINK",
        help=f"a GPU's link to host memory: {', '.join(HOST_LINKS)}, or GB/s a GPU (default %(default)s)",
    )
    t.add_argument(
        "--kv-shared-gb",
        type=positive_float,
        metavar="GB",
        help="a KV store the whole fleet shares (as LMCache or Mooncake Store): written through by "
        "every replica, read over each replica's --kv-shared-link",
    )
    networks = ", ".join(name for name in LINKS if name != "nvlink")
    t.add_argument(
        "--kv-shared-link",
        default=DEFAULT_SHARED_LINK,
        metavar="LINK",
        help=f"a GPU's network link to the shared store: {networks}, or GB/s a GPU (default %(default)s)",
    )


def _kv_tiers(args: argparse.Namespace) -> KvTierConfig | None:
    """The KV tiers the flags ask for (None without --kv-host-gb or --kv-shared-gb)."""
    from stallfree.sim.kv_tiers import KvTierConfig

    if args.kv_host_gb is None and args.kv_shared_gb is None:
        for flag, default in (("kv_host_link", DEFAULT_HOST_LINK), ("kv_shared_link", DEFAULT_SHARED_LINK)):
            if getattr(args, flag) != default:
                tier = "--kv-host-gb" if flag == "kv_host_link" else "--kv-shared-gb"
                raise UsageError(f"--{flag.replace('_', '-')} applies with {tier}")
        return None
    if args.autoscale is not None or args.disaggregate is not None:
        raise UsageError("KV tiers run on one replica or a fleet: not with --autoscale or --disaggregate yet")
    try:
        return KvTierConfig(args.kv_host_gb, args.kv_host_link, args.kv_shared_gb, args.kv_shared_link)
    except ValueError as exc:
        raise UsageError(f"--kv-*: {exc}") from None


def _add_model_args(p: argparse.ArgumentParser) -> None:
    """The "model and hardware" group: what a step costs (the cost model's inputs)."""
    g = p.add_argument_group("model and hardware")
    add_roofline_args(g)
    add_roofline_dtype_arg(g, None)
    g.add_argument(
        "--sampling",
        choices=("greedy", "temperature", "top-p"),
        default="greedy",
        help="--cost-model measured: the sampler every request uses (default greedy)",
    )
    g.add_argument(
        "--step-overhead-ms",
        type=float,
        default=0.0,
        help="fixed time added to every step: scheduling, sampling, launches (default 0)",
    )


def _add_scheduler_args(p: argparse.ArgumentParser) -> None:
    """The "scheduler" group: the policies, their serving config, drafts and KV memory share."""
    g = p.add_argument_group("scheduler")
    add_serving_args(
        g, policy_list=True, more_policies=", disagg:xPyD (prefill and decode pools: --disaggregate)"
    )
    add_acceptance_arg(g, draft=True)
    g.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=0.9,
        help="fraction of GPU memory for weights, activations and KV cache (default 0.9)",
    )


def _add_output_args(p: argparse.ArgumentParser) -> None:
    """The "output" group: goodput SLOs, what is printed and written, and how steps are run."""
    g = p.add_argument_group("output")
    g.add_argument(
        "--goodput",
        nargs="+",
        metavar="METRIC:MS",
        help="SLOs such as ttft:500 tpot:50 (as vllm bench serve)",
    )
    g.add_argument(
        "--json",
        action="store_true",
        help='print JSON: {"scenario", "policies": {POLICY: summary}}, one policy or several',
    )
    g.add_argument(
        "--requests-out", metavar="CSV", help="per-request records (one file per policy if several)"
    )
    g.add_argument("--trace-out", metavar="JSON", help="per-step Chrome trace, open in ui.perfetto.dev")
    g.add_argument(
        "--plot",
        metavar="DIR",
        help="write ITL/TTFT CDFs, batch composition and KV usage figures (--autoscale: replicas, load "
        "and SLO misses over the run, autoscale.png)",
    )
    add_deployment_out_arg(g, "the deployment run (the first policy's)")
    g.add_argument(
        "--step-by-step",
        action="store_true",
        help="schedule every step (slow reference; results equal the default fast path)",
    )
    g.add_argument(
        "--step-noise",
        action="store_true",
        help="with --profile: vary each step's time as the profiled machine's steps varied (its repeats "
        "and reference steps; seeded by --seed): the tails of a noisy host",
    )


def run(args: argparse.Namespace) -> int:
    from stallfree.sim.outputs import write_outputs
    from stallfree.sim.report import format_table, interrupted_text, summarize_interruption

    apply_deployment_file(args, args.flag_defaults)
    runs = _runs(args)
    step_profile = None  # the model default and the header's fingerprint
    if args.profile is not None:
        from stallfree.specs.step_profile import load_profile

        step_profile = load_profile(args.profile)
    if args.model is None:
        args.model = cost_choice(args).model_name
    if args.step_noise and step_profile is None:
        raise UsageError("--step-noise needs --profile: it is how the profiled machine's steps varied")
    if not args.step_overhead_ms >= 0:
        raise UsageError(f"--step-overhead-ms must be >= 0, got {args.step_overhead_ms}")
    acceptance = acceptance_arg(args)
    deployments, cost_model_note = _deployments(args, runs, acceptance)
    policies = [d.label for d in deployments]
    if args.deployment_out:
        write_deployment(deployments[0], args.deployment_out)
    workload, num_requests, results = _simulate_all(args, deployments)
    days = _days(args, results)
    interrupted = len(results) < len(policies) or any(r.partial for r in results)
    outputs = write_outputs(results, len(policies), args.requests_out, args.trace_out)
    if args.plot and not interrupted:
        from stallfree.plots.traffic import plot_traffic

        outputs += [str(path) for path in plot_traffic(results, args.plot)]
    fingerprint = step_profile.fingerprint if step_profile is not None else None
    scenario = _scenario(args, workload, num_requests, cost_model_note, fingerprint, acceptance)
    stopped = summarize_interruption(results, policies, num_requests) if interrupted else None
    if args.json:
        # One shape whether one policy ran or several.
        body: dict[str, Any] = {"scenario": scenario, "policies": {r.policy: r.summary for r in results}}
        if stopped is not None:
            body["partial"] = True
            body["interrupted"] = stopped
        if outputs:
            body["outputs"] = outputs
        print(json.dumps(body, indent=2))
    elif results:
        print(format_table(scenario, [r.summary for r in results], outputs) + days)
    if stopped is None:
        return 0
    text = interrupted_text(stopped)
    if not args.json:
        print(f"INTERRUPTED: {text}")
    sys.stdout.flush()
    where = f"wrote {', '.join(outputs)}; " if outputs else ""
    skipped = "no figures drawn (--plot); " if args.plot else ""
    summary = "the summary (marked partial) is on stdout" if results else "nothing had finished"
    print(f"stallfree simulate: interrupted; {text}; {where}{skipped}{summary}", file=sys.stderr)
    return 130


def _runs(args: argparse.Namespace) -> list[tuple[ServingConfig, Disaggregation | None]]:
    """One (serving config, disaggregation) per entry of ``--policy`` (``disagg:xPyD`` entries, or
    ``--disaggregate``, run chunked pools); aggregated entries beside a disaggregated one default to
    its GPUs (``--replicas``: their GPUs over --tp)."""
    from stallfree.core import POLICIES
    from stallfree.costs.kv_transfer import PoolShape
    from stallfree.sim.disagg import Disaggregation

    names = [name.strip() for name in args.policy.split(",") if name.strip()]
    unknown = [name for name in names if name not in POLICIES and not name.startswith("disagg:")]
    if unknown:
        raise UsageError(
            f"unknown policy {', '.join(map(repr, unknown))}; choose from: {', '.join(POLICIES)}, disagg:xPyD"
        )
    if args.disaggregate is not None:
        if args.policy != "chunked":
            raise UsageError("give --disaggregate xPyD or list disagg:xPyD in --policy, not both")
        names = [f"disagg:{args.disaggregate}"]
    shapes = []
    for name in (n for n in names if n.startswith("disagg:")):
        try:
            shapes.append(PoolShape.parse(name[7:], args.prefill_tp or args.tp, args.decode_tp or args.tp))
        except ValueError as exc:
            raise UsageError(f"--policy {name}: {exc}") from None
    if not shapes:
        defaults = {"kv_link": DEFAULT_KV_LINK, "kv_connector": next(iter(KV_CONNECTORS))}  # others: None
        for flag in (
            "kv_link",
            "prefill_tp",
            "decode_tp",
            "prefill_token_budget",
            "kv_connector",
            "prefill_profile",
        ):
            if getattr(args, flag) != defaults.get(flag):
                raise UsageError(f"--{flag.replace('_', '-')} applies with --disaggregate xPyD")
        return [(serving, None) for serving in serving_configs(args)]
    if len({str(shape) for shape in shapes}) != len(shapes):
        raise UsageError(f"policy listed twice in {args.policy!r}")
    if args.fleet or args.route_delay_ms or args.num_speculative_tokens:
        raise UsageError("--disaggregate runs pools of --tp GPUs: no --fleet, --route-delay-ms or drafts yet")
    aggregated = [n for n in names if not n.startswith("disagg:")]
    chunked = serving_config(args, "chunked")
    runs: list[tuple[ServingConfig, Disaggregation | None]] = []
    if aggregated:
        runs += [
            (serving, None)
            for serving in serving_configs(
                argparse.Namespace(**{**vars(args), "policy": ",".join(aggregated)})
            )
        ]
        if args.replicas == 1:  # the same GPUs as the (first) disaggregated deployment
            gpus = shapes[0].num_gpus
            if gpus % args.tp:
                raise UsageError(
                    f"{shapes[0]} has {gpus} GPUs, not a whole number of --tp {args.tp} replicas: give --replicas"
                )
            args.replicas = gpus // args.tp
    budget = args.prefill_token_budget
    if args.prefill_profile and not args.profile:
        raise UsageError("--prefill-profile goes with --profile (the decode replicas')")
    runs += [
        (chunked, Disaggregation(shape, args.kv_link, budget, args.kv_connector, args.prefill_profile))
        for shape in shapes
    ]
    return runs


def _deployments(
    args: argparse.Namespace,
    runs: list[tuple[ServingConfig, Disaggregation | None]],
    acceptance: Acceptance | None,
) -> tuple[list[Deployment], str | None]:
    """The flags as one deployment per policy (what every run of the command is built from), and
    why auto picked the cost model (None when --cost-model named it)."""
    from stallfree.sim.deployment import Deployment, Speculation

    options = {
        "dtype_bytes": dtype_bytes_arg(args),
        "sampling": args.sampling,
        "step_overhead_s": args.step_overhead_ms / 1000,
    }
    # A lone kind of replica is priced by the choice as asked (picked once, here); pools and
    # replica groups by its kind resolved (args.cost_model is set to it), each at its own TP.
    asked, _, cost_model_note = picked_choice(args, **options)
    costs = cost_choice(args, **options)
    fleet = _fleet(args, costs) if args.fleet else ()
    autoscale = _autoscale(args)
    kv_tiers = _kv_tiers(args)
    shed = shed_rule(args)
    speculation = None
    if acceptance is not None:
        try:
            speculation = Speculation(acceptance, args.draft)
        except ValueError as exc:
            raise UsageError(f"--draft: {exc}") from None
    deployments = []
    for serving, disagg in runs:
        common = {
            "costs": costs,
            "serving": serving,
            "gpu_memory_utilization": args.gpu_memory_utilization,
            "router": args.router,
            "speculation": speculation if serving.num_speculative_tokens else None,
        }
        if disagg is not None:
            if shed is not None:
                raise UsageError("--shed-priority runs on one replica or a fleet: not with disaggregation")
            deployments.append(Deployment(**common, disaggregate=disagg))
        else:
            if autoscale is not None and args.replicas == 1:
                args.replicas = autoscale.min_replicas  # the day starts at the floor
            replicas = 1 if fleet else args.replicas
            fields = {"replicas": replicas, "fleet": fleet, "route_delay_ms": args.route_delay_ms}
            if not fleet:
                fields["costs"] = asked
            deployments.append(
                Deployment(**{**common, **fields}, autoscale=autoscale, kv_tiers=kv_tiers, shed=shed)
            )
    return deployments, cost_model_note


def _autoscale(args: argparse.Namespace) -> Autoscale | None:
    """``--autoscale`` and its bounds (None without it; its other flags then refused)."""
    from stallfree.sim.deployment import Autoscale

    if args.autoscale is None:
        defaults = {
            "min_replicas": 1,
            "max_replicas": 8,
            "startup_s": 120.0,
            "scrape_s": 15.0,
            "scale_down_window_s": 300.0,
        }
        for name, default in defaults.items():
            if getattr(args, name) != default:
                raise UsageError(f"--{name.replace('_', '-')} applies with --autoscale")
        return None
    if args.disaggregate is not None or any(p.startswith("disagg:") for p in args.policy.split(",")):
        raise UsageError("--autoscale resizes a fleet of alike replicas, not prefill and decode pools")
    try:
        return Autoscale(
            args.autoscale,
            args.min_replicas,
            args.max_replicas,
            args.startup_s,
            args.scrape_s,
            args.scale_down_window_s,
        )
    except ValueError as exc:
        raise UsageError(f"--autoscale: {exc}") from None


def _simulate_all(
    args: argparse.Namespace, deployments: list[Deployment]
) -> tuple[Any, int, list[SimulationResult]]:
    """The workload, how many requests it gave and one result per deployment (fewer after a Ctrl-C
    or SIGTERM, which stops the simulation between steps)."""
    from stallfree.metrics.io import parse_goodput
    from stallfree.sim import simulate
    from stallfree.workload import sample
    from stallfree.workload.classes import class_summaries

    goodput = parse_goodput(args.goodput) if args.goodput else None
    workload: Any
    requests: Any
    drawn = None  # how many requests simulate draws (traffic classes)
    replayed, row_class = None, {}  # a replayed bench result, and each of its rows' class
    if (agents := agent_workload(args)) is not None:
        workload = requests = agents
    elif (classes := classes_workload(args)) is not None:
        drawn = DEFAULT_NUM_REQUESTS if args.num_requests is None else args.num_requests
        workload = requests = classes  # simulate draws them
    elif args.replay:
        from stallfree.workload.bench_result import load_bench_result

        replayed = load_bench_result(args.replay)
        workload, requests = None, replayed.arrays
        row_class = {str(i): name for i, name in enumerate(replayed.arrays.traffic_class or ())}
    else:
        workload, num_requests = traffic_workload(args)
        requests = sample(workload, num_requests, args.seed)
    span_s = _arrival_span_s(requests, drawn, args.seed) if args.autoscale else 0.0
    if args.autoscale is not None and args.startup_s >= span_s:
        raise UsageError(
            f"--startup-s {args.startup_s:g} is longer than the run's {span_s:,.0f} s of arrivals: no replica "
            "the autoscaler adds would serve"
        )
    results: list[SimulationResult] = []
    with stop_on_signal() as stop:
        for deployment in deployments:
            if stop.is_set():
                break
            started = time.perf_counter()
            result = simulate(
                requests,
                deployment,
                num_requests=drawn,
                goodput=goodput,
                keep_steps=bool(args.trace_out or args.plot),
                fast=not args.step_by_step,
                step_noise=args.step_noise,
                seed=args.seed,
                stop=stop.is_set,
            )
            result.summary["sim_wall_s"] = time.perf_counter() - started
            if replayed is not None and replayed.classes:  # a classes run's: scored per class too
                result.summary["classes"] = class_summaries(
                    replayed.classes,
                    row_class,
                    result.records,
                    result.class_itl,
                    result.summary["duration"],
                )
            results.append(result)
    return workload, len(requests) if drawn is None else sum(workload.counts(drawn)), results


def _arrival_span_s(requests: Any, drawn: int | None, seed: int) -> float:
    """Seconds from the first arrival to the last (traffic classes: as simulate will draw them)."""
    from stallfree.workload.classes import TrafficClasses

    if isinstance(requests, TrafficClasses):
        assert drawn is not None
        times = [r.arrival_time_s for r in requests.sample(drawn, seed)]
    else:
        times = requests.arrival_time_s
    return float(times[-1] - times[0]) if len(times) else 0.0


def _fleet(args: argparse.Namespace, costs: CostChoice) -> tuple[ReplicaGroup, ...]:
    """``--fleet``'s replica groups, each one's pricing checked (the kind --cost-model resolved to)."""
    from stallfree.costs.choice import pick_once
    from stallfree.sim.deployment import ReplicaGroup

    if args.replicas != 1:
        raise UsageError("give --replicas or --fleet, not both")
    try:
        groups = ReplicaGroup.parse_fleet(args.fleet)
    except ValueError as exc:
        raise UsageError(f"--fleet: {exc}") from None
    for group in groups:
        try:
            pick_once(replace(costs, hardware=group.hardware, tp=group.tp))
        except ValueError as exc:
            raise UsageError(f"--fleet {group}: {exc}") from None
    return groups


def _scenario(
    args: argparse.Namespace,
    workload: Any,
    num_requests: int,
    cost_model_note: str | None,
    fingerprint: Mapping[str, Any] | None,
    acceptance: Acceptance | None,
) -> dict[str, Any]:
    from stallfree.sim.deployment import ReplicaGroup
    from stallfree.specs import HARDWARE_PRESETS, load_hardware_spec
    from stallfree.specs.step_profile import machine_label
    from stallfree.workload.classes import TrafficClasses

    chunked = serving_config(args, "chunked")  # the header describes the chunked policy's step
    mix = ReplicaGroup.parse_fleet(args.fleet) if args.fleet else ()
    hardware_file = None if args.hardware in HARDWARE_PRESETS else args.hardware
    hardware = load_hardware_spec(args.hardware).name  # a JSON file's own name, not its path
    if fingerprint is not None:  # steps priced by a profile run on the profiled machine, not on --hardware
        hardware, hardware_file = machine_label(fingerprint), None
    return {
        "model": args.model,
        "hardware": hardware,
        "hardware_file": hardware_file,
        "tp": args.tp,
        "expert_parallel": args.expert_parallel,
        "cost_model": args.cost_model,  # resolved: never "auto"
        "cost_model_note": cost_model_note,  # why auto picked it; None when --cost-model named it
        "profile": args.profile,
        "step_overhead_ms": args.step_overhead_ms,
        "step_noise": args.step_noise,
        "num_requests": num_requests,
        "workload": classes_text(workload)
        if isinstance(workload, TrafficClasses)
        else workload_text(workload, args.replay),
        "seed": args.seed,
        "replicas": sum(g.count for g in mix) if mix else args.replicas,
        "fleet": args.fleet,
        "gpus": sum(g.count * g.tp for g in mix) if mix else args.replicas * args.tp,
        "router": args.router,
        "route_delay_ms": args.route_delay_ms,
        "token_budget": chunked.token_budget,
        "chunk_tokens": chunked.chunk_tokens,
        "step_budget_ms": chunked.step_budget_ms,
        "max_num_seqs": chunked.num_seqs_limit,
        "enable_prefix_caching": chunked.enable_prefix_caching,
        **({"scheduling_policy": chunked.scheduling_policy} if chunked.scheduling_policy != "fcfs" else {}),
        **_speculation(args, chunked, acceptance),
        "block_size": chunked.block_size,
        "num_blocks": chunked.num_blocks,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        **(
            {
                "kv_host_gb": args.kv_host_gb,
                "kv_host_link": args.kv_host_link,
                "kv_shared_gb": args.kv_shared_gb,
                "kv_shared_link": args.kv_shared_link,
            }
            if args.kv_host_gb or args.kv_shared_gb
            else {}
        ),
    }


def _speculation(
    args: argparse.Namespace, chunked: ServingConfig, acceptance: Acceptance | None
) -> dict[str, Any]:
    """The header's speculative decoding (nothing without it)."""
    if acceptance is None:
        return {}
    return {
        "num_speculative_tokens": chunked.num_speculative_tokens,
        "speculative_rule": chunked.speculative_rule,
        "acceptance_rates": list(acceptance.rates),
        "draft_rate": acceptance.proposal_rate,
        "draft": args.draft,
    }


def _days(args: argparse.Namespace, results: list[SimulationResult]) -> str:
    """An autoscaled run's day, window by window: added to each summary (``autoscale.windows``),
    and as text (empty without --autoscale)."""
    from stallfree.metrics.io import parse_goodput
    from stallfree.sim.day_report import day_windows, format_day

    if args.autoscale is None:
        return ""
    goodput = parse_goodput(args.goodput) if args.goodput else None
    text = []
    for result in results:
        scale = result.summary["autoscale"]
        scale["window_s"] = args.window_s
        scale["windows"] = day_windows(result.records, scale, args.window_s, goodput)
        if args.gpu_hour_cost:
            scale["gpu_hour_cost"] = args.gpu_hour_cost
        text.append(format_day(result.summary, scale["windows"], args.gpu_hour_cost))
    return "\n".join(text)
