"""``stallfree tune``: capacity per budget, the best budget, launch flags. The decisions are the
library's (:mod:`stallfree.tune.advise`); this parses and prints. Heavy imports happen inside the
handler."""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from stallfree.cli.classes_args import add_classes_arg, classes_workload
from stallfree.cli.common import (
    UsageError,
    int_list,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)
from stallfree.cli.cost_args import (
    add_kv_link_arg,
    add_roofline_args,
    add_roofline_dtype_arg,
    cost_choice,
    dtype_bytes_arg,
    measured_profile,
    resolve_cost_model,
)
from stallfree.cli.deployment_args import add_deployment_out_arg, write_deployment
from stallfree.cli.serving_args import add_acceptance_arg, add_prefix_caching_arg
from stallfree.cli.sweep import add_run_args, make_dir, show_progress, trial_pool
from stallfree.costs.kv_transfer import DEFAULT_HOST_LINK, DEFAULT_KV_LINK, DEFAULT_SHARED_LINK

if TYPE_CHECKING:
    from stallfree.costs.choice import CostChoice
    from stallfree.sim.deployment import Deployment, Speculation
    from stallfree.tune.capacity import TuneInterrupted
    from stallfree.tune.fleet import FleetPrices
    from stallfree.tune.trial import TrialSpec

DEFAULT_MODEL = "mistral-7b"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "tune",
        help="capacity (max QPS under latency SLOs) per policy and token budget; the best budget",
        description=(
            "For each policy and token budget, binary-search the highest QPS at which a seeded simulation "
            "meets every SLO (Sarathi-Serve's capacity); report the capacity curve, the best budget and the "
            "matching vLLM / SGLang flags. Trials run in a local process pool or as Ray tasks. Exit code 1 "
            "when no budget of any policy meets the SLOs (the closest trial is shown)."
        ),
    )
    _add_deployment_args(p)
    _add_candidate_args(p)
    _add_fleet_args(p)
    _add_mode_args(p)
    _add_day_args(p)
    _add_classes_args(p)
    _add_search_args(p)
    add_run_args(p)
    add_deployment_out_arg(
        p, "the best deployment found (policy, budget, replicas or layout; nothing if none met)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object (every trial included)")
    p.add_argument("--plot", metavar="DIR", help="write capacity-vs-budget and P99-TBT-vs-QPS figures to DIR")
    p.set_defaults(handler=run_tune)
    p.set_defaults(flag_defaults=vars(p.parse_args([])))  # last: every flag's default


def _add_deployment_args(p: argparse.ArgumentParser) -> None:
    """What every trial shares: the model, hardware and KV memory, the workload."""
    add_roofline_args(p, model=DEFAULT_MODEL)
    add_roofline_dtype_arg(p, None)
    p.add_argument(
        "--gpu-memory-utilization",
        type=positive_float,
        default=0.9,
        help="share of GPU memory for weights + KV cache, as vLLM (default %(default)s)",
    )
    p.add_argument(
        "--num-blocks",
        type=positive_int,
        help="KV-cache blocks of 16 tokens, as the engine's --num-blocks (default: from GPU memory; "
        "with --profile, what the profiled engine allocates: max-num-seqs full contexts)",
    )
    p.add_argument(
        "--lengths",
        default="sharegpt",
        help="request lengths: a trace name or path, fixed:P,O, uniform:..., lognormal:... (default %(default)s)",
    )
    p.add_argument(
        "--arrival",
        choices=("poisson", "gamma", "trace"),
        default="poisson",
        help="arrival process; trace: the arrival times of the trace --lengths names, scaled to --qps (fleet only)",
    )
    p.add_argument("--burstiness", type=positive_float, default=1.0, help="gamma shape (default 1: Poisson)")
    p.add_argument(
        "--num-requests",
        type=positive_int,
        default=2000,
        help="requests per trial (default %(default)s: the P99 TTFT rests on its top 20)",
    )
    p.add_argument(
        "--seed", type=non_negative_int, default=0, help="workload seed, the same for every trial (default 0)"
    )
    add_prefix_caching_arg(p)


def _add_candidate_args(p: argparse.ArgumentParser) -> None:
    """What is tried: the policies, their token budgets, draft lengths and step-time targets."""
    from stallfree.core.policy import SPECULATIVE_RULES  # light

    p.add_argument(
        "--policy",
        default="chunked,prefill-first",
        help="comma-separated policies (default %(default)s)",
    )
    p.add_argument(
        "--budgets",
        default="auto",
        metavar="auto|N1,N2,...",
        help="token budgets (--max-num-batched-tokens); auto: powers of two 128..8192 and 1, 2, 4 x the "
        "roofline ridge, rounded to multiples of 64 (default %(default)s)",
    )
    p.add_argument(
        "--speculative-tokens",
        metavar="K1,K2,...",
        help="also try chunked with speculative decoding: each decode verifies up to K draft tokens "
        "(n-gram, free to draft), e.g. 0,2,4; needs --acceptance-rate (default: no drafts)",
    )
    add_acceptance_arg(p, draft_rate=False, draft=True)
    p.add_argument(
        "--speculative-rule",
        choices=tuple(SPECULATIVE_RULES),
        default="vllm",
        help="with --speculative-tokens: whose rule shares a step between drafts and prompt chunks, and so "
        "whose launch line is printed (default %(default)s)",
    )
    p.add_argument(
        "--step-budgets-ms",
        metavar="auto|MS1,MS2,...",
        help="also try chunked with chunks sized by time (--step-budget-ms): these step-time targets; "
        "auto: 0.5, 0.75 and 1 x the P99 TBT SLO (default: none)",
    )


def _add_fleet_args(p: argparse.ArgumentParser) -> None:
    """The "fleet" group: the replicas per router at a traffic rate (``--router``)."""
    from stallfree.core.router import ROUTER_NAMES  # light

    f = p.add_argument_group(
        "fleet",
        "with --router: the fewest replicas meeting the SLOs at --qps (each chunked at one of --budgets), "
        "per router, with the launch lines of vLLM or SGLang replicas behind vllm-router or sglang-router",
    )
    f.add_argument("--router", metavar="R1,R2,...", help=f"routers to compare: {', '.join(ROUTER_NAMES)}")
    f.add_argument(
        "--qps",
        type=positive_float,
        help="the fleet's traffic rate (default with --arrival trace: the trace's own rate)",
    )
    f.add_argument(
        "--max-replicas", type=positive_int, default=256, help="give up past this many (default %(default)s)"
    )
    f.add_argument(
        "--kv-host-gb",
        metavar="GB1,GB2,...",
        help="also search a host KV tier of each size a replica (0: none), e.g. 0,256,1024: is host memory "
        "worth it at this traffic? (vLLM's --kv-offloading-size, SGLang's HiCache in the launch lines)",
    )
    f.add_argument(
        "--kv-host-link",
        default=DEFAULT_HOST_LINK,
        metavar="LINK",
        help="with --kv-host-gb: the host tier's link, pcie4, pcie5 or GB/s a GPU (default %(default)s)",
    )
    f.add_argument(
        "--kv-shared-gb",
        metavar="GB1,GB2,...",
        help="also search a KV store the fleet shares, of each size (0: none), e.g. 0,8192 (LMCache's remote "
        "store under vLLM, a Mooncake store under SGLang's HiCache in the launch lines)",
    )
    f.add_argument(
        "--kv-shared-link",
        default=DEFAULT_SHARED_LINK,
        metavar="LINK",
        help="with --kv-shared-gb: each GPU's link to the store, ib-200, ib-400 or GB/s (default %(default)s)",
    )
    for name, what in (
        ("gpu", "a GPU"),
        ("host-gb", "a GB of host memory for --kv-host-gb's tier"),
        ("store-gb", "a GB of --kv-shared-gb's store"),
    ):
        f.add_argument(
            f"--{name}-hour-cost",
            type=non_negative_float,
            metavar="USD",
            help=f"dollars an hour for {what}; with any of the three the cheapest fleet wins, not the fewest replicas",
        )
    f.add_argument(
        "--route-delay-ms",
        type=non_negative_float,
        default=0.0,
        help="time from the router's choice to the replica's queue, counted in TTFT (default 0)",
    )


def _add_day_args(p: argparse.ArgumentParser) -> None:
    """The "a day" group: autoscaling rules tried through a day of traffic."""
    d = p.add_argument_group(
        "a day (--rate-profile): the autoscaling rule and bounds that keep the SLOs at the fewest GPU-hours"
    )
    d.add_argument(
        "--rate-profile",
        metavar="CSV|diurnal:PEAK,TROUGH[,HOURS]",
        help="the day's traffic, as `simulate --rate-profile`; each candidate runs the whole day "
        "(--num-requests: one period's unless given)",
    )
    d.add_argument(
        "--autoscale",
        metavar="RULE,...",
        help="rules to try, as simulate --autoscale's, e.g. keda:waiting=4,keda:kv=0.7,dynamo-load:latency,"
        "dynamo-load:up=80,down=30 (a part that names no rule continues the one before)",
    )
    d.add_argument("--min-replicas", metavar="N,...", default="1", help="floors to try (default 1)")
    d.add_argument(
        "--startup-s", type=non_negative_float, default=120.0, help="a replica's start-up (default 120)"
    )
    d.add_argument(
        "--scrape-s", type=positive_float, default=15.0, help="the autoscaler's period (default 15)"
    )


def _add_mode_args(p: argparse.ArgumentParser) -> None:
    """The "modes" group: the layouts of ``--gpus`` GPUs, aggregated and disaggregated."""
    m = p.add_argument_group(
        "modes",
        "with --gpus: every layout of that many GPUs, aggregated replicas and prefill/decode pools "
        "(--mode), ranked by goodput per GPU (the highest QPS meeting every SLO, over the GPUs)",
    )
    m.add_argument("--gpus", type=positive_int, help="GPUs to lay out")
    m.add_argument(
        "--mode", default="agg,disagg", metavar="agg,disagg", help="layouts to try (default %(default)s)"
    )
    m.add_argument(
        "--tp-sizes",
        metavar="K1,K2,...",
        help="GPUs a replica may have, in either pool (default: --tp)",
    )
    add_kv_link_arg(m.add_argument, "between the pools")


def _add_classes_args(p: argparse.ArgumentParser) -> None:
    """The "classes" group: a traffic mix whose classes each keep their own SLOs."""
    c = p.add_argument_group(
        "classes (the mix's capacity: the highest total rate, its classes' rates scaled together, at "
        "which every class keeps its own SLOs; per scheduling policy and budget)"
    )
    add_classes_arg(c)
    c.add_argument(
        "--class-slo",
        nargs="+",
        metavar="CLASS:NAME=LIMIT",
        help="a class's SLO, NAME one of the --slo-* names (chat:tpot-p99-ms=50 batch:e2el-p99-s=600)",
    )
    c.add_argument(
        "--scheduling-policies",
        default="fcfs,priority",
        metavar="P1,P2",
        help="scheduling policies to compare (default %(default)s)",
    )


def _add_search_args(p: argparse.ArgumentParser) -> None:
    """Each capacity search's limits: the running sequences, the SLOs, the precision, the first QPS."""
    from stallfree.tune.slo import (  # light
        SLO_FLAGS,
        STRICT_TBT_BATCH,
        STRICT_TBT_CONTEXT,
        STRICT_TBT_MULTIPLE,
    )

    p.add_argument(
        "--max-num-seqs",
        type=positive_int,
        default=256,
        help="running sequences at most, fewer under a smaller chunked budget (default %(default)s)",
    )
    for name, flag in SLO_FLAGS.items():
        default = 2.0 if name == "sched_delay_p50_s" else None
        extra = {
            "tbt_p99_ms": f" (default: strict, {STRICT_TBT_MULTIPLE} x the cost model's decode step of "
            f"{STRICT_TBT_BATCH} sequences at {STRICT_TBT_CONTEXT} tokens of context, as Sarathi-Serve)",
            "sched_delay_p50_s": " (default 2, as Sarathi-Serve)",
        }.get(name, "")
        p.add_argument(
            f"--slo-{name.replace('_', '-')}",
            dest=f"slo_{name}",
            type=positive_float,
            default=default,
            metavar=flag.unit.upper(),
            help=f"SLO on {flag.label} ({flag.metric}){extra}",
        )
    p.add_argument(
        "--precision",
        type=positive_float,
        default=0.05,
        help="relative precision of each capacity (default %(default)s: within 5%%)",
    )
    p.add_argument(
        "--qps-start",
        type=positive_float,
        default=None,
        help="QPS of each search's first trial (default: half the cost model's throughput at the budget)",
    )


def run_tune(args: argparse.Namespace) -> int:
    from stallfree.sim.deployment import Deployment
    from stallfree.tune.advise import TuneRequest, advise, plan_tune
    from stallfree.tune.slo import SLO_FLAGS
    from stallfree.tune.trial import DEFAULT_SERVING, TrialSpec

    costs, cost_model_note = _tune_costs(args)
    drafts, speculation = _speculation(args)
    serving = replace(
        DEFAULT_SERVING,
        num_blocks=args.num_blocks,
        enable_prefix_caching=args.enable_prefix_caching,
        speculative_rule=args.speculative_rule,
    )
    base = TrialSpec(
        deployment=Deployment(
            costs=costs, serving=serving, gpu_memory_utilization=args.gpu_memory_utilization
        ),
        lengths=args.lengths,
        arrival=args.arrival,
        burstiness=args.burstiness,
        num_requests=args.num_requests,
        seed=args.seed,
    )
    if args.classes:
        return _run_classes_tune(args, base.deployment)
    if args.class_slo:
        raise UsageError("--class-slo applies with --classes")
    if args.rate_profile is not None:
        return _run_day_tune(args, base.deployment)
    if args.autoscale is not None:
        raise UsageError("--autoscale tunes a day of traffic: give --rate-profile")
    if args.gpus is not None:
        return _run_mode_tune(args, base, cost_model_note)
    for flag, value in (("--tp-sizes", args.tp_sizes), ("--kv-link", args.kv_link != DEFAULT_KV_LINK)):
        if value:
            raise UsageError(f"{flag} applies with --gpus N")
    if args.router is not None:
        return _run_fleet_tune(args, base, cost_model_note)
    for flag, given in (
        ("--kv-host-gb", args.kv_host_gb is not None),
        ("--kv-host-link", args.kv_host_link != DEFAULT_HOST_LINK),
        ("--kv-shared-gb", args.kv_shared_gb is not None),
        ("--kv-shared-link", args.kv_shared_link != DEFAULT_SHARED_LINK),
        ("--gpu-hour-cost", args.gpu_hour_cost is not None),
        ("--host-gb-hour-cost", args.host_gb_hour_cost is not None),
        ("--store-gb-hour-cost", args.store_gb_hour_cost is not None),
    ):
        if given:
            raise UsageError(f"{flag} goes with a fleet tune: give --router too")
    if args.qps is not None or args.arrival == "trace":
        raise UsageError("--qps and --arrival trace size a fleet: give --router too")
    if args.precision >= 1:
        raise UsageError(f"--precision must be below 1, got {args.precision}")
    if args.plot:
        make_dir(args.plot, "--plot")
    plan = plan_tune(
        TuneRequest(
            base=base,
            policies=tuple(p.strip() for p in args.policy.split(",") if p.strip()),
            budgets=None if args.budgets == "auto" else tuple(_int_list(args.budgets)),
            slos={
                name: getattr(args, f"slo_{name}")
                for name in SLO_FLAGS
                if getattr(args, f"slo_{name}") is not None
            },
            max_num_seqs=args.max_num_seqs,
            precision=args.precision,
            qps_start=args.qps_start,
            step_budgets_ms=_step_budgets(args.step_budgets_ms),
            cost_model_note=cost_model_note,
            speculative_tokens=drafts,
            speculation=speculation,
        )
    )
    with trial_pool(args) as pool:
        out, interrupted = advise(plan, pool, progress=show_progress(args))
        out["backend"] = {"name": args.backend, "workers": pool.workers}
    return _report_tune(args, out, interrupted)


def _report_tune(args: argparse.Namespace, out: dict[str, Any], interrupted: TuneInterrupted | None) -> int:
    """The budget search's result: its figures, the best deployment's file, the table or JSON on
    stdout, a note on stderr after an interruption; the exit code (130, or 1 when nothing met)."""
    if args.plot and interrupted is None:
        from stallfree.plots.tune import plot_tune

        out["figures"] = [str(path) for path in plot_tune(out, args.plot)]
    _write_best(args, out.get("deployment"))
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        from stallfree.tune.report import format_tune

        print(format_tune(out))
    if interrupted is not None:
        sys.stdout.flush()
        print(
            f"stallfree tune: interrupted; the partial result ({out['interrupted']['searches_finished']} of "
            f"{interrupted.num_searches} searches finished, the {len(out['trials'])} trials run, the "
            f"others' bounds so far) is on stdout{' (JSON, partial: true)' if args.json else ''}",
            file=sys.stderr,
        )
        return 130
    met = any(entry["best_budget"] is not None for entry in out["policies"].values())
    return 0 if met else 1


def _run_fleet_tune(args: argparse.Namespace, base: TrialSpec, cost_model_note: str | None) -> int:
    """``tune --router ...``: the fewest replicas per router and budget at the fleet's rate."""
    from stallfree.core.router import ROUTER_NAMES
    from stallfree.tune.advise import TuneRequest, plan_tune
    from stallfree.tune.fleet import FleetTuneConfig, tune_fleet
    from stallfree.tune.report import format_fleet
    from stallfree.tune.slo import SLO_FLAGS
    from stallfree.tune.trial import trace_qps

    for flag, value in (
        ("--step-budgets-ms", args.step_budgets_ms),
        ("--plot", args.plot),
        ("--speculative-tokens", args.speculative_tokens),
    ):
        if value:
            raise UsageError(f"{flag} applies to a one-replica tune, not with --router")
    routers = tuple(r.strip() for r in args.router.split(",") if r.strip())
    unknown = [r for r in routers if r not in ROUTER_NAMES]
    if unknown or not routers:
        raise UsageError(
            f"--router: unknown {', '.join(unknown) or 'nothing'}; choose from {', '.join(ROUTER_NAMES)}"
        )
    qps = args.qps
    if qps is None:
        if args.arrival != "trace":
            raise UsageError(
                "a fleet is sized for a traffic rate: give --qps (or --arrival trace for the trace's own)"
            )
        qps = trace_qps(args.lengths, args.num_requests)
    base = replace(base, qps=qps).with_deployment(route_delay_ms=args.route_delay_ms)
    # the SLOs and budgets as a one-replica tune resolves them (the strict TBT SLO, the ridge's budgets)
    plan = plan_tune(
        TuneRequest(
            base=base,
            policies=("chunked",),
            budgets=None if args.budgets == "auto" else tuple(_int_list(args.budgets)),
            slos={
                name: getattr(args, f"slo_{name}")
                for name in SLO_FLAGS
                if getattr(args, f"slo_{name}") is not None
            },
            max_num_seqs=args.max_num_seqs,
        )
    )
    config = FleetTuneConfig(
        base=base,
        routers=routers,
        budgets=plan.config.budgets,
        slos=plan.config.slos,
        max_num_seqs=args.max_num_seqs,
        max_replicas=args.max_replicas,
        kv_host_gbs=_gb_sizes(args.kv_host_gb, "--kv-host-gb"),
        kv_host_link=args.kv_host_link,
        kv_shared_gbs=_gb_sizes(args.kv_shared_gb, "--kv-shared-gb"),
        kv_shared_link=args.kv_shared_link,
        prices=_prices(args),
    )
    with trial_pool(args) as pool:
        out, interrupted = tune_fleet(config, pool, progress=show_progress(args))
        out["backend"] = {"name": args.backend, "workers": pool.workers}
    out["slo_notes"] = dict(plan.slo_notes)
    out["cost_model_note"] = cost_model_note
    _write_best(args, (out["best"] or {}).get("deployment"))
    print(json.dumps(out, indent=2) if args.json else format_fleet(out))
    if interrupted:
        print("stallfree tune: interrupted; the searches that finished are on stdout", file=sys.stderr)
        return 130
    return 0 if out["best"] is not None else 1


def _run_mode_tune(args: argparse.Namespace, base: TrialSpec, cost_model_note: str | None) -> int:
    """``tune --gpus N --mode agg,disagg``: every layout of N GPUs ranked by goodput per GPU."""
    from stallfree.core.router import ROUTER_NAMES
    from stallfree.tune.advise import TuneRequest, plan_tune
    from stallfree.tune.modes import ModeTuneConfig, tune_modes
    from stallfree.tune.report import format_modes
    from stallfree.tune.slo import SLO_FLAGS

    for flag, value in (
        ("--step-budgets-ms", args.step_budgets_ms),
        ("--plot", args.plot),
        ("--speculative-tokens", args.speculative_tokens),
        ("--qps", args.qps),
        ("--route-delay-ms", args.route_delay_ms),
        ("--policy", args.policy not in ("chunked,prefill-first", "chunked")),
    ):
        if value:
            raise UsageError(
                f"{flag} does not apply with --gpus (each layout's capacity is searched, every replica chunked)"
            )
    router = args.router or "round-robin"
    if router not in ROUTER_NAMES:
        raise UsageError(f"--router: with --gpus give one of {', '.join(ROUTER_NAMES)}")
    plan = plan_tune(
        TuneRequest(
            base=base,
            policies=("chunked",),
            budgets=None if args.budgets == "auto" else tuple(_int_list(args.budgets)),
            slos={
                name: getattr(args, f"slo_{name}")
                for name in SLO_FLAGS
                if getattr(args, f"slo_{name}") is not None
            },
            max_num_seqs=args.max_num_seqs,
        )
    )
    try:
        config = ModeTuneConfig(
            base=base.with_deployment(router=router),
            gpus=args.gpus,
            modes=tuple(m.strip() for m in args.mode.split(",") if m.strip()),
            tp_sizes=tuple(_int_list(args.tp_sizes)) if args.tp_sizes else (args.tp,),
            budgets=plan.config.budgets,
            ridge_tokens=plan.ridge_tokens,
            slos=plan.config.slos,
            kv_link=args.kv_link,
            max_num_seqs=args.max_num_seqs,
            precision=args.precision,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    with trial_pool(args) as pool:
        out, interrupted = tune_modes(config, pool, progress=show_progress(args))
        out["backend"] = {"name": args.backend, "workers": pool.workers}
    out["slo_notes"] = dict(plan.slo_notes)
    out["cost_model_note"] = cost_model_note
    _write_best(args, (out["best"] or {}).get("deployment"))
    print(json.dumps(out, indent=2) if args.json else format_modes(out))
    if interrupted:
        print("stallfree tune: interrupted; the searches that finished are on stdout", file=sys.stderr)
        return 130
    return 0 if out["best"] is not None else 1


def _tune_costs(args: argparse.Namespace) -> tuple[CostChoice, str | None]:
    """The trials' cost-model choice (names and paths only, so trials pickle) and why auto
    picked its kind (None when named)."""

    note = resolve_cost_model(args)
    measured_profile(args, gpu_tables=True)  # --profile implies measured
    choice = cost_choice(args, dtype_bytes=dtype_bytes_arg(args))
    if choice.profile is not None and args.model == DEFAULT_MODEL:  # the profiled model unless one is named
        choice = replace(choice, model=replace(choice, model=None).model_name)
    return choice, note


def _step_budgets(text: str | None) -> tuple[float, ...] | str:
    """``--step-budgets-ms``: none, auto (fractions of the P99 TBT SLO) or a comma list."""
    if not text:
        return ()
    if text == "auto":
        return "auto"
    try:
        values = tuple(positive_float(part) for part in text.split(",") if part.strip())
    except argparse.ArgumentTypeError as error:
        raise UsageError(f"--step-budgets-ms: {error}") from None
    if not values or len(set(values)) != len(values):
        raise UsageError("--step-budgets-ms: give auto or distinct step-time targets in ms")
    return values


def _run_day_tune(args: argparse.Namespace, base: Deployment) -> int:
    """``tune --rate-profile P --autoscale R1,R2 --min-replicas A,B``: every rule and floor through
    the day, the fixed fleet for the peak beside them, the best as KEDA's ScaledObject (or Dynamo
    Planner's config)."""
    from stallfree.core import DEFAULT_TOKEN_BUDGET
    from stallfree.tune.day import DayTuneConfig, check_rules, format_day_tune, split_rules, tune_day
    from stallfree.tune.slo import SLO_FLAGS, Slos
    from stallfree.workload import WorkloadOptions, workload_from_options

    rules = split_rules(args.autoscale or "")
    routers = [r.strip() for r in (args.router or "least-requests").split(",") if r.strip()]
    if len(routers) != 1:
        raise UsageError("--rate-profile tunes one fleet: give one --router")
    budgets = tuple(_int_list(args.budgets)) if args.budgets != "auto" else (DEFAULT_TOKEN_BUDGET,)
    limits = {n: getattr(args, f"slo_{n}") for n in SLO_FLAGS if getattr(args, f"slo_{n}") is not None}
    try:
        check_rules(rules)
        floors = tuple(int(f) for f in args.min_replicas.split(",") if f.strip())
        workload = workload_from_options(
            WorkloadOptions(rate_profile=args.rate_profile, lengths=args.lengths)
        )
        serving = replace(base.serving, max_num_batched_tokens=budgets[0])
        config = DayTuneConfig(
            base=replace(base, serving=serving, router=routers[0]),
            workload=workload,
            num_requests=None if args.num_requests == 2000 else args.num_requests,
            seed=args.seed,
            slos=Slos.from_mapping(limits),
            rules=rules,
            floors=floors,
            max_replicas=16 if args.max_replicas == 256 else args.max_replicas,
            startup_s=args.startup_s,
            scrape_s=args.scrape_s,
        )
        config.candidates()  # each candidate's bounds hold
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    out = tune_day(config, workers=args.workers or os.cpu_count() or 1)
    _write_best(args, None if out["best"] is None else out["best"]["deployment"])
    print(json.dumps(out, indent=2) if args.json else format_day_tune(out))
    return 0 if out["best"] is not None else 1


def _run_classes_tune(args: argparse.Namespace, base: Deployment) -> int:
    """``tune --classes ... --class-slo ...``: each (scheduling policy, budget)'s capacity for the mix."""
    from stallfree.core import DEFAULT_TOKEN_BUDGET
    from stallfree.tune.classes import ClassesTuneConfig, format_classes_tune, parse_class_slo, tune_classes
    from stallfree.tune.slo import Slo, Slos

    classes = classes_workload(args)
    assert classes is not None  # given
    budgets = tuple(_int_list(args.budgets)) if args.budgets != "auto" else (DEFAULT_TOKEN_BUDGET,)
    try:
        by_class: dict[str, list[Slo]] = {}
        for text in args.class_slo or ():
            name, slo = parse_class_slo(text)
            by_class.setdefault(name, []).append(slo)
        config = ClassesTuneConfig(
            classes=classes,
            base=base,
            slos={name: Slos(tuple(slos)) for name, slos in by_class.items()},
            scheduling_policies=tuple(p.strip() for p in args.scheduling_policies.split(",") if p.strip()),
            budgets=budgets,
            num_requests=args.num_requests,
            seed=args.seed,
            precision=args.precision,
        )
        for policy in config.scheduling_policies:
            replace(base.serving, scheduling_policy=policy)  # an unknown one fails here
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    out = tune_classes(config)
    print(json.dumps(out, indent=2) if args.json else format_classes_tune(out))
    return 0 if out["best"] is not None else 1


def _write_best(args: argparse.Namespace, deployment: dict[str, Any] | None) -> None:
    """``--deployment-out``: the best deployment as YAML (``simulate --deployment`` runs it)."""
    if args.deployment_out is None:
        return
    if deployment is None:
        print("stallfree tune: nothing met the SLOs: no deployment written", file=sys.stderr)
        return
    from stallfree.sim.deployment import Deployment

    write_deployment(Deployment.from_dict(deployment), args.deployment_out)


def _prices(args: argparse.Namespace) -> FleetPrices | None:
    """The fleet's prices where any is given (the others 0)."""
    from stallfree.tune.fleet import FleetPrices

    given = (args.gpu_hour_cost, args.host_gb_hour_cost, args.store_gb_hour_cost)
    if all(price is None for price in given):
        return None
    return FleetPrices(*(price or 0.0 for price in given))


def _gb_sizes(text: str | None, flag: str) -> tuple[float, ...]:
    """``--kv-host-gb``'s or ``--kv-shared-gb``'s sizes (none given: no such tier)."""
    if text is None:
        return (0.0,)
    try:
        return tuple(float(gb) for gb in text.split(",") if gb.strip())
    except ValueError:
        raise UsageError(f"{flag} takes GB sizes such as 0,256,1024, got {text!r}") from None


def _int_list(text: str) -> list[int]:
    try:
        values = int_list(text)
    except argparse.ArgumentTypeError as error:
        raise UsageError(f"--budgets: {error}") from None
    if not values:
        raise UsageError("--budgets: give auto or a comma-separated list of token counts")
    return values


def _speculation(args: argparse.Namespace) -> tuple[tuple[int, ...], Speculation | None]:
    """``--speculative-tokens``, ``--acceptance-rate`` and ``--draft``: the draft lengths to try
    and how their drafts fare (none: no drafts)."""
    from stallfree.sim.deployment import Speculation
    from stallfree.sim.speculative import Acceptance

    if args.speculative_tokens is None:
        for flag, given in (
            ("--acceptance-rate", args.acceptance_rate is not None),
            ("--draft", args.draft != "ngram"),
        ):
            if given:
                raise UsageError(f"{flag} applies with --speculative-tokens K1,K2,...")
        return (), None
    try:
        drafts = tuple(non_negative_int(part) for part in args.speculative_tokens.split(",") if part.strip())
    except argparse.ArgumentTypeError as error:
        raise UsageError(f"--speculative-tokens: {error}") from None
    if not drafts:
        raise UsageError("--speculative-tokens: give a comma-separated list of draft lengths, e.g. 0,2,4")
    if len(set(drafts)) != len(drafts):
        raise UsageError(f"--speculative-tokens: a draft length listed twice in {args.speculative_tokens!r}")
    if args.acceptance_rate is None:
        raise UsageError(
            "--speculative-tokens needs --acceptance-rate: the share of draft tokens accepted (a server's "
            "spec-decode metrics say it)"
        )
    try:
        acceptance = Acceptance.parse(args.acceptance_rate, max(max(drafts), 1))
    except ValueError as exc:
        raise UsageError(f"--acceptance-rate: {exc}") from None
    try:
        return drafts, Speculation(acceptance, args.draft)
    except ValueError as exc:
        raise UsageError(f"--draft: {exc}") from None
