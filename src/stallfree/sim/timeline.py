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


def simulate_timeline(
    scheduler: Scheduler,
    executor: Executor,
    requests: Iterable[Request],
    *,
    start_s: float = 0.0,
    stop: Callable[[Timeline], bool] | None = None,
    timeline: Timeline | None = None,
) -> Timeline:
    """Run ``requests`` (by ``arrival_time_s``) to completion, or until ``stop(timeline)``.

    Passing a ``timeline`` back in continues a run (same scheduler) from
    ``start_s`` with more arrivals.
    """
    tl = timeline if timeline is not None else Timeline()
    pending = sorted(requests, key=lambda r: r.arrival_time_s)
    clock = start_s
    i = 0
    while True:
        while i < len(pending) and pending[i].arrival_time_s <= clock:
            reason = scheduler.add_request(pending[i])
            if reason is not None:
                tl.rejected[pending[i].request_id] = reason
            i += 1
        out = run_step(scheduler, executor)
        if out is None:
            if i == len(pending):
                break
            clock = max(clock, pending[i].arrival_time_s)
            continue
        plan, result, events = out
        tl.steps.append(
            TimelineStep(
                clock,
                result.duration_s,
                plan.num_decode_tokens,
                plan.num_prefill_tokens,
                tuple((c.request_id, c.num_tokens) for c in plan.chunks),
            )
        )
        clock += result.duration_s
        for rid in events.new_token_request_ids:
            tl.token_times_s.setdefault(rid, []).append(clock)
        tl.end_s = clock
        if stop is not None and stop(tl):
            break
    return tl
