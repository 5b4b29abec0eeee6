"""``--classes``: several traffic classes in one run (:mod:`stallfree.workload.classes`); and
``--shed-priority``: which of them a server refuses first when requests pile up."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from stallfree.cli.common import UsageError, non_negative_int

if TYPE_CHECKING:
    from stallfree.core.config import ShedRule
    from stallfree.workload.classes import TrafficClasses

DEFAULT_SHED_WAITING = 8

# Flags that describe one workload: --classes describes each class's instead.
_ONE_WORKLOAD_FLAGS = ("workload", "qps", "burstiness", "lengths", "trace", "rate_profile", "replay", "turns")


def add_classes_arg(group: argparse._ActionsContainer) -> None:
    group.add_argument(
        "--classes",
        nargs="+",
        metavar="NAME:KEY=VALUE,...",
        help="several kinds of traffic in one run, each NAME:lengths=L,qps=R[,burstiness=B][,priority=P]"
        "[,ttft=MS][,tpot=MS][,e2el=MS] (lengths as --lengths; priority an integer, lower first under "
        "--scheduling-policy priority; the SLOs judge the class's goodput), e.g. chat:lengths=sharegpt,qps=4 "
        "batch:lengths=arxiv,qps=1,priority=10; or NAME:trace=T[,lengths=L][,priority=P]...: a trace's own "
        "arrivals and (unless lengths=) its rows; a class of multi-turn sessions adds turns=N[,system=TOKENS]"
        "[,think=S] (its arrivals start sessions; simulate and tune); --num-requests is shared by rate; "
        "per-class metrics follow",
    )


def classes_workload(args: argparse.Namespace) -> TrafficClasses | None:
    """The parsed ``--classes`` (None without it); a :class:`UsageError` names what is wrong."""
    from stallfree.workload.classes import TrafficClasses, parse_class

    if not args.classes:
        return None
    defaults = getattr(args, "flag_defaults", {})  # a command's own defaults are not "given"
    given = [
        name
        for name in _ONE_WORKLOAD_FLAGS
        if getattr(args, name, None) is not None and getattr(args, name) != defaults.get(name)
    ]
    if given:
        flag = "--" + given[0].replace("_", "-")
        raise UsageError(
            f"{flag} describes one workload; with --classes give it per class (NAME:KEY=VALUE,...)"
        )
    try:
        return TrafficClasses(tuple(parse_class(text) for text in args.classes))
    except ValueError as exc:
        raise UsageError(f"--classes: {exc}") from None


def classes_text(classes: TrafficClasses) -> str:
    """The header's workload line for classes."""
    from stallfree.sim.report import describe_workload

    return "; ".join(
        f"{c.name} (priority {c.priority}): {describe_workload(c.workload)}" for c in classes.classes
    )


def add_shed_args(parser: argparse._ActionsContainer) -> None:
    """``--shed-priority P [--shed-waiting N]`` (:class:`~stallfree.core.config.ShedRule`)."""
    parser.add_argument(
        "--shed-priority",
        type=int,
        metavar="P",
        help="requests of priority >= P (vLLM's request field; a batch job's, say) are sheddable: refused "
        "(429 with Retry-After from a server) while --shed-waiting requests wait for a first token "
        "(default: none)",
    )
    parser.add_argument(
        "--shed-waiting",
        type=non_negative_int,
        default=DEFAULT_SHED_WAITING,
        metavar="N",
        help="with --shed-priority: the requests waiting for a first token at which sheddable ones are "
        "refused (default %(default)s)",
    )


def shed_rule(args: argparse.Namespace) -> ShedRule | None:
    """``--shed-priority`` / ``--shed-waiting`` as a rule (None: nothing is shed)."""
    from stallfree.core.config import ShedRule

    if args.shed_priority is None:
        if args.shed_waiting != DEFAULT_SHED_WAITING:
            raise UsageError("--shed-waiting applies with --shed-priority P")
        return None
    return ShedRule(args.shed_priority, args.shed_waiting)
