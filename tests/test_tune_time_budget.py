"""``stallfree tune --step-budgets-ms``: chunked candidates sized by time beside the fixed budgets."""

from __future__ import annotations

import json

import pytest

from stallfree.cli import main
from stallfree.tune.trial import TrialSpec

SMALL = ["--lengths", "fixed:768,32", "--num-requests", "150", "--workers", "1", "--no-progress"]


def test_time_budgets_are_searched_and_compared_with_the_best_fixed_budget(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["tune", *SMALL, "--policy", "chunked", "--budgets", "256,1024", "--slo-tbt-p99-ms", "60"]
    assert main([*argv, "--step-budgets-ms", "30,60", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    tb = out["time_budget"]
    assert [p["step_budget_ms"] for p in tb["curve"]] == [30.0, 60.0]
    assert all(p["token_cap"] == 16384 for p in tb["curve"])
    assert tb["best_step_budget_ms"] in (30.0, 60.0) and tb["capacity_qps"] > 0
    assert tb["best_fixed_capacity_qps"] == out["policies"]["chunked"]["capacity_qps"]
    # the fixed curve keeps its shape: time candidates are listed apart
    assert [p["token_budget"] for p in out["policies"]["chunked"]["curve"]] == [256, 1024]
    commands = tb["commands"]
    assert f"--max-num-batched-tokens {tb['closest_fixed_budget']}" in commands["vllm"]
    assert "--step-budget-ms" in commands["stallfree"] and "time" in commands["cannot_express"]
    timed = [t for t in out["trials"] if t["step_budget_ms"] is not None]
    assert timed and all(t["token_budget"] == 16384 for t in timed)
    assert main([*argv, "--step-budgets-ms", "auto"]) == 0
    table = capsys.readouterr().out
    assert "chunks sized by time" in table and "30 ms" in table and "what they cannot express" in table


def test_bad_step_budgets_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", *SMALL, "--policy", "prefill-first", "--step-budgets-ms", "30"]) == 2
    assert "include chunked" in capsys.readouterr().err
    assert main(["tune", *SMALL, "--step-budgets-ms", "30,x"]) == 2
    assert "--step-budgets-ms" in capsys.readouterr().err


def test_a_spec_without_a_step_budget_keeps_its_key() -> None:
    spec = TrialSpec(model="mistral-7b", hardware="a100-80gb")
    assert spec.key() == "59f072f4f3fc505a"  # the key it had before step_budget_ms existed
    timed = TrialSpec(model="mistral-7b", hardware="a100-80gb", step_budget_ms=40.0)
    assert timed.key() != spec.key() and timed.serving.step_budget_ms == 40.0


def test_a_spec_without_a_block_count_keeps_its_key() -> None:
    spec = TrialSpec(model="mistral-7b", hardware="a100-80gb", num_blocks=None)
    assert spec.key() == "59f072f4f3fc505a"
    sized = TrialSpec(model="mistral-7b", hardware="a100-80gb", num_blocks=2000)
    assert sized.key() != spec.key() and sized.serving.num_blocks == 2000
    with pytest.raises(ValueError, match="num_blocks"):
        TrialSpec(model="mistral-7b", hardware="a100-80gb", num_blocks=0)
