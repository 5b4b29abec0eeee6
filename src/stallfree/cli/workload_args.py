"""Workload flags: ``simulate``'s traffic, and the multi-turn sessions it shares with ``bench``."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from stallfree.cli.common import UsageError, positive_int
from stallfree.workload.traces import TRACE_NAMES

if TYPE_CHECKING:
    from stallfree.workload import Workload

DEFAULT_QPS = 2.0
DEFAULT_LENGTHS = "arxiv"
DEFAULT_NUM_REQUESTS = 1000


def add_traffic_args(g: argparse._ActionsContainer) -> None:
    """``simulate``'s workload: arrivals, lengths, a trace or a bench result to replay, sessions."""
    g.add_argument(
        "--workload",
        choices=("poisson", "gamma", "all-at-once", "trace", "rate-profile"),
        help="arrival process (default: trace if --trace, rate-profile if --rate-profile, else poisson)",
    )
    g.add_argument(
        "--qps", type=float, help=f"requests per second for poisson/gamma (default {DEFAULT_QPS:g})"
    )
    g.add_argument("--burstiness", type=float, help="gamma shape: 1 Poisson, < 1 burstier")
    g.add_argument(
        "--lengths",
        help="prompt and output lengths: fixed:P,O, uniform:PMIN-PMAX,OMIN-OMAX, lognormal:PMEDIAN,OMEDIAN[,SIGMA], "
        f"a shipped trace ({', '.join(TRACE_NAMES)}) or a trace file (default {DEFAULT_LENGTHS} unless --trace)",
    )
    g.add_argument("--trace", help="replay this trace's arrival times (and its lengths unless --lengths)")
    g.add_argument(
        "--lengths-sampling",
        choices=("in-order", "with-replacement"),
        help="how a trace's rows are drawn for --lengths (default: in order for traces with prefix hashes "
        "such as Mooncake's, else with replacement); with replacement, a drawn row keeps its hashes",
    )
    g.add_argument(
        "--rate-profile",
        metavar="CSV|diurnal:PEAK,TROUGH[,HOURS]",
        help="Poisson arrivals at a rate that changes: a CSV of time_s,qps rows (linear between, repeating "
        "after the last), or a cosine day from TROUGH to PEAK requests/s (default period 24 h); "
        "--num-requests defaults to one period's",
    )
    g.add_argument(
        "--replay",
        metavar="RESULT.json",
        help="re-create the exact requests (arrivals, lengths) of a `stallfree bench --save-result` file",
    )
    g.add_argument(
        "--num-requests",
        type=int,
        help=f"requests to simulate (default {DEFAULT_NUM_REQUESTS:,}; a replayed trace: all its rows)",
    )
    g.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    add_session_args(g)


def traffic_workload(args: argparse.Namespace) -> tuple[Workload, int | None]:
    """:func:`add_traffic_args`' flags as a workload and how many requests to draw (None: every
    row of a trace read in order)."""
    from stallfree.workload import WorkloadOptions, workload_from_options

    arrival = args.workload or ("trace" if args.trace else "rate-profile" if args.rate_profile else "poisson")
    qps = DEFAULT_QPS if args.qps is None and arrival in ("poisson", "gamma") else args.qps
    lengths = DEFAULT_LENGTHS if args.lengths is None and args.trace is None else args.lengths
    sessions = args.sessions is not None or args.turns is not None
    num_requests = session_requests(args) if sessions else args.num_requests
    options = WorkloadOptions(
        arrival=arrival,
        qps=qps,
        burstiness=args.burstiness,
        trace=args.trace,
        lengths=lengths,
        rate_profile=args.rate_profile,
        sampling=args.lengths_sampling,
        **session_options(args),
    )
    workload = workload_from_options(options)
    if num_requests is not None and num_requests <= 0:
        raise UsageError(f"--num-requests must be positive, got {num_requests}")
    if num_requests is None and workload.max_num_requests() is None and args.rate_profile is None:
        num_requests = DEFAULT_NUM_REQUESTS
    return workload, num_requests


def add_session_args(group: argparse._ActionsContainer) -> None:
    group.add_argument(
        "--sessions", type=positive_int, help="multi-turn: chat sessions (requests = sessions x turns)"
    )
    group.add_argument(
        "--turns", type=positive_int, help="multi-turn: turns a session (default 4 with --sessions)"
    )
    group.add_argument(
        "--system-prompt-tokens",
        type=int,
        default=0,
        help="multi-turn: a system prompt every session starts with (default 0)",
    )
    group.add_argument(
        "--think-time-s",
        type=float,
        default=0.0,
        help="multi-turn: seconds between a turn's answer and the next turn (default 0)",
    )


DEFAULT_TURNS = 4


def session_requests(args: argparse.Namespace) -> int:
    """How many requests ``--sessions`` x ``--turns`` make (``--num-requests`` may not be given)."""
    if args.sessions is None:
        raise UsageError("multi-turn sessions need --sessions N")
    if args.num_requests is not None:
        raise UsageError("with --sessions, the requests are sessions x turns: drop --num-requests")
    if args.turns is None:
        args.turns = DEFAULT_TURNS
    return int(args.sessions * args.turns)


def session_options(args: argparse.Namespace) -> dict[str, Any]:
    """The :class:`~stallfree.workload.WorkloadOptions` fields of the session flags."""
    if args.system_prompt_tokens < 0 or not args.think_time_s >= 0:
        raise UsageError("--system-prompt-tokens and --think-time-s must be >= 0")
    return {
        "turns": args.turns,
        "system_prompt_tokens": args.system_prompt_tokens,
        "think_time_s": args.think_time_s,
    }
