"""Workload flags that ``simulate`` and ``bench`` share: multi-turn sessions."""

from __future__ import annotations

import argparse
from typing import Any

from stallfree.cli.common import UsageError, positive_int


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
