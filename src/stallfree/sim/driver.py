"""The one event loop every run goes through: a clock, arrivals, and replicas that step.

Two kinds of event move a run: a request *arrives* (it is handed to a replica), and a replica's
*step ends* (one step, or a steady run of identical steps priced at once, see
:class:`~stallfree.sim.traffic.TrafficReplica`). At one instant the loop first ends the steps due,
then asks ``stop`` (if a step ended), then hands over the arrivals due (in arrival order, to the
replica ``route`` picks), then lets every replica without a step in flight start its next one
(an idle replica only once a request reaches it); then the clock goes to the earliest next
event. A replica's step is planned when it starts and its outcome (tokens, finished requests)
recorded when it ends, so whatever happens on the clock between the two (an arrival, another
replica's step, a router counting requests in flight) sees the step's requests still running, as
a router or a KV transfer in front of a real server would. An arrival during a
step only queues: the replica's scheduler sees it at its next step.

The clock is the seam between the simulator and the engine: :class:`SimClock` jumps to the next
event; :class:`WallClock` sleeps until it, and a real engine's step takes its own time (its end
is when the call returned). The replicas are the participants (:class:`Replica`): a scheduler
with its executor and caches, and whatever each driver records about its requests.
"""

from __future__ import annotations

import gc
import heapq
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol, cast

from stallfree.core import Request


class Clock(Protocol):
    """Where a run's time comes from."""

    def now(self) -> float: ...

    def wait_until(self, time_s: float) -> None:
        """Move to ``time_s`` (never backwards): jump there, or sleep until then."""
        ...


class SimClock:
    """Simulated time: waiting is free, the clock jumps."""

    __slots__ = ("_now_s",)

    def __init__(self, start_s: float = 0.0) -> None:
        self._now_s = start_s

    def now(self) -> float:
        return self._now_s

    def wait_until(self, time_s: float) -> None:
        self._now_s = max(self._now_s, time_s)


class WallClock:
    """Seconds since the clock was made, on the wall; waiting sleeps."""

    __slots__ = ("_origin",)

    def __init__(self) -> None:
        self._origin = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self._origin

    def wait_until(self, time_s: float) -> None:
        delay_s = time_s - self.now()
        if delay_s > 0:
            time.sleep(delay_s)


class Replica(Protocol):
    """A participant: takes requests, runs steps. Drivers record what they need in their own."""

    def add_request(self, request: Request, now_s: float) -> None: ...

    def has_unfinished_requests(self) -> bool: ...

    def start_step(self, now_s: float, next_arrival_s: float | None) -> float | None:
        """Plan (and price or run) the next step, or steady run of steps, from ``now_s``; when it
        ends, or None when there is nothing to run until a request arrives. ``next_arrival_s``
        is the next arrival this replica will see, when the driver knows it (a steady run whose
        plan an arrival would change stops before it); None: none known."""
        ...

    def cut(self, at_s: float) -> float | None:
        """A request was just added (or something else changed) while a step is in flight; it
        reaches the scheduler at ``at_s``: the step's new end if that changes it (a steady run the
        request ends sooner; a link's transfers slowed by a new one), else None."""
        ...

    def finish_step(self) -> None:
        """Apply the step started last, at the end time :meth:`start_step` or :meth:`cut` gave."""
        ...


class ArrivalQueue(Protocol):
    """Requests not all known ahead: some arrive only once others finish (an agent's next turn, a
    tool's wait after its previous one). ``head`` is the earliest arrival known now and not yet
    handed over (None: none known now); :meth:`advance` hands it over. A request becomes known
    only when one of the run's steps ends (its participant's ``on_finished``, wired by whoever
    built the queue), never earlier than that instant, so arrivals stay in order."""

    head: Request | None

    def advance(self) -> None: ...


class _InOrder:
    """Requests known ahead, in arrival order, as an :class:`ArrivalQueue`."""

    __slots__ = ("_pending", "head")

    def __init__(self, requests: Iterable[Request]) -> None:
        self._pending = iter(requests)
        self.head: Request | None = next(self._pending, None)

    def advance(self) -> None:
        self.head = next(self._pending, None)


Route = Callable[[Request], int]
Handoff = tuple[int, Callable[[float], None]]
"""Participant ``i`` changed at the current instant by calling ``f(now_s)`` (a request handed to
it, blocks freed in it): it is then woken, or its step in flight cut, as for an arrival."""


def drive(
    clock: Clock,
    requests: Iterable[Request] | ArrivalQueue,
    replicas: Sequence[Replica],
    *,
    route: Route | None = None,
    stop: Callable[[], bool] | None = None,
    handoffs: list[Handoff] | None = None,
) -> bool:
    """Run ``requests`` (ordered by ``arrival_time_s``) through ``replicas`` until all is done.
    ``requests`` may be an :class:`ArrivalQueue`, whose head is read again at every instant.

    ``route`` picks each arrival's replica (default: the first). ``stop`` is asked whenever steps
    have ended; once it returns True while work remains, the run ends there
    and ``drive`` returns True (steps in flight are not applied). Returns False when complete.

    One replica is told the next arrival when its step starts (every arrival is its own). In a
    fleet, where the router decides at the arrival, a replica's step is cut when a request is
    routed to it (:meth:`Replica.cut`: a fleet's replicas must be able to, e.g. a cuttable
    :class:`~stallfree.sim.traffic.TrafficReplica`); the steps in flight wait in a heap by their
    end, and an idle replica is not asked again until a request reaches it.

    ``handoffs``: a list the participants append to as their steps end (a prefill replica hands a
    request to a KV link, the link to a decode replica); the loop applies them at that instant,
    before the arrivals due, waking or cutting each participant changed.

    On the simulated clock Python's cycle collector looks at young objects every 50,000
    allocations instead of every 700: a simulation makes millions of short-lived objects, and
    the passes over those still alive (a prefix cache's runs, a router's tree) took ~12% of a
    cached Mooncake run. (A wall-clock run keeps Python's default.)
    """
    if not isinstance(clock, SimClock):
        return _drive(clock, requests, replicas, route, stop, handoffs)
    thresholds = gc.get_threshold()
    gc.set_threshold(max(thresholds[0], 50_000), *thresholds[1:])
    try:
        return _drive(clock, requests, replicas, route, stop, handoffs)
    finally:
        gc.set_threshold(*thresholds)


def _drive(
    clock: Clock,
    requests: Iterable[Request] | ArrivalQueue,
    replicas: Sequence[Replica],
    route: Route | None,
    stop: Callable[[], bool] | None,
    handoffs: list[Handoff] | None,
) -> bool:
    # A queue is told by its advance() (mypyc compiles no runtime-checkable protocol).
    queue = cast(ArrivalQueue, requests) if hasattr(requests, "advance") else _InOrder(requests)
    lone = len(replicas) == 1
    ends_s: list[float | None] = [None] * len(replicas)  # the step in flight's end, per replica
    due: list[tuple[float, int]] = []  # (end, replica) of the steps in flight; stale ones skipped
    ready = list(range(len(replicas)))  # replicas to start at this instant
    last_arrival_s = 0.0
    while True:
        now_s = clock.now()
        stepped = False
        while due and due[0][0] <= now_s:
            end_s, i = heapq.heappop(due)
            if ends_s[i] != end_s:
                continue  # cut to end sooner: already finished
            ends_s[i] = None
            replicas[i].finish_step()
            ready.append(i)
            stepped = True
        if stepped and stop is not None and stop() and _work_left(queue.head, replicas):
            return True
        while handoffs:
            batch = handoffs[:]
            del handoffs[: len(batch)]
            for i, change in batch:  # a change may hand on more: the next turn takes them
                change(now_s)
                _touched(i, now_s, replicas, ends_s, due, ready)
        while (upcoming := queue.head) is not None and upcoming.arrival_time_s <= now_s:
            if upcoming.arrival_time_s < last_arrival_s:
                raise ValueError(f"request {upcoming.request_id} arrives before the one before it")
            last_arrival_s = upcoming.arrival_time_s
            i = route(upcoming) if route is not None else 0
            replicas[i].add_request(upcoming, now_s)
            if ends_s[i] is None:
                ready.append(i)
            elif not lone:
                _touched(i, now_s, replicas, ends_s, due, ready)
            queue.advance()
        upcoming = queue.head
        next_arrival_s = upcoming.arrival_time_s if upcoming is not None else None
        for i in sorted(set(ready)):
            if ends_s[i] is None:
                ends_s[i] = started_end_s = replicas[i].start_step(now_s, next_arrival_s if lone else None)
                if started_end_s is not None:
                    heapq.heappush(due, (started_end_s, i))
        ready.clear()
        if handoffs:
            continue  # a step that started changed another participant: apply it at this instant
        while due and ends_s[due[0][1]] != due[0][0]:
            heapq.heappop(due)  # stale: its replica's step was cut
        next_s = due[0][0] if due else next_arrival_s
        if next_s is None:
            return False
        if next_arrival_s is not None and next_arrival_s < next_s:
            next_s = next_arrival_s
        clock.wait_until(next_s)


def _touched(
    i: int,
    now_s: float,
    replicas: Sequence[Replica],
    ends_s: list[float | None],
    due: list[tuple[float, int]],
    ready: list[int],
) -> None:
    """Replica ``i`` just changed: start it if idle, else let it cut (or move) its step's end."""
    if ends_s[i] is None:
        ready.append(i)
        return
    cut_s = replicas[i].cut(now_s)
    if cut_s is not None:
        ends_s[i] = cut_s
        heapq.heappush(due, (cut_s, i))


def _work_left(upcoming: Request | None, replicas: Sequence[Replica]) -> bool:
    return upcoming is not None or any(r.has_unfinished_requests() for r in replicas)
