"""A fleet: N replicas behind a router, on the one clock (:func:`~stallfree.sim.driver.drive`).

Each replica is today's simulator unchanged (its own scheduler, KV cache and prefix cache, a
:class:`~stallfree.sim.traffic.TrafficReplica`); the router (:mod:`stallfree.core.router`) sees
what a real one sees: the requests in flight at each replica (routed and not yet finished or
refused), and its own tree of what it routed. Every request is routed exactly once and recorded
by the replica that took it; the fleet's records are all of them, in arrival order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from stallfree.core import Request, Scheduler
from stallfree.core.router import Router
from stallfree.costs.protocol import SteadyCostModel
from stallfree.metrics import ItlAccumulator, RequestRecord
from stallfree.sim.driver import SimClock, drive
from stallfree.sim.traffic import TrafficReplica, TrafficRun


@dataclass(slots=True)
class FleetRun:
    """What :func:`run_fleet` measured: each replica's run, and the fleet's records (arrival order)
    and ITL samples."""

    runs: list[TrafficRun]
    records: list[RequestRecord]
    itl: ItlAccumulator
    duration_s: float
    stopped: bool

    @property
    def load_imbalance(self) -> float:
        """The busiest replica's busy time over the mean (1: even; 0 busy time: 1)."""
        busy = [run.busy_s for run in self.runs]
        mean = sum(busy) / len(busy)
        return max(busy) / mean if mean > 0 else 1.0


def run_fleet(
    schedulers: Sequence[Scheduler],
    cost_models: Sequence[SteadyCostModel],
    router: Router,
    requests: Iterable[Request],
    *,
    fast: bool = True,
    step_budget_s: float | None = None,
    stop: Callable[[], bool] | None = None,
) -> FleetRun:
    """Route ``requests`` (ordered by arrival) over one replica per scheduler, each priced by its
    cost model, until all are done (or ``stop``)."""
    replicas = [
        TrafficReplica(s, c, fast=fast, step_budget_s=step_budget_s)
        for s, c in zip(schedulers, cost_models, strict=True)
    ]
    order: dict[str, int] = {}

    def route(request: Request) -> int:
        order[request.request_id] = len(order)
        return router.route(request, [r.num_in_flight for r in replicas])

    clock = SimClock()
    stopped = drive(clock, requests, replicas, route=route, stop=stop)
    runs = [r.result(clock.now(), stopped) for r in replicas]
    records = sorted((rec for run in runs for rec in run.records), key=lambda rec: order[rec.request_id])
    itl = ItlAccumulator()
    for run in runs:
        itl.add_many(run.itl.values_s, run.itl.counts)
    return FleetRun(runs, records, itl, clock.now(), stopped)
