"""``--classes``: several traffic classes in one run (:mod:`stallfree.workload.classes`)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from stallfree.cli.common import UsageError

if TYPE_CHECKING:
    from stallfree.workload.classes import TrafficClasses

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
        "batch:lengths=arxiv,qps=1,priority=10; --num-requests is shared by rate; per-class metrics follow",
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
