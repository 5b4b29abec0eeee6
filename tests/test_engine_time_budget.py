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
    assert max(prefill) <= 40  # the predictor's 5 ms held 40 prompt tokens a step
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
