"""``stallfree validate``: one workload through the real engine and through the simulator, compared.

The same requests (arrival times, lengths), the same scheduler configuration (policy, token
budget, max sequences, KV blocks, block size, context length) run (1) through ``LLMEngine``
in process on the wall clock (:mod:`stallfree.validate.replay`) and (2) through the simulator
with the measured cost model of ``--profile``. Both are scored by :mod:`stallfree.metrics`.
Printed: measured vs predicted vs ratio for TTFT, TPOT, ITL (median, p99), max ITL and
throughput, and the per-step error: every real step's plan priced by the model against its
measured wall time. ``--measured RESULT.json`` takes a ``stallfree bench --save-result`` file
as the measured side instead (no engine run; with the server's ``--step-log`` of that run, the
per-step error of the served steps too). Where the per-step error is known, the simulation runs
again with each kind of step (decode-only, with prompt tokens) priced at the speed this run's
steps ran (``at run speed``): not a prediction, but the simulator's check with the machine's
drift taken out. ``--step-noise`` adds a prediction with each step varied as the profiled
machine's steps varied.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from stallfree.cli.common import (
    DTYPE_CHOICES,
    ENGINE_MODELS,
    UsageError,
    positive_int,
)
from stallfree.cli.serving_args import acceptance_arg, add_acceptance_arg, add_serving_args, serving_configs
from stallfree.cli.workload_args import add_session_args, session_options, session_requests
from stallfree.core.router import ROUTER_NAMES

if TYPE_CHECKING:
    from stallfree.sim.speculative import Acceptance
    from stallfree.validate import ValidationOptions

_DESCRIPTION = __doc__.split("\n\n", 1)[1] if __doc__ else ""

_EPILOG = """\
examples:
  stallfree profile --model random:medium --out medium.profile.json
  stallfree validate --profile medium.profile.json --qps 1 --lengths fixed:512,64 --num-requests 150 \\
      --policy chunked,prefill-first --token-budget 64 --plot out/validate
  stallfree validate --profile medium.profile.json --measured bench-result.json --token-budget 64
  stallfree validate --profile medium.profile.json --sessions 8 --turns 4 --system-prompt-tokens 512 \\
      --qps 0.2 --think-time-s 4 --lengths fixed:64,32 --token-budget 128
"""

# validate.options.SAMPLINGS, spelled out so that parsing imports nothing of the validation.
_SAMPLINGS = ("greedy", "temperature", "top-p")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "validate",
        help="the same workload through the real engine and the measured simulator: predicted vs measured",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--profile", required=True, help="step profile from `stallfree profile`")
    p.add_argument("--model", help=f"{ENGINE_MODELS} (default: the profiled model)")
    p.add_argument("--dtype", choices=DTYPE_CHOICES, help="engine dtype (default: the profile's)")
    p.add_argument("--device", help="cpu or cuda (default: the profile's)")
    p.add_argument(
        "--measured",
        metavar="RESULT.json",
        help="a `stallfree bench --save-result` file as the measured side",
    )
    p.add_argument(
        "--step-log",
        metavar="FILE",
        help="with --measured: the server's `serve --step-log` of that run, for the per-step error",
    )
    p.add_argument(
        "--replicas",
        type=positive_int,
        default=1,
        help="with --measured: the run went through a router in front of this many replicas, each as profiled",
    )
    p.add_argument(
        "--router",
        choices=ROUTER_NAMES,
        default="round-robin",
        help="with --replicas: the router's rule, as simulate --router (cache-aware: vllm-router's cache_aware)",
    )
    g = p.add_argument_group("scheduler (the same for both sides)")
    add_serving_args(g, policy_list=True)
    add_acceptance_arg(g)
    g.add_argument(
        "--sampling",
        choices=_SAMPLINGS,
        help="every request's sampler (temperature: T=1; top-p: T=1, p=0.9); default greedy, or "
        "with --measured the bench run's (its saved sampling parameters)",
    )
    g = p.add_argument_group("workload")
    g.add_argument("--qps", type=float, default=1.0, help="Poisson arrivals per second (default 1)")
    g.add_argument("--burstiness", type=float, help="gamma shape (1 = Poisson)")
    g.add_argument("--lengths", default="fixed:512,64", help="length distribution (default %(default)s)")
    g.add_argument("--num-requests", type=positive_int, help="requests (default 150)")
    g.add_argument("--seed", type=int, default=0, help="workload seed (default 0; --step-noise's too)")
    add_session_args(g)
    g = p.add_argument_group("output")
    g.add_argument(
        "--step-noise",
        action="store_true",
        help="also predict with each step's time varied as the profiled machine's steps varied "
        "(`stallfree profile`'s repeats and reference steps): the tails of a noisy host",
    )
    g.add_argument("--json", action="store_true", help="print one JSON object")
    g.add_argument("--plot", metavar="DIR", help="overlaid CDFs of TTFT and ITL, measured vs predicted")
    g.add_argument("--no-progress", action="store_true", help="no progress bar even on a terminal")
    p.set_defaults(handler=run)


def validation_options(args: argparse.Namespace) -> ValidationOptions:
    """The parsed flags as :class:`ValidationOptions` (one serving configuration per policy)."""
    from stallfree.validate import ValidationOptions

    sessions = args.sessions is not None or args.turns is not None
    num_requests = session_requests(args) if sessions else args.num_requests or 150
    return ValidationOptions(
        profile=args.profile,
        servings=tuple(serving_configs(args)),
        model=args.model,
        dtype=args.dtype,
        device=args.device,
        measured=args.measured,
        step_log=args.step_log,
        sampling=args.sampling,
        qps=args.qps,
        burstiness=args.burstiness,
        lengths=args.lengths,
        num_requests=num_requests,
        seed=args.seed,
        **session_options(args),
        step_noise=args.step_noise,
        progress=sys.stderr.isatty() and not args.no_progress,
        replicas=args.replicas,
        router=args.router,
        acceptance=_acceptance(args),
    )


def _acceptance(args: argparse.Namespace) -> Acceptance | None:
    """``--acceptance-rate`` (and ``--draft-rate``), or with ``--speculative-tokens`` and
    ``--measured`` and neither given: what the bench run's spec-decode counters say."""
    if not (args.num_speculative_tokens and args.measured and args.acceptance_rate is None):
        return acceptance_arg(args)
    from stallfree.sim.speculative import Acceptance

    try:
        result = json.loads(Path(args.measured).read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"--measured {args.measured}: {exc}") from None
    try:
        return Acceptance.from_bench_result(result)
    except ValueError as exc:
        raise UsageError(f"--measured {args.measured}: {exc}: give --acceptance-rate") from None


def run(args: argparse.Namespace) -> int:
    from stallfree.validate import format_report, validate

    result = validate(validation_options(args))
    outputs = None
    if args.plot:
        from stallfree.plots.validate import plot_validation

        outputs = [str(path) for path in plot_validation(result, args.plot)]
    if args.json:
        print(json.dumps(result.to_json(outputs), indent=2))
    else:
        print(format_report(result, outputs or ()))
    return 0
