"""Builders every scheduler and simulator test shares: one way to make a scheduler, requests,
and the one-second clock the hand-worked timelines use."""

from __future__ import annotations

import numpy as np

from stallfree.core import (
    CacheConfig,
    Policy,
    Request,
    Scheduler,
    SchedulerConfig,
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
    **policy_kw: int,
) -> Scheduler:
    """A scheduler over an unbounded KV cache unless ``num_blocks`` is given."""
    if isinstance(policy, str):
        policy = make_policy(policy, **policy_kw)
    elif policy_kw:
        raise TypeError("policy options go with a policy name, not a Policy")
    return Scheduler(
        SchedulerConfig(max_num_seqs=max_num_seqs, max_model_len=max_model_len),
        CacheConfig(block_size=block_size, num_blocks=num_blocks, watermark=watermark),
        policy,
    )


def make_requests(
    n: int, prompt_tokens: int = 4, max_tokens: int = 3, *, gap_s: float = 0.0, prefix: str = "r"
) -> list[Request]:
    """``n`` equal requests ``r0``, ``r1``, ... arriving ``gap_s`` apart from 0 s."""
    return [Request(f"{prefix}{i}", prompt_tokens, max_tokens, i * gap_s) for i in range(n)]


def one_second(plan: StepPlan) -> StepResult:
    """An executor whose every step takes exactly one second."""
    return StepResult(duration_s=1.0)


class OneSecondCosts:
    """:func:`one_second` as a cost model, with the traffic driver's fast path."""

    def step_time_s(self, plan: StepPlan) -> float:
        return 1.0

    def steady_durations(self, plan: StepPlan, num_steps: int) -> np.ndarray:  # type: ignore[type-arg]
        return np.ones(num_steps)
