"""A fleet whose size an autoscaler sets, on the one clock (:func:`~stallfree.sim.driver.drive`).

The fleet has twice ``max_replicas`` slots (as many again for replicas still draining: Kubernetes
counts a terminating pod out of the replicas at once). A slot is *off*, *starting* (its GPUs held, its weights
loading: not routable until ``startup_s`` has passed), *ready* (routable) or *draining* (taking
nothing new, leaving once its last request ends). Every ``scrape_s`` the autoscaler
(:mod:`stallfree.core.autoscale`) reads the ready replicas' gauges and answers a count: more
turns off slots into starting ones; fewer first cancels starting ones (the newest first), then
drains ready ones (the fewest requests in flight first). A slot turned on again is a new replica:
a fresh scheduler, KV cache and prefix cache, and the router forgets what it routed to the old one.

The router sees only the ready replicas. A request is routed exactly once, to a ready replica,
and recorded by the replica that took it (a draining one keeps its requests to the end): nothing
is lost or counted twice. GPU time runs from a slot's turning on to its leaving (start-up
included: the GPUs are held while the weights load).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from stallfree.core import Request, Scheduler
from stallfree.core.autoscale import Autoscaler, ReplicaMetrics
from stallfree.core.router import Router
from stallfree.metrics import ItlAccumulator, RequestRecord
from stallfree.sim.driver import SimClock, drive
from stallfree.sim.fleet import DelayedReplica
from stallfree.sim.traffic import TrafficReplica, TrafficRun


@dataclass(frozen=True, slots=True)
class ScalingEvent:
    """At ``time_s`` the autoscaler wanted ``desired`` replicas, from ``current``."""

    time_s: float
    current: int
    desired: int


@dataclass(frozen=True, slots=True)
class Lifetime:
    """One replica's time on its GPUs: turned on, routable from (None: cancelled while starting), gone."""

    slot: int
    on_s: float
    ready_s: float | None
    off_s: float


@dataclass(slots=True)
class AutoscaledRun:
    """What :func:`run_autoscaled` measured: every replica's run, the fleet's records (arrival
    order) and ITL samples, the scaling decisions, each replica's lifetime, and the fleet's size
    at every scrape (time, starting, ready, draining)."""

    runs: list[TrafficRun]
    schedulers: list[Scheduler]  # every replica's, in the order of runs
    records: list[RequestRecord]
    itl: ItlAccumulator
    duration_s: float
    stopped: bool
    events: list[ScalingEvent]
    lifetimes: list[Lifetime]
    sizes: list[tuple[float, int, int, int]] = field(default_factory=list)

    def replica_seconds(self) -> float:
        return sum(life.off_s - life.on_s for life in self.lifetimes)


class _Slot:
    """A participant whose replica can be swapped: the driver sees one participant per slot.
    ``stepper`` is the replica, or the replica behind a routing delay."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.replica: TrafficReplica | None = None
        self.stepper: TrafficReplica | DelayedReplica | None = None
        self.state = "off"
        self.on_s = 0.0
        self.ready_s = 0.0
        self.drain_s = 0.0

    # the Replica protocol: an off slot is never routed to, so never stepped
    def add_request(self, request: Request, now_s: float) -> None:
        assert self.stepper is not None
        self.stepper.add_request(request, now_s)

    def has_unfinished_requests(self) -> bool:
        return self.stepper is not None and self.stepper.has_unfinished_requests()

    def start_step(self, now_s: float, next_arrival_s: float | None) -> float | None:
        return None if self.stepper is None else self.stepper.start_step(now_s, next_arrival_s)

    def cut(self, at_s: float) -> float | None:
        return None if self.stepper is None else self.stepper.cut(at_s)

    def finish_step(self) -> None:
        if self.stepper is not None:
            self.stepper.finish_step()


class _Scraper:
    """The autoscaler's participant: a step is the wait to the next scrape."""

    def __init__(
        self, scrape_s: float, busy: Callable[[float], bool], scrape: Callable[[float], None]
    ) -> None:
        self._scrape_s, self._busy, self._scrape = scrape_s, busy, scrape
        self._next_s = 0.0

    def add_request(self, request: Request, now_s: float) -> None:
        raise AssertionError("the autoscaler takes no requests")

    def has_unfinished_requests(self) -> bool:
        return False

    def start_step(self, now_s: float, next_arrival_s: float | None) -> float | None:
        if not self._busy(now_s):
            return None  # the day is over: no more scrapes
        self._next_s = now_s + self._scrape_s
        return self._next_s

    def cut(self, at_s: float) -> float | None:
        return None

    def finish_step(self) -> None:
        self._scrape(self._next_s)


class _Fleet:
    """The slots, what each holds, and the autoscaler's moves on them (see the module's docstring)."""

    def __init__(
        self,
        make_replica: Callable[[], TrafficReplica],
        router: Router,
        autoscaler: Autoscaler,
        startup_s: float,
        route_delay_s: float,
    ) -> None:
        self.route_delay_s = route_delay_s
        self.make_replica, self.router, self.autoscaler, self.startup_s = (
            make_replica,
            router,
            autoscaler,
            startup_s,
        )
        self.slots = [_Slot(i) for i in range(num_slots(autoscaler.max_replicas))]
        self.retired: list[TrafficReplica] = []
        self.lifetimes: list[Lifetime] = []
        self.events: list[ScalingEvent] = []
        self.sizes: list[tuple[float, int, int, int]] = []
        self.order: dict[str, int] = {}  # request id -> arrival order

    def turn_on(self, slot: _Slot, now_s: float, ready_s: float) -> None:
        if slot.replica is not None:
            self.retired.append(slot.replica)
        slot.replica, slot.state, slot.on_s, slot.ready_s = self.make_replica(), "starting", now_s, ready_s
        slot.stepper = (
            DelayedReplica(slot.replica, self.route_delay_s) if self.route_delay_s else slot.replica
        )
        forget = getattr(self.router, "forget", None)
        if forget is not None:
            forget(slot.index)

    def turn_off(self, slot: _Slot, off_s: float, served: bool) -> None:
        self.lifetimes.append(Lifetime(slot.index, slot.on_s, slot.ready_s if served else None, off_s))
        slot.state = "off"

    def routable(self, now_s: float) -> list[int]:
        for slot in self.slots:
            if slot.state == "starting" and slot.ready_s <= now_s:
                slot.state = "ready"
        return [s.index for s in self.slots if s.state == "ready"]

    def leave_if_drained(self) -> None:
        """Draining replicas with nothing in flight leave, as their last request ended."""
        for slot in self.slots:
            if slot.state == "draining" and _in_flight(slot) == 0:
                assert slot.replica is not None
                last_s = max((r.finish_s for r in slot.replica.records), default=slot.drain_s)
                self.turn_off(slot, max(slot.drain_s, last_s), served=True)

    def scrape(self, now_s: float) -> None:
        """Read the ready replicas' gauges, ask the autoscaler, and start, cancel or drain."""
        ready = self.routable(now_s)
        self.leave_if_drained()
        live = [s for s in self.slots if s.state in ("starting", "ready")]
        metrics = [_gauges(self.slots[i].replica) for i in ready]
        wanted = self.autoscaler.desired(now_s, len(live), metrics, len(self.order))
        if wanted != len(live):
            self.events.append(ScalingEvent(now_s, len(live), wanted))
        for slot in [s for s in self.slots if s.state == "off"][: max(0, wanted - len(live))]:
            self.turn_on(slot, now_s, now_s + self.startup_s)
        surplus = max(0, len(live) - wanted)
        starting = sorted((s for s in live if s.state == "starting"), key=lambda s: -s.on_s)
        for slot in starting[:surplus]:
            self.turn_off(slot, now_s, served=False)
        surplus -= min(surplus, len(starting))
        serving = sorted((s for s in live if s.state == "ready"), key=lambda s: (_in_flight(s), s.index))
        for slot in serving[:surplus]:
            slot.state, slot.drain_s = "draining", now_s
        self.leave_if_drained()
        states = [s.state for s in self.slots]
        self.sizes.append((now_s, states.count("starting"), states.count("ready"), states.count("draining")))

    def route(self, request: Request) -> int:
        self.order[request.request_id] = len(self.order)
        for slot in self.slots:  # the router counts what each replica has not yet answered
            if isinstance(slot.stepper, DelayedReplica):
                slot.stepper.land(request.arrival_time_s)
        self.leave_if_drained()
        in_flight = [_in_flight(s) for s in self.slots]
        return self.router.route(request, in_flight, self.routable(request.arrival_time_s))

    def close(self, end_s: float) -> list[TrafficReplica]:
        """The run is over at ``end_s``: every replica still on leaves; all that ever served."""
        self.routable(end_s)
        self.leave_if_drained()
        for slot in self.slots:
            if slot.state != "off":  # on its GPUs to the end of the run
                self.turn_off(slot, end_s, served=slot.state != "starting")
        return self.retired + [s.replica for s in self.slots if s.replica is not None]


def run_autoscaled(
    make_replica: Callable[[], TrafficReplica],
    router: Router,
    autoscaler: Autoscaler,
    requests: Iterable[Request],
    *,
    initial: int,
    startup_s: float,
    scrape_s: float,
    stop: Callable[[], bool] | None = None,
    route_delay_s: float = 0.0,
) -> AutoscaledRun:
    """Serve ``requests`` (ordered by arrival) from ``initial`` ready replicas (built by
    ``make_replica``, cuttable), the autoscaler resizing the fleet every ``scrape_s`` within its
    bounds, a new replica routable ``startup_s`` after it was asked for; each request reaches its
    replica ``route_delay_s`` after it arrives (:class:`~stallfree.sim.fleet.DelayedReplica`)."""
    listed = list(requests)
    last_arrival_s = listed[-1].arrival_time_s if listed else 0.0
    fleet = _Fleet(make_replica, router, autoscaler, startup_s, route_delay_s)
    for slot in fleet.slots[:initial]:
        fleet.turn_on(slot, 0.0, 0.0)

    def busy(now_s: float) -> bool:
        return now_s < last_arrival_s or any(
            s.state != "off" and s.has_unfinished_requests() for s in fleet.slots
        )

    clock = SimClock()
    scraper = _Scraper(scrape_s, busy, fleet.scrape)
    stopped = drive(clock, listed, [*fleet.slots, scraper], route=fleet.route, stop=stop)
    end_s = clock.now()
    replicas = fleet.close(end_s)
    runs = [r.result(end_s, stopped) for r in replicas]
    records = sorted(
        (rec for run in runs for rec in run.records), key=lambda rec: fleet.order[rec.request_id]
    )
    itl = ItlAccumulator()
    for run in runs:
        itl.add_many(run.itl.values_s, run.itl.counts)
    schedulers = [r.scheduler for r in replicas]
    return AutoscaledRun(
        runs, schedulers, records, itl, end_s, stopped, fleet.events, fleet.lifetimes, fleet.sizes
    )


def num_slots(max_replicas: int) -> int:
    """Slots for a fleet of at most ``max_replicas``: each may be draining while another takes its place."""
    return 2 * max_replicas


def _in_flight(slot: _Slot) -> int:
    return 0 if slot.stepper is None or slot.state == "off" else slot.stepper.num_in_flight


def _gauges(replica: TrafficReplica | None) -> ReplicaMetrics:
    """vLLM's gauges, and Dynamo's forward-pass metrics as of the last step."""
    assert replica is not None
    return ReplicaMetrics.of(replica.scheduler)
