"""Continuous traffic on a simulated clock, fast: the driver behind ``stallfree simulate``.

Requests arrive over time, the shared :class:`~stallfree.core.Scheduler` plans each step, a
cost model prices it, and the clock moves. Unlike :mod:`stallfree.sim.timeline` (every token
time kept, for single scenarios) this driver keeps aggregates that stay in flat memory: one
:class:`~stallfree.metrics.RequestRecord` per finished request, inter-token latencies as
weighted samples (one entry per step: the gap and how many streams saw it, rounded to 16
significant bits and merged, see :mod:`stallfree.sim.itl`), and state only for requests still
in flight.

Fast path: most steps repeat the previous one (the same decodes, one prompt chunk of the same
size), differing only in context length. :meth:`Scheduler.steady_run` says how many steps a plan
runs in a row before something other than time changes (a request finishes, a prompt reaches
its last chunk, KV blocks run short, or, for some plans, a request arrives); the driver prices
them all at once with :meth:`CostModel.steady_durations` and applies them with
:meth:`Scheduler.update_steady`. Invariant: ``fast=True`` gives the same records and ITL samples
as ``fast=False`` (one :meth:`Scheduler.schedule` per step); the clock is summed step by step in
the same order, so the times are equal bit for bit.

A run can be stopped early (``stop``, polled once per plan, between steps): it then holds the
requests finished by then, and the clock where it stopped (``stopped``).
"""

from __future__ import annotations

import re
from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import accumulate, pairwise

import numpy as np

from stallfree.core import Request, Scheduler, StepPlan, StepResult
from stallfree.core.config import ShedRule
from stallfree.core.scheduler import StepEvents
from stallfree.core.steady import SINGLE_STEP
from stallfree.costs.protocol import SteadyCostModel
from stallfree.metrics import ItlAccumulator, RequestRecord
from stallfree.sim.driver import ArrivalQueue, SimClock, drive
from stallfree.sim.itl import ItlSamples
from stallfree.sim.kv_tiers import TieredReplica, TierLoads
from stallfree.sim.speculative import DraftStats, DraftVerifier


@dataclass(slots=True)
class StepTrace:
    """Per-run columns: one row per scheduled plan, which ran ``num_steps`` times in a row.

    ``num_decode_tokens`` / ``num_prefill_tokens`` are per step; ``num_running``,
    ``num_waiting`` and ``kv_blocks_used`` are read after the last step of the row.
    """

    start_s: array[float] = field(default_factory=lambda: array("d"))
    end_s: array[float] = field(default_factory=lambda: array("d"))
    num_steps: array[int] = field(default_factory=lambda: array("q"))
    num_decode_tokens: array[int] = field(default_factory=lambda: array("q"))
    num_prefill_tokens: array[int] = field(default_factory=lambda: array("q"))
    num_running: array[int] = field(default_factory=lambda: array("q"))
    num_waiting: array[int] = field(default_factory=lambda: array("q"))
    kv_blocks_used: array[int] = field(default_factory=lambda: array("q"))

    def __len__(self) -> int:
        return len(self.start_s)


@dataclass(slots=True)
class TrafficRun:
    """What :func:`run_traffic` measured. ``records`` are in arrival order (one per request,
    rejected ones included); ``rejected_reasons`` counts rejections by kind of reason (reasons that
    differ only in their numbers count together), keyed by the first such reason's text."""

    records: list[RequestRecord]
    itl: ItlAccumulator
    duration_s: float
    num_steps: int
    num_plans: int
    num_preemptions: int
    rejected_reasons: dict[str, int]
    steps: StepTrace | None
    max_step_s: float = 0.0
    num_steps_over_budget: int = 0  # steps longer than run_traffic's step_budget_s (0 without one)
    stopped: bool = False  # stop() said so before every request had finished
    busy_s: float = 0.0  # time spent running steps (the rest the replica was idle)
    drafts: DraftStats | None = None  # speculative decoding's counters (None: no drafts)
    class_itl: dict[str, ItlAccumulator] = field(default_factory=dict)  # by traffic class, where given


class _Live:
    """A request in flight, as the metrics need it."""

    __slots__ = (
        "arrival_index",
        "arrival_s",
        "first_scheduled_s",
        "first_token_s",
        "itl",
        "last_token_s",
        "max_itl_s",
        "num_cached_tokens",
        "num_output_tokens",
        "num_preemptions",
        "num_prompt_tokens",
    )

    def __init__(self, request: Request, arrival_index: int, itl: ItlSamples | None = None) -> None:
        self.arrival_index = arrival_index
        self.itl = itl  # its traffic class's ITL samples (None: no class)
        self.arrival_s = request.arrival_time_s
        self.num_prompt_tokens = request.num_prompt_tokens
        self.first_scheduled_s: float | None = None
        self.first_token_s: float | None = None
        self.last_token_s = 0.0
        self.max_itl_s = 0.0
        self.num_output_tokens = 0
        self.num_preemptions = 0
        self.num_cached_tokens = 0


_NUMBER = re.compile(r"\d+(\.\d+)?")


class TrafficReplica:
    """A scheduler and its cost model on the simulated clock, keeping :class:`TrafficRun`'s
    aggregates: a participant of :func:`~stallfree.sim.driver.drive`.

    ``cuttable`` (a fleet's replicas, whose arrivals the router decides only as they come): a
    steady run that an arrival would end is priced whole and applied when it ends, so that
    :meth:`cut` can end it before the first step starting at or after a request that reaches
    this replica; its steps, times and tokens are those of a run told that arrival at its start.

    ``drafts`` (speculative decoding): accepts the drafts each step verifies and proposes the next
    ones (:class:`~stallfree.sim.speculative.DraftVerifier`). ``on_finished(request_id, end_s)`` is
    called for each request a step finishes (a prefill replica hands it to a KV link).
    """

    def __init__(
        self,
        scheduler: Scheduler,
        cost_model: SteadyCostModel,
        *,
        fast: bool = True,
        keep_steps: bool = False,
        step_budget_s: float | None = None,
        cuttable: bool = False,
        drafts: DraftVerifier | None = None,
        on_finished: Callable[[str, float], None] | None = None,
        shed: ShedRule | None = None,
    ) -> None:
        self.scheduler = scheduler
        self._shed = shed
        # what a sheddable arrival is judged by, where not this replica's requests without a first
        # token: a fleet's gateway counts every replica's (run_fleet sets it for the run)
        self.fleet_waiting: Callable[[], int] | None = None
        self._on_finished = on_finished
        self._drafts = drafts
        self._cost_model = cost_model
        self._fast = fast
        self._cuttable = cuttable
        self._step_budget_s = step_budget_s
        self._live: dict[str, _Live] = {}
        self.records: list[RequestRecord] = []
        self._arrival_order = array("q")  # records[i] is the arrival_order[i]-th request to arrive
        self._num_arrived = 0
        self.rejected: dict[str, int] = {}
        self._shown: dict[str, str] = {}  # reason with numbers as N -> the first real reason of that kind
        self.itl = ItlSamples()
        self.class_itl: dict[str, ItlSamples] = {}  # by Request.traffic_class, where requests have one
        self.trace = StepTrace() if keep_steps else None
        self.num_steps = self.num_plans = self.num_preemptions = self.num_over = 0
        self.max_step_s = 0.0
        self.busy_s = 0.0
        # the step in flight: its plan, start, first step's end, steady ends and durations, step
        # count, events (None until applied), and whether it waits to be applied at its end
        self._plan: StepPlan | None = None
        self._start_s = self._first_end_s = self._end_s = 0.0
        self._ends: list[float] | None = None
        self._durations: list[float] | None = None
        self._steps = 0
        self._events: StepEvents | None = None
        self._deferred = False

    def has_unfinished_requests(self) -> bool:
        scheduler = self.scheduler
        if not self._deferred:
            return scheduler.has_unfinished_requests()
        # The run in flight is not applied yet: its last step finishes the requests it brings to
        # max_tokens (a steady run finishes requests in its last step only, and only uncut).
        assert self._plan is not None and self._ends is not None
        steps, running = len(self._ends), scheduler.state.running_by_id
        finishing = sum(
            1
            for c in self._plan.chunks
            if c.emits_token
            and running[c.request_id].num_output_tokens + steps >= running[c.request_id].request.max_tokens
        )
        return scheduler.num_running + scheduler.num_waiting > finishing

    @property
    def num_in_flight(self) -> int:
        """Requests taken and not yet finished (what a router in front counts)."""
        return len(self._live)

    def num_without_first_token(self) -> int:
        """Requests taken that have no token yet (queued, or part-way through their prompt)."""
        return sum(1 for state in self._live.values() if state.first_token_s is None)

    def add_request(self, request: Request, now_s: float) -> None:
        shed, reason = self._shed, None
        if shed is not None and request.priority >= shed.min_priority:
            waiting = self.num_without_first_token() if self.fleet_waiting is None else self.fleet_waiting()
            if shed.sheds(request.priority, waiting):
                reason = shed.reason(waiting)
        if reason is None:
            reason = self.scheduler.add_request(request)
        if reason is None:
            name = request.traffic_class
            itl = None if name is None else self.class_itl.setdefault(name, ItlSamples())
            self._live[request.request_id] = _Live(request, self._num_arrived, itl)
        else:
            self.records.append(_rejected_record(request))
            self._arrival_order.append(self._num_arrived)
            # Reasons that differ only in their numbers count together, under the first
            # one's real text (a representative: "prompt (20000) + ... (8192)").
            key = self._shown.setdefault(_NUMBER.sub("N", reason), reason)
            self.rejected[key] = self.rejected.get(key, 0) + 1
        self._num_arrived += 1

    def start_step(self, now_s: float, next_arrival_s: float | None) -> float | None:
        scheduler = self.scheduler
        plan = scheduler.schedule()
        if not plan.chunks:
            # Waiting requests may wait for the blocks finished ones hold for a KV transfer.
            if scheduler.has_unfinished_requests() and not scheduler.num_held_kv:  # pragma: no cover
                raise RuntimeError("the scheduler has requests but plans nothing")
            return None
        for rid in plan.preempted_request_ids:
            self._live[rid].num_preemptions += 1
            self.num_preemptions += 1
        run = scheduler.steady_run(plan) if self._fast else SINGLE_STEP
        self._plan, self._start_s = plan, now_s
        if run.num_steps == 1:
            self._ends = self._durations = None
            drafts = self._drafts
            duration_s = self._cost_model.step_time_s(plan)
            if drafts is not None:
                duration_s += drafts.drafting_s(plan)
            end_s = now_s + duration_s
            result = StepResult(end_s - now_s) if drafts is None else drafts.result(plan, end_s - now_s)
            self._events = scheduler.update_from_output(plan, result)
            self._first_end_s = self._end_s = end_s
            self._steps = 1
            self.max_step_s = max(self.max_step_s, duration_s)
            if self._step_budget_s is not None and duration_s > self._step_budget_s:
                self.num_over += 1
            self._account()
            return end_s
        cut_s = next_arrival_s if run.ends_at_arrival else None
        self._ends, self._durations = _steady_ends(self._cost_model, plan, now_s, run.num_steps, cut_s)
        self._end_s = self._ends[-1]
        self._deferred = self._cuttable and run.ends_at_arrival
        if not self._deferred:
            self._apply_run()
        return self._end_s

    def cut(self, at_s: float) -> float | None:
        """End the steady run in flight before its first step starting at or after ``at_s`` (a
        request reaches the scheduler then); its new end, or None if it ends as planned."""
        ends, durations = self._ends, self._durations
        if not self._deferred or ends is None or durations is None:
            return None
        num = 1 + bisect_left(ends, at_s, 0, len(ends) - 1)
        if num >= len(ends):
            return None
        self._ends, self._durations = ends[:num], durations[:num]
        self._end_s = ends[num - 1]
        return self._end_s

    def _apply_run(self) -> None:
        """Apply the steady run in flight to the scheduler and count its steps."""
        ends, durations, plan = self._ends, self._durations, self._plan
        assert ends is not None and durations is not None and plan is not None
        steps = self._steps = len(ends)
        self.max_step_s = max(self.max_step_s, max(durations))
        budget_s = self._step_budget_s
        if budget_s is not None:
            self.num_over += sum(1 for d in durations if d > budget_s)
        self._first_end_s = ends[0]
        self._events = self.scheduler.update_steady(plan, steps)
        self._deferred = False
        self._account()

    def _account(self) -> None:
        plan = self._plan
        assert plan is not None
        self.busy_s += self._end_s - self._start_s
        if self.trace is not None:  # the scheduler's counts after the run, before any arrival
            _trace_row(self.trace, self.scheduler, plan, self._start_s, self._end_s, self._steps)

    def finish_step(self) -> None:
        if self._deferred:
            self._apply_run()
        plan, events, end_s = self._plan, self._events, self._end_s
        assert plan is not None and events is not None
        self.num_steps += self._steps
        self.num_plans += 1
        if self.class_itl:
            _record_class_gaps(plan, self._live, self._first_end_s, self._ends)
        _record_tokens(
            plan,
            self._live,
            self.itl,
            self._start_s,
            self._first_end_s,
            self._ends,
            events.num_accepted_drafts,
        )
        for rid, finish_reason in events.finished:
            state = self._live.pop(rid)
            self.records.append(_finished_record(rid, state, end_s, finish_reason.value))
            self._arrival_order.append(state.arrival_index)
            if self._on_finished is not None:
                self._on_finished(rid, end_s)
        self._plan = self._events = None

    def result(self, duration_s: float, stopped: bool) -> TrafficRun:
        """What the run measured, records in arrival order."""
        in_arrival_order = np.argsort(np.frombuffer(self._arrival_order, dtype=np.int64), kind="stable")
        return TrafficRun(
            records=[self.records[i] for i in in_arrival_order.tolist()],
            itl=self.itl.accumulator(),
            duration_s=duration_s,
            num_steps=self.num_steps,
            num_plans=self.num_plans,
            num_preemptions=self.num_preemptions,
            rejected_reasons=self.rejected,
            steps=self.trace,
            max_step_s=self.max_step_s,
            num_steps_over_budget=self.num_over,
            stopped=stopped,
            busy_s=self.busy_s,
            drafts=None if self._drafts is None else self._drafts.stats,
            class_itl={name: samples.accumulator() for name, samples in self.class_itl.items()},
        )


def run_traffic(
    scheduler: Scheduler,
    cost_model: SteadyCostModel,
    requests: Iterable[Request] | ArrivalQueue,
    *,
    fast: bool = True,
    keep_steps: bool = False,
    step_budget_s: float | None = None,
    stop: Callable[[], bool] | None = None,
    drafts: DraftVerifier | None = None,
    on_finished: Callable[[str, float], None] | None = None,
    tiers: TierLoads | None = None,
    shed: ShedRule | None = None,
) -> TrafficRun:
    """Run ``requests`` (ordered by ``arrival_time_s``, or an
    :class:`~stallfree.sim.driver.ArrivalQueue`) through ``scheduler`` until all are done.

    The clock starts at 0. Requests the scheduler rejects become records with finish reason
    ``rejected``. ``keep_steps`` keeps a :class:`StepTrace` (for figures and Perfetto traces).
    ``step_budget_s``: count the steps whose duration exceeds it (``num_steps_over_budget``).
    ``stop`` is asked after each plan's steps; once it returns True the run ends there (``stopped``),
    with the records of the requests finished so far and ``duration_s`` the clock at the stop.
    ``drafts``: what verifies the drafts of a scheduler that plans them (speculative decoding).
    ``on_finished(request_id, end_s)``: called as each request finishes (a queue's dependents).
    ``tiers``: KV tiers below the GPU's cache, each request first loading what they hold of it
    (:class:`~stallfree.sim.kv_tiers.TieredReplica`). ``shed``: sheddable requests refused while
    enough wait for a first token (recorded rejected, the rule's reason counted).
    """
    replica = TrafficReplica(
        scheduler,
        cost_model,
        fast=fast,
        keep_steps=keep_steps,
        step_budget_s=step_budget_s,
        drafts=drafts,
        on_finished=on_finished,
        shed=shed,
    )
    clock = SimClock()
    if tiers is None:
        stopped = drive(clock, requests, [replica], stop=stop)
        return replica.result(clock.now(), stopped)
    stopped = drive(clock, requests, [TieredReplica(replica, tiers)], stop=stop)
    run = replica.result(clock.now(), stopped)
    run.records.sort(key=_arrival_s)  # a request joins the queue once loaded: back in arrival order
    return run


def _arrival_s(record: RequestRecord) -> float:
    return record.arrival_s


def _steady_ends(
    cost_model: SteadyCostModel, plan: StepPlan, start: float, steps: int, next_arrival_s: float | None
) -> tuple[list[float], list[float]]:
    """End times and durations of the steady run's steps, the ends summed one by one from
    ``start`` like the slow path, cut before the first step that would start at or after
    ``next_arrival_s``. Lists, not arrays: a run is ~10 steps, where numpy's cost a call
    (a few µs) outweighs its speed per element."""
    wanted = steps
    if next_arrival_s is not None:
        # Durations never shrink along a steady run (contexts only grow), so the first one
        # bounds how many steps fit before the arrival; price only those (plus a margin).
        first_s = cost_model.step_time_s(plan)
        wanted = min(steps, int((next_arrival_s - start) / first_s) + 2)
    while True:
        durations: list[float] = cost_model.steady_durations(plan, wanted).tolist()
        ends = list(accumulate(durations, initial=start))
        del ends[0]
        if next_arrival_s is None:
            return ends, durations
        # Step j >= 2 starts at ends[j - 2]; it runs only if it starts before the arrival.
        num = 1 + bisect_left(ends, next_arrival_s, 0, len(ends) - 1)
        if num < wanted or wanted == steps:
            return ends[:num], durations[:num]
        wanted = min(steps, 2 * wanted)  # float rounding beat the margin: price more


def _record_tokens(
    plan: StepPlan,
    live: dict[str, _Live],
    itl: ItlSamples,
    start: float,
    first_end: float,
    ends: list[float] | None,
    accepted: Mapping[str, int],
) -> None:
    """Timestamp the tokens of one plan run once (``ends`` None) or ``len(ends)`` times; a chunk
    whose drafts were accepted got that many tokens more, all at the step's end (``accepted``)."""
    num_continuous = 0  # streams whose previous token came at the end of the previous step
    samplers: list[_Live] = []
    for chunk in plan.chunks:
        state = live[chunk.request_id]
        if state.first_scheduled_s is None:
            state.first_scheduled_s = start
            state.num_cached_tokens = chunk.num_computed_tokens  # a first chunk starts after its hit
        if not chunk.emits_token:
            continue  # a prompt chunk short of the last token: no token yet
        samplers.append(state)
        if state.num_output_tokens == 0:
            state.first_token_s = first_end
        elif state.last_token_s == start:
            num_continuous += 1
            if first_end - start > state.max_itl_s:
                state.max_itl_s = first_end - start
        else:
            gap_s = first_end - state.last_token_s
            itl.add(gap_s)
            if gap_s > state.max_itl_s:
                state.max_itl_s = gap_s
        state.num_output_tokens += 1 + accepted.get(chunk.request_id, 0) if accepted else 1
        state.last_token_s = first_end
    if num_continuous:
        itl.add(first_end - start, num_continuous)
    if ends is None or len(ends) == 1 or not samplers:
        return
    # Steps 2..k of a steady run: every sampler is a decode that got a token the step before.
    gaps_s = [b - a for a, b in pairwise(ends)]
    itl.add_many(gaps_s, len(samplers))
    longest_s = max(gaps_s)
    last_s = ends[-1]
    more = len(gaps_s)
    for state in samplers:
        state.num_output_tokens += more
        state.last_token_s = last_s
        if longest_s > state.max_itl_s:
            state.max_itl_s = longest_s


def _record_class_gaps(
    plan: StepPlan, live: dict[str, _Live], first_end: float, ends: list[float] | None
) -> None:
    """The gaps :func:`_record_tokens` is about to add, added to each request's class's samples
    too (called before it, while ``last_token_s`` is the previous token's time)."""
    samplers: dict[ItlSamples, int] = {}
    for chunk in plan.chunks:
        if not chunk.emits_token:
            continue
        state = live[chunk.request_id]
        samples = state.itl
        if samples is None:
            continue
        samplers[samples] = samplers.get(samples, 0) + 1
        if state.num_output_tokens:
            samples.add(first_end - state.last_token_s)
    if ends is not None and len(ends) > 1:
        gaps_s = [b - a for a, b in pairwise(ends)]
        for samples, count in samplers.items():
            samples.add_many(gaps_s, count)


def _finished_record(request_id: str, state: _Live, finish_s: float, reason: str) -> RequestRecord:
    return RequestRecord(
        request_id=request_id,
        arrival_s=state.arrival_s,
        first_scheduled_s=state.first_scheduled_s,
        first_token_s=state.first_token_s,
        finish_s=finish_s,
        num_prompt_tokens=state.num_prompt_tokens,
        num_output_tokens=state.num_output_tokens,
        max_itl_s=state.max_itl_s,
        num_preemptions=state.num_preemptions,
        finish_reason=reason,
        num_cached_tokens=state.num_cached_tokens,
    )


def _rejected_record(request: Request) -> RequestRecord:
    return RequestRecord(
        request_id=request.request_id,
        arrival_s=request.arrival_time_s,
        first_token_s=None,
        finish_s=request.arrival_time_s,
        num_prompt_tokens=request.num_prompt_tokens,
        num_output_tokens=0,
        finish_reason="rejected",
    )


def _trace_row(
    trace: StepTrace, scheduler: Scheduler, plan: StepPlan, start: float, end: float, steps: int
) -> None:
    num_decode = plan.num_decode_tokens
    trace.start_s.append(start)
    trace.end_s.append(end)
    trace.num_steps.append(steps)
    trace.num_decode_tokens.append(num_decode)
    trace.num_prefill_tokens.append(plan.num_tokens - num_decode)
    trace.num_running.append(scheduler.num_running)
    trace.num_waiting.append(scheduler.num_waiting)
    trace.kv_blocks_used.append(scheduler.block_manager.num_used_blocks)
