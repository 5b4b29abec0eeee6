"""Time synthetic steps on the real model: any plan, decode batches, with or without a prompt chunk.

For measurements that need no requests: the cost of a pure decode step, of a mixed step
(decodes + one chunk), and the *ridge* — the largest chunk a step can carry while costing
at most ``tolerance`` x a pure decode step (the chunk size stall-free batching should use
on this machine). Synthetic steps write garbage K/V into the cache, so they run only on an
idle runner (no live block tables) and leave none behind.

:mod:`stallfree.engine.auto_budget` chooses the CPU's default token budget from such steps.

:mod:`stallfree.engine.profiler` builds profiles from these.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from stallfree.core import ScheduledChunk, StepPlan
from stallfree.core.config import ceil_div
from stallfree.core.plan import synthetic_plan
from stallfree.engine.drafts import DraftCost
from stallfree.engine.model_runner import ModelRunner


@dataclass(frozen=True, slots=True)
class RidgePoint:
    chunk_tokens: int
    step_s: float
    ratio_to_decode: float


def time_step(
    runner: ModelRunner,
    num_decodes: int,
    decode_context: int,
    chunk_tokens: int = 0,
    chunk_context: int = 0,
    repeats: int = 3,
) -> float:
    """Median wall time of one step: ``num_decodes`` decodes at ``decode_context`` tokens of
    context, plus (if ``chunk_tokens``) one prompt chunk after ``chunk_context`` computed tokens."""
    return time_plan(
        runner, synthetic_plan(num_decodes, decode_context, chunk_tokens, chunk_context), repeats
    )


def time_plan(runner: ModelRunner, plan: StepPlan, repeats: int = 3) -> float:
    """Median wall time of running ``plan`` (after one warm-up run) on an idle ``runner``.

    Every chunk gets KV blocks for its whole context, filled with garbage; none are left behind.
    """
    return statistics.median(plan_times(runner, plan, repeats))


def plan_times(runner: ModelRunner, plan: StepPlan, repeats: int = 3, warmups: int = 1) -> list[float]:
    """Wall time of each of ``repeats`` runs of ``plan`` after ``warmups`` unmeasured ones
    (see :func:`time_plan`); plans from a real scheduler work too (ids past the context are
    known but not run)."""
    if runner.block_tables:
        raise ValueError("synthetic steps need an idle runner (requests hold KV blocks)")
    if repeats <= 0:
        raise ValueError(f"repeats must be positive, got {repeats}")
    block_size = runner.kv_cache.block_size
    needed = {c.request_id: ceil_div(c.context_len, block_size) for c in plan.chunks}
    if sum(needed.values()) > runner.kv_cache.num_blocks:
        raise ValueError(
            f"the step needs {sum(needed.values())} KV blocks; the cache has {runner.kv_cache.num_blocks}"
        )
    next_block = 0
    for rid, count in needed.items():
        runner.block_tables[rid] = list(range(next_block, next_block + count))
        next_block += count
    # ids for every known token, and for the drafts a chunk verifies past them
    token_ids = {c.request_id: [3] * max(c.num_known_tokens, c.context_len) for c in plan.chunks}
    try:
        for _ in range(warmups):
            runner.execute(plan, token_ids)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            _, logits = runner.execute(plan, token_ids)
            if logits.is_cuda:
                torch.cuda.synchronize(logits.device)
            times.append(time.perf_counter() - start)
    finally:
        runner.reset()
    return times


def measure_ridge(
    runner: ModelRunner,
    num_decodes: int,
    decode_context: int,
    chunk_sizes: Sequence[int] = (8, 16, 32, 64, 128, 256, 512),
    tolerance: float = 1.2,
    chunk_context: int = 0,
) -> tuple[float, list[RidgePoint]]:
    """Pure-decode step time and, per chunk size, the mixed step's time and its ratio to it.

    The ridge is the largest ``chunk_tokens`` whose ratio is ``<= tolerance``; sizes are
    measured in increasing order and measuring stops at the first one past the tolerance.
    ``chunk_context`` is the chunk's earlier prompt tokens (0: a new prompt's first chunk).
    """
    decode_s = time_step(runner, num_decodes, decode_context)
    points = []
    for size in sorted(chunk_sizes):
        step_s = time_step(
            runner, num_decodes, decode_context, chunk_tokens=size, chunk_context=chunk_context
        )
        points.append(RidgePoint(size, step_s, step_s / decode_s))
        if step_s / decode_s > tolerance:
            break
    return decode_s, points


def measure_draft_cost(runner: ModelRunner, num_drafts: int, context: int = 128) -> DraftCost:
    """A one-row decode step and one verifying ``num_drafts`` drafts (``1 + num_drafts`` rows), timed
    on an idle ``runner`` at ``context`` tokens: what a draft costs here (:class:`DraftCost`)."""
    one = synthetic_plan(1, context)
    verify = StepPlan(
        (ScheduledChunk("verify", context, 1 + num_drafts, context + 1, num_draft_tokens=num_drafts),)
    )
    step_s = time_plan(runner, one, repeats=5)
    row_s = max(0.0, (time_plan(runner, verify, repeats=5) - step_s) / num_drafts)
    return DraftCost(step_s, row_s)
