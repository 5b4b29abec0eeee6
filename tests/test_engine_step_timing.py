"""Synthetic step timing on the real model (no timing assertions: only shape and hygiene)."""

from __future__ import annotations

import pytest
import torch

from stallfree.core import SamplingParams
from stallfree.engine import LLMEngine
from stallfree.engine.step_timing import measure_ridge, time_step


@pytest.fixture
def engine() -> LLMEngine:
    return LLMEngine("random:tiny", dtype="float32", device="cpu", num_blocks=64, block_size=16)


def test_time_step_runs_and_leaves_the_runner_idle(engine: LLMEngine) -> None:
    assert time_step(engine.model_runner, num_decodes=4, decode_context=40, chunk_tokens=32, repeats=2) > 0
    assert engine.model_runner.block_tables == {}
    # The engine still generates normally afterwards (synthetic K/V never leaks into requests).
    out = engine.add_request(prompt="Hello", sampling_params=SamplingParams(max_tokens=3, temperature=0))
    while engine.has_unfinished_requests():
        engine.step()
    assert out


def test_measure_ridge_reports_increasing_chunk_sizes(engine: LLMEngine) -> None:
    decode_s, points = measure_ridge(
        engine.model_runner, num_decodes=2, decode_context=20, chunk_sizes=(32, 8, 16)
    )
    assert decode_s > 0
    sizes = [p.chunk_tokens for p in points]
    assert sizes == sorted(sizes) and sizes[0] == 8
    assert all(p.ratio_to_decode == pytest.approx(p.step_s / decode_s) for p in points)


def test_synthetic_steps_refuse_a_busy_runner_or_a_small_cache(engine: LLMEngine) -> None:
    engine.add_request(prompt="Hello", sampling_params=SamplingParams(max_tokens=5))
    engine.step()
    with pytest.raises(ValueError, match="idle"):
        time_step(engine.model_runner, 1, 10)
    idle = LLMEngine("random:tiny", dtype="float32", num_blocks=4, block_size=16)
    with pytest.raises(ValueError, match="KV blocks"):
        time_step(idle.model_runner, num_decodes=8, decode_context=100)
    assert torch.is_grad_enabled()  # inference mode never leaks out of the runner


def test_the_engine_measures_its_budget_only_when_none_was_given() -> None:
    auto = LLMEngine("random:tiny", dtype="float32", device="cpu", num_blocks=64, auto_token_budget=True)
    assert auto.budget_choice is not None
    assert auto.serving.max_num_batched_tokens == auto.budget_choice.tokens
    assert 16 <= auto.budget_choice.tokens <= 2048 and auto.budget_choice.timings.decode_s > 0
    assert "auto:" in auto.describe_budget()
    asked = LLMEngine(
        "random:tiny", dtype="float32", device="cpu", num_blocks=64, auto_token_budget=True, token_budget=32
    )
    assert asked.budget_choice is None and asked.describe_budget() == "chunked, token budget 32 (asked)"
    whole = LLMEngine(
        "random:tiny",
        dtype="float32",
        device="cpu",
        num_blocks=64,
        auto_token_budget=True,
        policy="prefill-first",
    )
    assert whole.budget_choice is None and whole.describe_budget() == "prefill-first"
