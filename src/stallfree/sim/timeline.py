"""The simulated-clock driver: arrivals + the shared step loop + a cost model.

Time only moves here: each step advances the clock by the executor's
``duration_s``; when nothing can run, the clock jumps to the next arrival.
Every token gets the clock's time at the end of the step that produced it.
This module keeps every step and token time, which suits single scenarios
(``stallfree explain``); continuous traffic at scale keeps aggregates instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from stallfree.core import Executor, Request, Scheduler, run_step
from stallfree.core.scheduler import StepEvents
from stallfree.sim.driver import SimClock, drive


@dataclass(frozen=True, slots=True)
class TimelineStep:
    """One executed step on the simulated clock."""

    start_s: float
    duration_s: float
    num_decode_tokens: int
    num_prefill_tokens: int
    tokens_by_request: tuple[tuple[str, int], ...]

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


@dataclass(slots=True)
class Timeline:
    """Everything a small run did: steps, token times, rejections."""

    steps: list[TimelineStep] = field(default_factory=list)
    token_times_s: dict[str, list[float]] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)
    end_s: float = 0.0


class TimelineReplica:
    """A scheduler and an executor on the simulated clock, keeping every step and token time in
    a :class:`Timeline`: a participant of :func:`~stallfree.sim.driver.drive`."""

    def __init__(self, scheduler: Scheduler, executor: Executor, timeline: Timeline) -> None:
        self.scheduler = scheduler
        self._executor = executor
        self.timeline = timeline
        self._events: StepEvents | None = None

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def add_request(self, request: Request, now_s: float) -> None:
        reason = self.scheduler.add_request(request)
        if reason is not None:
            self.timeline.rejected[request.request_id] = reason

    def start_step(self, now_s: float, next_arrival_s: float | None) -> float | None:
        out = run_step(self.scheduler, self._executor)
        if out is None:
            return None
        plan, result, self._events = out
        self.timeline.steps.append(
            TimelineStep(
                now_s,
                result.duration_s,
                plan.num_decode_tokens,
                plan.num_prefill_tokens,
                tuple((c.request_id, c.num_tokens) for c in plan.chunks),
            )
        )
        return now_s + result.duration_s

    def cut(self, at_s: float) -> float | None:
        return None  # one replica: never cut

    def finish_step(self) -> None:
        tl, events = self.timeline, self._events
        assert events is not None
        tl.end_s = tl.steps[-1].end_s
        accepted = events.num_accepted_drafts
        for rid in events.new_token_request_ids:
            # accepted drafts are tokens too, all at the step's end
            tl.token_times_s.setdefault(rid, []).extend([tl.end_s] * (1 + accepted.get(rid, 0)))


def simulate_timeline(
    scheduler: Scheduler,
    executor: Executor,
    requests: Iterable[Request],
    *,
    start_s: float = 0.0,
    stop: Callable[[Timeline], bool] | None = None,
    timeline: Timeline | None = None,
) -> Timeline:
    """Run ``requests`` (by ``arrival_time_s``) to completion, or until ``stop(timeline)`` (asked
    after every step).

    Passing a ``timeline`` back in continues a run (same scheduler) from
    ``start_s`` with more arrivals.
    """
    tl = timeline if timeline is not None else Timeline()
    replica = TimelineReplica(scheduler, executor, tl)
    drive(
        SimClock(start_s),
        sorted(requests, key=lambda r: r.arrival_time_s),
        [replica],
        stop=None if stop is None else lambda: stop(tl),
    )
    return tl
