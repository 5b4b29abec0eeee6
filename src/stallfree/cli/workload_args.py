"""Workload flags: ``simulate``'s traffic, and the multi-turn chat sessions and agent sessions it
shares with ``bench``."""

from __future__ import annotations

import argparse
import re
from typing import TYPE_CHECKING, Any

from stallfree.cli.common import UsageError, positive_int
from stallfree.workload.traces import TRACE_NAMES

if TYPE_CHECKING:
    from stallfree.workload import Arrivals, Lengths, Workload
    from stallfree.workload.agents import AgentTurns

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
    add_agent_args(g)


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


def add_agent_args(group: argparse._ActionsContainer, *, trace_format: bool = True) -> None:
    """Agent sessions (``simulate`` and ``bench``): synthetic coding agents, or ``--trace`` read as
    agent sessions (``--trace-format``). Sessions start at ``--qps`` (else all at once) and
    ``--lengths`` is each turn's tool output and answer."""
    from stallfree.workload.agents import Agents

    defaults = Agents(1)
    group.add_argument(
        "--agents",
        type=positive_int,
        help="agents: coding agents (sessions) that resend their context each turn",
    )
    group.add_argument(
        "--agent-turns", type=positive_int, help=f"agents: turns each agent takes (default {defaults.turns})"
    )
    group.add_argument(
        "--agent-prefix-tokens",
        type=int,
        help="agents: system prompt + tool schemas, the same for every agent "
        f"(default {defaults.shared_prefix_tokens:,})",
    )
    group.add_argument(
        "--tool-wait-s",
        type=float,
        help=f"agents: mean seconds a tool runs between an answer and the next turn, exponential "
        f"(default {defaults.tool_wait_s:g}; 0: none)",
    )
    group.add_argument(
        "--subagent-probability",
        type=float,
        help="agents: chance that a turn fans out sub-agents, the agent's next turn waiting for them "
        f"(default {defaults.subagent_probability:g})",
    )
    group.add_argument(
        "--subagents",
        type=positive_int,
        help=f"agents: sub-agents a fan-out starts (default {defaults.subagent_width})",
    )
    group.add_argument(
        "--subagent-turns",
        type=positive_int,
        help=f"agents: turns each sub-agent takes (default {defaults.subagent_turns})",
    )
    if trace_format:
        group.add_argument(
            "--trace-format",
            choices=("mooncake", "agentic_mooncake"),
            help="read --trace as agent sessions: Mooncake rows with session_id and delay, or Dynamo's "
            "agentic_mooncake rows (request_id, wait_for, tool_wait_ms); turns wait for earlier turns to finish",
        )


_AGENT_SHAPE = (
    "agent_turns",
    "agent_prefix_tokens",
    "tool_wait_s",
    "subagent_probability",
    "subagents",
    "subagent_turns",
)


_AGENT_FIELDS = (
    "turns",
    "shared_prefix_tokens",
    "tool_wait_s",
    "subagent_probability",
    "subagent_width",
    "subagent_turns",
)


def agent_workload(args: argparse.Namespace) -> AgentTurns | None:
    """:func:`add_agent_args`' flags as agent turns (None: no ``--agents`` nor ``--trace-format``)."""
    shape = [f"--{name.replace('_', '-')}" for name in _AGENT_SHAPE if getattr(args, name, None) is not None]
    trace_format = getattr(args, "trace_format", None)
    if args.agents is None and trace_format is None:
        if shape:
            raise UsageError(f"{shape[0]} applies to agent sessions (--agents N)")
        return None
    for flag in ("sessions", "turns", "num_requests", "rate_profile", "replay", "autoscale", "disaggregate"):
        if getattr(args, flag, None) not in (None, False):
            raise UsageError(f"agent sessions are their own workload: not with --{flag.replace('_', '-')}")
    if trace_format is not None:
        return _agent_trace(args, trace_format, shape)
    if args.trace is not None:
        raise UsageError("--agents draws synthetic agents: to replay a trace's sessions give --trace-format")
    from stallfree.workload.agents import DEFAULT_AGENT_LENGTHS, Agents, agent_turns

    given = {
        field: getattr(args, flag)
        for flag, field in zip(_AGENT_SHAPE, _AGENT_FIELDS, strict=True)
        if getattr(args, flag) is not None
    }
    lengths, starts = _agent_lengths(args) or DEFAULT_AGENT_LENGTHS, _agent_starts(args)
    try:
        agents = Agents(args.agents, lengths=lengths, arrivals=starts, **given)
    except ValueError as exc:  # said with the flag's name, not the field's
        text = str(exc)
        for flag, name in zip(_AGENT_SHAPE, _AGENT_FIELDS, strict=True):
            text = re.sub(rf"\b{name} must", f"--{flag.replace('_', '-')} must", text)
        raise UsageError(text) from None
    return agent_turns(agents, args.seed or 0)


def _agent_trace(args: argparse.Namespace, trace_format: str, shape: list[str]) -> AgentTurns:
    from stallfree.workload.agent_traces import load_agent_trace

    if args.trace is None:
        raise UsageError("--trace-format reads --trace FILE as agent sessions: give --trace")
    for flag, value in (("--agents", args.agents), ("--lengths", args.lengths), ("--qps", args.qps)):
        if value is not None:
            raise UsageError(
                f"a trace's agent sessions come with their own starts and lengths: not with {flag}"
            )
    if shape:
        raise UsageError(f"{shape[0]} shapes synthetic agents (--agents N), not a trace's")
    return load_agent_trace(args.trace, trace_format)


def _agent_lengths(args: argparse.Namespace) -> Lengths | None:
    from stallfree.workload import parse_lengths

    return None if args.lengths is None else parse_lengths(args.lengths)


def _agent_starts(args: argparse.Namespace) -> Arrivals:
    """Agents start as Poisson at ``--qps`` (gamma with ``--burstiness``), else all at once."""
    from stallfree.workload import AllAtOnce, gamma, poisson

    arrival = getattr(args, "workload", None) or getattr(args, "scenario", None)
    if arrival not in (None, "poisson", "gamma", "all-at-once", "agents"):
        raise UsageError(f"agents start at --qps (poisson or gamma) or all at once, not as {arrival}")
    if args.qps is None:
        if args.burstiness is not None or arrival in ("poisson", "gamma"):
            raise UsageError("agents start all at once unless --qps says how many a second")
        return AllAtOnce()
    if not args.qps > 0:
        raise UsageError(f"--qps must be positive, got {args.qps}")
    return poisson(args.qps) if args.burstiness is None else gamma(args.qps, args.burstiness)


def workload_text(workload: Workload | AgentTurns | None, replay: str | None) -> str:
    """The header's workload line: a drawn workload, agent turns, or a replayed bench result."""
    from stallfree.sim.report import describe_workload
    from stallfree.workload.agents import AgentTurns

    if isinstance(workload, AgentTurns):
        return f"{workload.description}: {len(workload):,} turns in {workload.num_sessions:,} conversations"
    return describe_workload(workload) if workload is not None else f"replayed from {replay}"
