"""The default token budget: the rule on numbers (no clock), and its timings through a fake step clock."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from stallfree.engine import auto_budget
from stallfree.engine.auto_budget import (
    BudgetTimings,
    ChunkTiming,
    budget_for,
    choose_token_budget,
    chunk_ladder,
)


def _even(decode_s: float, token_s: float, num_streams: int = 8, prompt: int = 2048) -> BudgetTimings:
    """Timings where a step costs ``decode_s`` and a prompt token adds ``token_s`` to it wherever it
    runs, on the ladder's chunks."""
    chunks = tuple(
        ChunkTiming(c, decode_s + c * token_s, decode_s + c * token_s)
        for c in chunk_ladder(1, 2048 - num_streams)
    )
    return BudgetTimings(decode_s, decode_s + prompt * token_s, num_streams, prompt, chunks)


def test_the_streams_bound_sets_the_budget_and_the_prompt_pays_its_price() -> None:
    """Issue 52's AVX2 EPYC: 8 streams decode in 43 ms, a prompt token adds 2.22 ms. 32-token
    chunks make the longest gap 2.65x (48: 3.5x); the prompt pays 1.59x."""
    choice = budget_for(_even(0.043, 0.00222))
    assert choice.chunk_tokens == 32 and choice.tokens == 40 and choice.bound == "streams"
    assert choice.longest_step_s == pytest.approx(0.043 + 32 * 0.00222)
    assert choice.gap_ratio == pytest.approx(1 + 32 * 0.00222 / 0.043)
    assert choice.prompt_price == pytest.approx(64 * (0.043 + 32 * 0.00222) / (0.043 + 2048 * 0.00222))
    reason = choice.reason()
    assert "40-token steps" in reason and "8 streams' decode step takes 43.0 ms" in reason
    assert "2.7x their step (at most 3x: this bound set it)" in reason
    assert "~1.59x its time alone (at most 2x)" in reason and "2048-token prompt alone 4,590 ms" in reason


@pytest.mark.parametrize(("decode_s", "token_s"), [(0.043, 0.00222), (0.012, 0.0006), (0.02, 4e-5)])
def test_where_a_token_costs_the_same_everywhere_both_bounds_hold(decode_s: float, token_s: float) -> None:
    """Then (gap - 1) x (price - 1) is about 1: gaps within 3x cost the prompt about 1.5x, never 2x;
    the budget is the largest candidate within the gap."""
    timings = _even(decode_s, token_s, num_streams=4)
    choice = budget_for(timings)
    assert choice.bound == "streams" and choice.gap_ratio <= 3 and choice.prompt_price < 2
    larger = [c for c in timings.chunks if c.chunk_tokens > choice.chunk_tokens]
    assert not larger or timings.gap_ratio(larger[0]) > 3


def test_the_prompts_cap_wins_where_small_chunks_cost_too_much() -> None:
    """A 2-core Zen 4's SmolLM2 (ms): 16-token chunks keep the gap near 3x but cost the prompt 2.07x
    its 2.17 s alone; the smallest chunk within 2x (24) wins, its gap 3.6x."""
    chunks = (ChunkTiming(8, 0.030, 0.020), ChunkTiming(16, 0.0442, 0.0261), ChunkTiming(24, 0.052, 0.030))
    choice = budget_for(BudgetTimings(0.0145, 2.17, 8, 2048, chunks))
    assert choice.bound == "prompt" and choice.chunk_tokens == 24 and choice.tokens == 32
    assert choice.prompt_price <= 2 < 3 < choice.gap_ratio
    assert "(at most 2x: this bound set it, no budget keeps both)" in choice.reason()
    assert "3.6x their step (at most 3x)" in choice.reason()


def test_where_no_candidate_meets_a_bound_the_limit_says_so() -> None:
    # even the smallest chunk makes gaps past 3x, at a fair price: the smallest
    steep = budget_for(
        BudgetTimings(0.010, 10.0, 8, 2048, (ChunkTiming(8, 0.040, 0.030), ChunkTiming(16, 0.06, 0.05)))
    )
    assert (
        steep.chunk_tokens == 8 and steep.bound == "limit" and "the budget's limit set it" in steep.reason()
    )
    # no chunk within the price: the largest
    dear = budget_for(
        BudgetTimings(0.010, 0.1, 8, 2048, (ChunkTiming(8, 0.02, 0.02), ChunkTiming(16, 0.04, 0.03)))
    )
    assert dear.chunk_tokens == 16 and dear.bound == "limit"
    # tokens nearly free (a launch-bound GPU step): the largest, within both
    free = budget_for(_even(0.005, 1e-7))
    assert free.tokens == 2048 and free.bound == "streams"


def test_timings_are_checked() -> None:
    chunk = ChunkTiming(8, 0.02, 0.02)
    with pytest.raises(ValueError, match="above 1"):
        budget_for(BudgetTimings(0.01, 1.0, 8, 2048, (chunk,)), max_price=1.0)
    with pytest.raises(ValueError, match="positive"):
        BudgetTimings(0.0, 1.0, 8, 2048, (chunk,))
    with pytest.raises(ValueError, match="increasing"):
        BudgetTimings(0.01, 1.0, 8, 2048, (chunk, chunk))
    with pytest.raises(ValueError, match="need streams"):
        BudgetTimings(0.01, 1.0, 8, 2048, ())


def test_the_ladder_climbs_about_1_4x_a_rung_and_keeps_its_ends() -> None:
    assert chunk_ladder(8, 100) == [8, 12, 16, 24, 32, 48, 64, 96, 100]
    assert chunk_ladder(5, 20) == [5, 8, 12, 16, 20]
    assert chunk_ladder(30, 30) == [30]


def _fake_clock(
    monkeypatch: pytest.MonkeyPatch, step_s: Callable[[int, int, int], float]
) -> tuple[Any, list[tuple[int, int, int]]]:
    """A runner with room for 4,096 tokens beside 8 streams, and ``fastest_step`` as ``step_s(decodes,
    chunk tokens, earlier tokens)``; returns the runner and each step timed."""
    asked: list[tuple[int, int, int]] = []

    def fake_step(
        runner: object,
        num_decodes: int,
        context: int,
        chunk_tokens: int = 0,
        chunk_context: int = 0,
        repeats: int = 3,
        warmups: int = 1,
    ) -> float:
        asked.append((num_decodes, chunk_tokens, chunk_context))
        return step_s(num_decodes, chunk_tokens, chunk_context)

    monkeypatch.setattr(auto_budget, "fastest_step", fake_step)
    runner = SimpleNamespace(
        model=SimpleNamespace(spec=SimpleNamespace(max_position_embeddings=8192)),
        kv_cache=SimpleNamespace(num_blocks=256 + 16, block_size=16),
    )
    return runner, asked


def _cpu_step(decodes: int, chunk: int, earlier: int) -> float:
    """10 ms, 0.6 ms a row, and each chunk token's attention 0.6 us per token before it."""
    return 0.010 + 0.0006 * (decodes + chunk) + 0.6e-6 * chunk * (earlier + chunk / 2)


def test_a_cpu_budget_times_its_candidates_until_the_gap_is_past_and_the_price_within(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runner, asked = _fake_clock(monkeypatch, _cpu_step)
    choice = choose_token_budget(runner)
    assert asked[:2] == [(8, 0, 0), (0, 2048, 0)]  # the decode step, the prompt alone
    sizes = [c.chunk_tokens for c in choice.timings.chunks]
    assert asked[2:] == [step for c in sizes for step in ((8, c, 2048 - c), (8, c, 0))]
    last = choice.timings.chunks[-1]
    assert choice.timings.gap_ratio(last) > 3 >= choice.gap_ratio and choice.bound == "streams"
    assert choice.longest_step_s == pytest.approx(
        _cpu_step(8, choice.chunk_tokens, 2048 - choice.chunk_tokens)
    )
    choose_token_budget(runner, prompt_tokens=10_000)
    assert (0, 4096, 0) in asked  # the prompt alone, within the cache


def test_a_gpu_budget_lands_a_few_ridges_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """A roofline step: 20 ms reading the weights, tokens free up to a 300-token ridge, then compute."""

    def roofline(decodes: int, chunk: int, earlier: int) -> float:
        return max(0.020, (decodes + chunk) * 0.020 / 300)

    runner, _ = _fake_clock(monkeypatch, roofline)
    choice = choose_token_budget(runner)
    assert choice.bound == "streams" and 300 < choice.tokens < 1024
    assert choice.gap_ratio <= 3 and choice.prompt_price < 1.3


def test_a_noisy_candidate_past_the_price_does_not_hide_one_within_both() -> None:
    """Timings on a shared machine need not be monotone: the largest chunk within both bounds wins."""
    chunks = (ChunkTiming(16, 0.020, 0.016), ChunkTiming(24, 0.028, 0.036))  # prices 1.77x, 2.12x
    choice = budget_for(BudgetTimings(0.010, 1.3, 8, 2048, chunks))
    assert choice.chunk_tokens == 16 and choice.bound == "streams"
