"""Builders every scheduler and simulator test shares: one way to make a scheduler, the
one-second clock the hand-worked timelines use, and a step-counter replay with its checks."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from stallfree.core import (
    CacheConfig,
    Policy,
    Request,
    ScheduledChunk,
    Scheduler,
    SchedulerConfig,
    StepEvents,
    StepPlan,
    StepResult,
    make_policy,
)


def make_scheduler(
    policy: str | Policy = "chunked",
    *,
    max_num_seqs: int = 256,
    max_model_len: int | None = None,
    block_size: int = 16,
    num_blocks: int | None = None,
    watermark: float = 0.01,
    scheduling_policy: str = "fcfs",
    **policy_kw: int,
) -> Scheduler:
    """A scheduler over an unbounded KV cache unless ``num_blocks`` is given."""
    if isinstance(policy, str):
        policy = make_policy(policy, **policy_kw)
    elif policy_kw:
        raise TypeError("policy options go with a policy name, not a Policy")
    return Scheduler(
        SchedulerConfig(
            max_num_seqs=max_num_seqs, max_model_len=max_model_len, scheduling_policy=scheduling_policy
        ),
        CacheConfig(block_size=block_size, num_blocks=num_blocks, watermark=watermark),
        policy,
    )


def one_second(plan: StepPlan) -> StepResult:
    """An executor whose every step takes exactly one second."""
    return StepResult(duration_s=1.0)


class OneSecondCosts:
    """:func:`one_second` as a cost model, with the traffic driver's fast path."""

    def step_time_s(self, plan: StepPlan) -> float:
        return 1.0

    def steady_durations(self, plan: StepPlan, num_steps: int) -> np.ndarray:  # type: ignore[type-arg]
        return np.ones(num_steps)


def run_on_step_counter(
    sched: Scheduler,
    requests: list[Request],
    on_plan: Callable[[StepPlan, set[str]], None],
    *,
    max_steps: int = 10_000,
    executor: Callable[[StepPlan], StepResult] = one_second,
) -> tuple[list[StepEvents], dict[str, str]]:
    """Replay arrivals on a step counter (every step takes 1 s) until nothing is left.

    ``on_plan(plan, decoding)`` sees each plan before it runs, with the ids that were decoding
    when it was scheduled. Returns every step's events and the rejected requests' reasons.
    ``executor`` gives each step's result (its duration is not read).
    """
    pending = sorted(requests, key=lambda r: r.arrival_time_s)
    rejected: dict[str, str] = {}
    events: list[StepEvents] = []
    clock = 0.0
    for _ in range(max_steps):
        while pending and pending[0].arrival_time_s <= clock:
            r = pending.pop(0)
            if (why := sched.add_request(r)) is not None:
                rejected[r.request_id] = why
        decoding = {s.request_id for s in sched.running if s.is_decoding}
        plan = sched.schedule()
        if plan.is_empty:
            if not pending:
                return events, rejected
            clock = pending[0].arrival_time_s
            continue
        plan.validate()
        on_plan(plan, decoding)
        events.append(sched.update_from_output(plan, executor(plan)))
        clock += 1.0
    raise AssertionError("scheduler did not finish")


def assert_stall_free(plan: StepPlan, decoding: set[str]) -> None:
    """Every request that was decoding gets exactly one token, besides any drafts it verifies
    (unless the plan preempted it)."""
    scheduled = {c.request_id: c.num_tokens - c.num_draft_tokens for c in plan.chunks}
    for rid in decoding:
        assert scheduled.get(rid) == 1 or rid in plan.preempted_request_ids


def shifted_plans(plan: StepPlan, num_steps: int) -> list[StepPlan]:
    """``plan`` and the ``num_steps - 1`` steps of a steady run after it: every chunk ``j`` steps on
    (what a cost model's ``steady_durations`` prices at once)."""
    return [
        StepPlan(
            tuple(
                ScheduledChunk(
                    c.request_id,
                    c.num_computed_tokens + c.num_tokens * j,
                    c.num_tokens,
                    c.num_known_tokens + c.num_tokens * j,
                    c.after_cache_hit and j == 0,
                    c.num_draft_tokens,
                )
                for c in plan.chunks
            )
        )
        for j in range(num_steps)
    ]
