"""The engine with a step-time target: the predictor comes from outside (a measured profile);
greedy tokens do not depend on how prompts are chunked; real steps are compared with the target."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stallfree.cli import main
from stallfree.core import ChunkedPolicy, SamplingParams, StepPlan
from stallfree.core.serving import ServingConfig

torch = pytest.importorskip("torch")

from stallfree.engine import LLMEngine  # noqa: E402

GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
PROMPTS = ["kalo mefi tu ba " * 8, "Hello there", "the quick brown fox jumps over"]


def tokens_per_step(plan: StepPlan) -> float:
    """A predictor: 1 ms a step + 0.1 ms a prompt token, so a 5 ms target holds 40 prompt tokens."""
    return 1e-3 + 1e-4 * plan.num_prefill_tokens


def _run(engine: LLMEngine) -> tuple[list[list[int]], list[int]]:
    ids = [engine.add_request(prompt=p, sampling_params=GREEDY) for p in PROMPTS]
    tokens: dict[str, list[int]] = {}
    prefill: list[int] = []
    while engine.has_unfinished_requests():
        out = engine.step()
        if out.step is not None:
            prefill.append(out.step.plan.num_prefill_tokens)
        for o in out.outputs:
            tokens[o.request_id] = list(o.token_ids)
    return [tokens[i] for i in ids], prefill


def test_time_budgeted_steps_give_the_same_greedy_tokens_and_are_counted() -> None:
    common = {"dtype": "float32", "device": "cpu"}
    timed = LLMEngine(
        "random:tiny",
        serving=ServingConfig(step_budget_ms=5, num_blocks=64),
        step_time_predictor=tokens_per_step,
        **common,
    )
    assert isinstance(timed.scheduler.policy, ChunkedPolicy) and timed.scheduler.policy.step_budget_s == 0.005
    fixed = LLMEngine(
        "random:tiny", serving=ServingConfig(max_num_batched_tokens=512, num_blocks=64), **common
    )
    timed_tokens, prefill = _run(timed)
    fixed_tokens, _ = _run(fixed)
    assert timed_tokens == fixed_tokens
    # the predictor's 5 ms held 40 prompt tokens in the first step (later ones follow the
    # machine's speed: CalibratedPredictor)
    assert prefill[0] <= 40
    stats = timed.step_budget_stats
    assert stats is not None and stats.num_steps == len(prefill) and stats.max_step_s > 0
    assert 0 <= stats.num_steps_over_budget <= stats.num_steps and stats.mean_prediction_error >= 0
    assert fixed.step_budget_stats is None


def test_a_step_budget_without_a_predictor_is_refused() -> None:
    with pytest.raises(ValueError, match="needs a step-time predictor"):
        LLMEngine("random:tiny", serving=ServingConfig(step_budget_ms=5, num_blocks=64), dtype="float32")


def test_generate_step_budget_needs_a_profile_and_runs_with_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["generate", "--model", "random:tiny", "--dtype", "float32", "--num-blocks", "64"]
    argv += ["--prompt", "Hello", "--max-tokens", "3", "--temperature", "0", "--step-budget-ms", "40"]
    assert main(argv) == 2
    assert "--step-budget-ms needs --profile FILE" in capsys.readouterr().err
    from stallfree.specs.step_profile import save_profile
    from tests.test_profile_measured import synthetic_profile

    path = save_profile(synthetic_profile(), tmp_path / "p.json")
    assert main([*argv, "--profile", str(path), "--json"]) == 0
    record = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert len(record["token_ids"]) == 3


def test_serve_step_budget_needs_a_profile(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["serve", "--model", "random:tiny", "--port", "0", "--step-budget-ms", "40"]
    assert main(argv) == 2
    assert "--step-budget-ms needs --profile FILE" in capsys.readouterr().err


def test_the_calibrated_predictor_follows_the_measured_ratio() -> None:
    from stallfree.engine.engine import CalibratedPredictor

    plan = StepPlan(())
    predictor = CalibratedPredictor(lambda _plan: 0.010, weight=0.5)
    assert predictor(plan) == 0.010
    for _ in range(20):
        predictor.observe(plan, 0.020)  # the machine runs twice as slow as profiled
    assert predictor.scale == pytest.approx(2.0, rel=1e-4) and predictor(plan) == pytest.approx(
        0.020, rel=1e-4
    )
    for _ in range(20):
        predictor.observe(plan, 1.0)  # a 100x outlier counts as 4x at most
    assert predictor.scale == pytest.approx(4.0, rel=1e-4)
    with pytest.raises(ValueError, match="weight"):
        CalibratedPredictor(lambda _plan: 0.01, weight=0)


def test_the_engine_scales_a_predictor_that_is_too_optimistic() -> None:
    """A profile 1,000x too fast: the first step plans by it, later ones by the measured ratio."""
    engine = LLMEngine(
        "random:tiny",
        serving=ServingConfig(step_budget_ms=5, num_blocks=64),
        step_time_predictor=lambda plan: tokens_per_step(plan) / 1000,
        dtype="float32",
        device="cpu",
    )
    _run(engine)
    assert engine.predictor is not None and engine.predictor.scale > 2
