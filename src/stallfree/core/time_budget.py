"""Prompt chunks sized by time: fill a step with prompt tokens up to a step-time target.

A fixed token budget bounds a step's tokens, not its time: attention over a prompt's earlier
chunks makes each later chunk of the same size cost more. The chunked policy's time budget
(:class:`~stallfree.core.policy.ChunkedPolicy` with ``step_budget_s``) calls
:func:`fill_prompts_by_time` once the decodes are in. The step's time comes from a
:data:`StepTimePredictor`, a plain function ``StepPlan -> seconds`` that whoever builds the
scheduler passes in (the simulator its cost model's ``step_time_s``, the engine a measured
profile's); the core never reads a clock.

The rules, in order:

- prompts go oldest first: part-way ones (and recomputes) in admission order, then waiting ones
  first come first served; the first prompt that gets less than it has left ends the step's
  filling, so a younger prompt never overtakes one that did not fit;
- each gets the largest chunk whose predicted step (the exact plan so far: every decode with its
  context, every earlier chunk, this chunk after its own earlier context, via
  :meth:`StepContext.preview`) stays within the target. Its whole rest is tried first, so a last
  piece of any size is taken whenever it fits (SGLang merges a small last piece; here only within
  the target). Otherwise the size is a multiple of :data:`CHUNK_GRANULE` found by binary search,
  which assumes the predictor grows with the chunk (a predictor that does not may get a smaller
  chunk than the largest that fits, never one that does not fit);
- starvation guard: the step's first prompt always advances by at least
  :data:`MIN_CHUNK_TOKENS` (or what it has left), even past the target, so every prompt finishes
  however long the decodes take;
- a token cap (``token_cap``: the tokens the step may still take) is never exceeded, not even by
  the guard.

Invariants: a step's predicted time exceeds the target only through its decodes (never skipped:
the stall-free property) or the guard's one chunk of at most :data:`MIN_CHUNK_TOKENS` tokens;
predictor calls per step are at most ``2 + log2(cap / CHUNK_GRANULE)`` for the prompt that ends
the filling, plus one for each prompt scheduled whole, plus one when the guard fires.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from stallfree.core.context import StepContext
from stallfree.core.plan import StepPlan
from stallfree.core.state import Sequence

StepTimePredictor = Callable[[StepPlan], float]
"""Predicted duration of a plan, in seconds (a cost model's ``step_time_s``)."""

MIN_CHUNK_TOKENS = 16
"""The starvation guard's chunk: the step's first prompt advances by at least this many tokens."""

CHUNK_GRANULE = 16
"""Chunk sizes below a prompt's rest are multiples of this (fewer predictor calls; chunks end on
16-token KV-block and kernel-tile boundaries)."""


@dataclass(frozen=True, slots=True)
class TimeFill:
    """What :func:`fill_prompts_by_time` did in one step.

    ``guarded``: the first prompt got the guard's minimum chunk because no larger chunk fit;
    ``decodes_over``: (checked only then) the decodes alone were predicted over the target.
    """

    num_prompt_tokens: int
    guarded: bool
    decodes_over: bool


def fill_prompts_by_time(
    ctx: StepContext, predictor: StepTimePredictor, target_s: float, token_cap: int | None
) -> TimeFill:
    """Schedule prompt chunks into ``ctx`` (decodes already in) under ``target_s`` (see module doc)."""
    total = 0
    first = True
    guarded = decodes_over = False
    for seq in _prompts(ctx):
        left = ctx.num_tokens_to_run(seq)
        cap = left if token_cap is None else min(left, token_cap - total)
        if cap <= 0:
            break
        num_tokens = largest_chunk(ctx, seq, cap, predictor, target_s)
        if first and num_tokens < min(MIN_CHUNK_TOKENS, cap):
            num_tokens = min(MIN_CHUNK_TOKENS, cap)
            guarded = True
            decodes_over = predictor(ctx.preview()) > target_s
        if num_tokens == 0:
            break
        if ctx.is_running(seq):
            scheduled = ctx.schedule_running(seq, num_tokens, preempt=False)
        else:
            scheduled = ctx.admit(num_tokens)
        total += scheduled
        first = False
        if scheduled < left:
            break
    return TimeFill(total, guarded, decodes_over)


def largest_chunk(
    ctx: StepContext, seq: Sequence, cap: int, predictor: StepTimePredictor, target_s: float
) -> int:
    """The largest chunk of ``seq``, at most ``cap`` tokens, whose predicted step fits ``target_s``:
    ``cap`` itself if it fits, else a multiple of :data:`CHUNK_GRANULE` (0: none fits)."""
    if predictor(ctx.preview(seq, cap)) <= target_s:
        return cap
    low, high = 0, (cap - 1) // CHUNK_GRANULE  # granules: low always fits (0 tokens), cap does not
    while low < high:
        mid = (low + high + 1) // 2
        if predictor(ctx.preview(seq, mid * CHUNK_GRANULE)) <= target_s:
            low = mid
        else:
            high = mid - 1
    return low * CHUNK_GRANULE


def _prompts(ctx: StepContext) -> Iterator[Sequence]:
    """Part-way prompts in admission order, then the waiting queue's head, again and again as
    each is admitted (the queue is read live: an admitted head leaves it)."""
    for seq in ctx.running:
        if not seq.is_decoding and ctx.is_running(seq) and not ctx.is_scheduled(seq):
            yield seq
    while ctx.waiting:
        head = ctx.waiting[0]
        yield head
        if ctx.waiting and ctx.waiting[0] is head:
            return  # not admitted: nothing behind it may overtake it
