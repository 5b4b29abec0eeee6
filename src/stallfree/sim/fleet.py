"""A fleet: N replicas behind a router, on the one clock (:func:`~stallfree.sim.driver.drive`).

Each replica is today's simulator unchanged (its own scheduler, KV cache and prefix cache, a
:class:`~stallfree.sim.traffic.TrafficReplica`); the router (:mod:`stallfree.core.router`) sees
what a real one sees: the requests in flight at each replica (routed and not yet finished or
refused), and its own tree of what it routed. Every request is routed exactly once and recorded
by the replica that took it; the fleet's records are all of them, in arrival order.

A routing delay (the router's own latency and the hop to the replica) holds each request that
long between the router's choice and the replica's queue: it counts in the replica's in-flight
load from the choice on, and in its TTFT (measured from the client's arrival).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from stallfree.core import Request, Scheduler
from stallfree.core.config import ShedRule
from stallfree.core.router import Router
from stallfree.costs.protocol import SteadyCostModel
from stallfree.metrics import ItlAccumulator, RequestRecord
from stallfree.sim.driver import ArrivalQueue, SimClock, drive
from stallfree.sim.kv_tiers import TieredReplica, TierLoads
from stallfree.sim.speculative import DraftVerifier
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


class DelayedReplica:
    """A replica whose requests reach it ``delay_s`` after they are routed to it."""

    def __init__(self, inner: TrafficReplica | TieredReplica, delay_s: float) -> None:
        self.inner = inner
        self._delay_s = delay_s
        self._on_the_way: deque[tuple[float, Request]] = deque()  # (due, request), in due order
        self._stepping = False

    @property
    def num_in_flight(self) -> int:
        return len(self._on_the_way) + self.inner.num_in_flight

    def add_request(self, request: Request, now_s: float) -> None:
        self._on_the_way.append((now_s + self._delay_s, request))

    def has_unfinished_requests(self) -> bool:
        return bool(self._on_the_way) or self.inner.has_unfinished_requests()

    def land(self, now_s: float) -> None:
        """Hand the replica the requests that have reached it by ``now_s`` (a step in flight sees
        them at its end; one the replica refuses is refused as it lands)."""
        while self._on_the_way and self._on_the_way[0][0] <= now_s:
            self.inner.add_request(self._on_the_way.popleft()[1], now_s)

    def start_step(self, now_s: float, next_arrival_s: float | None) -> float | None:
        self.land(now_s)
        due_s = self._on_the_way[0][0] if self._on_the_way else None
        upcoming = [t for t in (next_arrival_s, due_s) if t is not None]
        end_s = self.inner.start_step(now_s, min(upcoming) if upcoming else None)
        self._stepping = end_s is not None
        return end_s if end_s is not None else due_s  # nothing to run: wake when the next lands

    def cut(self, at_s: float) -> float | None:
        # the request added last lands after the delay; waiting for an earlier one: no change
        return self.inner.cut(at_s + self._delay_s) if self._stepping else None

    def finish_step(self) -> None:
        if self._stepping:
            self.inner.finish_step()
            self._stepping = False


class _FleetWaiting:
    """The requests without a first token in a whole fleet."""

    def __init__(self, replicas: Sequence[TrafficReplica]) -> None:
        self.replicas = replicas

    def __call__(self) -> int:
        return sum(r.num_without_first_token() for r in self.replicas)


def run_fleet(
    schedulers: Sequence[Scheduler],
    cost_models: Sequence[SteadyCostModel],
    router: Router,
    requests: Iterable[Request] | ArrivalQueue,
    *,
    fast: bool = True,
    step_budget_s: float | None = None,
    stop: Callable[[], bool] | None = None,
    route_delay_s: float = 0.0,
    drafts: Sequence[DraftVerifier] | None = None,
    on_finished: Callable[[str, float], None] | None = None,
    tiers: Sequence[TierLoads] | None = None,
    shed: ShedRule | None = None,
) -> FleetRun:
    """Route ``requests`` (ordered by arrival, or an :class:`~stallfree.sim.driver.ArrivalQueue`)
    over one replica per scheduler, each priced by its cost model, until all are done (or
    ``stop``); each reaches its replica ``route_delay_s`` after it arrives. ``drafts``: one draft
    verifier per replica (speculative decoding). ``on_finished(request_id, end_s)``: called as
    each request finishes, whichever replica ran it. ``tiers``: each replica's KV tiers below its
    GPU cache (:class:`~stallfree.sim.kv_tiers.TieredReplica`). ``shed``: sheddable requests are
    refused while enough wait for a first token in the whole fleet (the gateway's view)."""
    if not (route_delay_s >= 0 and route_delay_s < float("inf")):
        raise ValueError(f"the routing delay must be a finite number >= 0, got {route_delay_s}")
    cuttable = len(schedulers) > 1  # one replica is told each arrival ahead (drive)
    verifiers: Sequence[DraftVerifier | None] = drafts or [None] * len(schedulers)
    traffic = [
        TrafficReplica(
            s,
            c,
            fast=fast,
            step_budget_s=step_budget_s,
            cuttable=cuttable,
            drafts=d,
            on_finished=on_finished,
            shed=shed,
        )
        for s, c, d in zip(schedulers, cost_models, verifiers, strict=True)
    ]
    if shed is not None:  # the gateway sheds on the fleet's queue, not one replica's
        waiting = _FleetWaiting(traffic)
        for replica in traffic:
            replica.fleet_waiting = waiting
    inner: Sequence[TrafficReplica | TieredReplica] = (
        traffic if tiers is None else [TieredReplica(r, t) for r, t in zip(traffic, tiers, strict=True)]
    )
    delayed = [DelayedReplica(r, route_delay_s) for r in inner] if route_delay_s > 0 else []
    replicas: Sequence[TrafficReplica | TieredReplica | DelayedReplica] = delayed or inner
    order: dict[str, int] = {}

    def route(request: Request) -> int:
        order[request.request_id] = len(order)
        for replica in delayed:  # the router's count is of what each replica has not yet answered
            replica.land(request.arrival_time_s)
        return router.route(request, [r.num_in_flight for r in replicas])

    clock = SimClock()
    stopped = drive(clock, requests, replicas, route=route, stop=stop)
    for replica in traffic:
        replica.fleet_waiting = None  # the count refers back to every replica: no cycle outlives the run
    runs = [r.result(clock.now(), stopped) for r in traffic]
    records = sorted((rec for run in runs for rec in run.records), key=lambda rec: order[rec.request_id])
    itl = ItlAccumulator()
    for run in runs:
        itl.add_many(run.itl.values_s, run.itl.counts)
    return FleetRun(runs, records, itl, clock.now(), stopped)
