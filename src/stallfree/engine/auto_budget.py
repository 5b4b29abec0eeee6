"""The token budget a chunked engine serves with when none was given: a rule on step timings
(:func:`budget_for`, numbers in, no clock) and the timings, taken on the real model at start-up
(:func:`choose_token_budget`).

The promise is the streams': a long prompt arriving should not stall the ones decoding. While N
streams decode in d a step, a budget of B tokens gives the prompt C = B - N tokens a step. The
step with the prompt's last chunk is the streams' longest gap, kept within ``max_gap_ratio`` (~3x)
of d; the prompt, C tokens a step, pays for it in time over its time alone in one step: its price,
capped at ``max_price`` (2x). The two trade: were a prompt token to cost p wherever it ran, the
step would be d + C p, the gap (d + C p) / d, the price (d + C p) / (C p), and (gap - 1) x
(price - 1) = 1 (3x gaps: 1.5x). On a CPU a small chunk's tokens cost more than the whole prompt's,
and a late chunk's attention over the prompt's earlier tokens more than an early one's, so no line
is trusted: each candidate chunk's steps are timed, and where no candidate keeps both bounds the
price's cap wins and the start-up line says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from stallfree.core.plan import synthetic_plan
from stallfree.engine.model_runner import ModelRunner
from stallfree.engine.step_timing import plan_times

BudgetBound = Literal["streams", "prompt", "limit"]


@dataclass(frozen=True, slots=True)
class ChunkTiming:
    """The streams' decode step with a ``chunk_tokens`` prompt chunk, at the prompt's end (the
    streams' longest gap) and at its start."""

    chunk_tokens: int
    late_s: float
    first_s: float


@dataclass(frozen=True, slots=True)
class BudgetTimings:
    """What a budget is chosen from (seconds): ``num_streams`` streams' decode step (their median
    gap), a ``prompt_tokens``-token prompt alone in one step, and candidate chunks of it beside the
    streams, smallest first."""

    decode_s: float
    alone_s: float
    num_streams: int
    prompt_tokens: int
    chunks: tuple[ChunkTiming, ...]

    def __post_init__(self) -> None:
        if self.num_streams < 1 or not self.chunks:
            raise ValueError(f"need streams and chunks, got {self.num_streams} and {len(self.chunks)}")
        sizes = [c.chunk_tokens for c in self.chunks]
        if sizes != sorted(set(sizes)) or sizes[0] < 1:
            raise ValueError(f"chunk sizes must be positive and increasing, got {sizes}")
        times = [self.decode_s, self.alone_s, *(t for c in self.chunks for t in (c.late_s, c.first_s))]
        if min(times) <= 0:
            raise ValueError(f"step times must be positive, got {times}")

    def gap_ratio(self, chunk: ChunkTiming) -> float:
        return chunk.late_s / self.decode_s

    def prompt_price(self, chunk: ChunkTiming) -> float:
        """The prompt's time in ``chunk`` steps beside the streams (each about the mean of its
        first and last) over its time alone in one step."""
        steps = math.ceil(self.prompt_tokens / chunk.chunk_tokens)
        return steps * (chunk.late_s + chunk.first_s) / 2 / self.alone_s


@dataclass(frozen=True, slots=True)
class BudgetChoice:
    """A token budget, the timings it came from, its two bounds and which one set it (``limit``:
    no candidate met the one that would have; the smallest or largest chunk was taken)."""

    timings: BudgetTimings
    chunk: ChunkTiming
    max_gap_ratio: float
    max_price: float
    bound: BudgetBound

    @property
    def tokens(self) -> int:
        return self.timings.num_streams + self.chunk.chunk_tokens

    @property
    def chunk_tokens(self) -> int:
        """The prompt's share of a step while the streams decode."""
        return self.chunk.chunk_tokens

    @property
    def longest_step_s(self) -> float:
        return self.chunk.late_s

    @property
    def gap_ratio(self) -> float:
        """The streams' longest gap over their median one."""
        return self.timings.gap_ratio(self.chunk)

    @property
    def prompt_price(self) -> float:
        return self.timings.prompt_price(self.chunk)

    def reason(self) -> str:
        t = self.timings
        gap, price = f"at most {self.max_gap_ratio:g}x", f"at most {self.max_price:g}x"
        if self.bound == "streams":
            gap += ": this bound set it"
        elif self.bound == "prompt":
            price += ": this bound set it, no budget keeps both"
        return (
            f"auto: {t.num_streams} streams' decode step takes {t.decode_s * 1e3:.1f} ms here and a "
            f"{t.prompt_tokens}-token prompt alone {t.alone_s * 1e3:,.0f} ms; {self.tokens}-token steps make the "
            f"streams' longest gap {self.longest_step_s * 1e3:.0f} ms, {self.gap_ratio:.1f}x their step "
            f"({gap}), and cost the prompt ~{self.prompt_price:.2f}x its time alone ({price})"
            + ("; the budget's limit set it" if self.bound == "limit" else "")
        )


def budget_for(timings: BudgetTimings, max_gap_ratio: float = 3.0, max_price: float = 2.0) -> BudgetChoice:
    """The largest candidate chunk whose step is within ``max_gap_ratio`` of the streams' decode
    step and whose price is within ``max_price`` x the prompt's time alone. Where none is within
    the gap, the smallest (``limit``); where none within the gap is within the price, the smallest
    within the price (``prompt``), or, if none is, the largest (``limit``)."""
    if not (max_gap_ratio > 1 and max_price > 1):
        raise ValueError(f"max_gap_ratio and max_price must be above 1, got {max_gap_ratio}, {max_price}")
    t = timings
    within_gap = [c for c in t.chunks if t.gap_ratio(c) <= max_gap_ratio]
    within_price = [c for c in t.chunks if t.prompt_price(c) <= max_price]
    within_both = [c for c in within_gap if c in within_price]
    bound: BudgetBound
    if within_both:
        chunk, bound = within_both[-1], "streams"
    elif not within_gap and t.prompt_price(t.chunks[0]) <= max_price:
        chunk, bound = t.chunks[0], "limit"
    elif within_price:
        chunk, bound = within_price[0], "prompt"
    else:
        chunk, bound = t.chunks[-1], "limit"
    return BudgetChoice(t, chunk, max_gap_ratio, max_price, bound)


def chunk_ladder(low: int, high: int) -> list[int]:
    """Candidate chunk sizes from ``low`` to ``high``, about 1.4x apart: 8, 12, 16, 24, 32, 48, ...
    (the two ends included)."""
    rungs = {size for k in range(32) for size in (8 << k, 12 << k) if low <= size <= high}
    return sorted(rungs | {low, high})


def fastest_step(
    runner: ModelRunner,
    num_decodes: int,
    decode_context: int,
    chunk_tokens: int = 0,
    chunk_context: int = 0,
    repeats: int = 3,
    warmups: int = 1,
) -> float:
    """The fastest of ``repeats`` runs of a synthetic step (:func:`~stallfree.engine.step_timing.time_step`'s
    arguments): other processes only ever add time, and one such spike would move the budget."""
    plan = synthetic_plan(num_decodes, decode_context, chunk_tokens, chunk_context)
    return min(plan_times(runner, plan, repeats, warmups))


def choose_token_budget(
    runner: ModelRunner,
    num_streams: int = 8,
    prompt_tokens: int = 2048,
    max_gap_ratio: float = 3.0,
    max_price: float = 2.0,
    bounds: tuple[int, int] = (16, 2048),
    context: int = 16,
) -> BudgetChoice:
    """:func:`budget_for` this machine, timed on an idle ``runner``: ``num_streams`` decodes at
    ``context`` tokens of context; a ``prompt_tokens``-token prompt in one step (within the model's
    and the cache's room); and, up the :func:`chunk_ladder` of budgets within ``bounds``, the
    decodes with a chunk at the prompt's end and at its start, until a chunk's step is past the
    gap's bound and its price within the cap (larger chunks can only lengthen the gap). On a CPU
    that is a few small chunks (SmolLM2 on a 2-core Zen 4: up to 32 tokens); on a GPU a chunk is
    free up to the ridge and the ladder climbs a few ridges out, to hundreds of tokens."""
    cache = runner.kv_cache
    room = cache.num_blocks * cache.block_size - num_streams * (context + cache.block_size)
    prompt = min(prompt_tokens, runner.model.spec.max_position_embeddings, room)
    low, high = max(bounds[0], num_streams + 1) - num_streams, min(bounds[1] - num_streams, prompt)
    if low > high:
        raise ValueError(f"bounds {bounds} leave no chunk beside {num_streams} streams in {prompt} tokens")
    decode_s = fastest_step(runner, num_streams, context)
    # seconds on a CPU, and no slower the first time: no warm-up
    alone_s = fastest_step(runner, 0, 0, chunk_tokens=prompt, repeats=2, warmups=0)
    chunks: list[ChunkTiming] = []
    for size in chunk_ladder(low, high):
        late_s = fastest_step(runner, num_streams, context, chunk_tokens=size, chunk_context=prompt - size)
        first_s = fastest_step(runner, num_streams, context, chunk_tokens=size)
        chunks.append(ChunkTiming(size, late_s, first_s))
        timings = BudgetTimings(decode_s, alone_s, num_streams, prompt, tuple(chunks))
        if late_s > max_gap_ratio * decode_s and timings.prompt_price(chunks[-1]) <= max_price:
            break
    return budget_for(timings, max_gap_ratio, max_price)
