"""Per-class scores of a run with traffic classes (:mod:`stallfree.workload.classes`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from stallfree.core.request import Request
from stallfree.metrics import ItlAccumulator, RequestRecord, summarize
from stallfree.workload.classes import TrafficClasses


def class_summaries(
    classes: TrafficClasses,
    requests: Sequence[Request],
    records: Sequence[RequestRecord],
    class_itl: Mapping[str, ItlAccumulator],
    duration_s: float,
) -> dict[str, dict[str, Any]]:
    """Each class's :func:`~stallfree.metrics.summarize` over the whole run's ``duration_s`` (its
    goodput against its own SLOs), with its ``priority`` and offered ``qps``; classes in the order
    given."""
    class_of = {r.request_id: r.traffic_class for r in requests}
    out: dict[str, dict[str, Any]] = {}
    for c in classes.classes:
        mine = [r for r in records if class_of.get(r.request_id) == c.name]
        scores = summarize(mine, class_itl.get(c.name, ItlAccumulator()), duration_s, c.slos or None)
        exact_max = max((r.max_itl_s for r in mine), default=0.0) * 1000
        out[c.name] = {
            "priority": c.priority,
            "qps": c.qps,
            "slos_ms": dict(c.slos),
            **scores,
            "max_itl_ms": exact_max if scores["max_itl_ms"] is not None else None,
        }
    return out
