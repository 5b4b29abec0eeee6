"""``stallfree tune --step-budgets-ms``: chunked candidates sized by time beside the fixed budgets."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from stallfree.cli import main
from stallfree.costs.choice import CostChoice
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


def test_a_spec_key_names_its_serving_and_costs() -> None:
    costs = CostChoice(kind="full", model="mistral-7b", hardware="a100-80gb")
    spec = TrialSpec.of(costs)
    assert spec.key() == TrialSpec.of(CostChoice(kind="full", model="mistral-7b", hardware="a100-80gb")).key()
    timed = spec.with_serving(256, step_budget_ms=40.0)
    sized = spec.with_serving(256, num_blocks=2000)
    other = spec.with_deployment(costs=replace(costs, hardware="h100-80gb"))
    assert len({spec.key(), timed.key(), sized.key(), other.key()}) == 4
    assert timed.serving.step_budget_ms == 40.0 and sized.columns()["num_blocks"] == 2000
    with pytest.raises(ValueError, match="num_blocks"):
        spec.with_serving(256, num_blocks=0)


def test_a_trial_runs_at_most_max_num_seqs_and_never_more_than_a_chunked_budget() -> None:
    spec = TrialSpec.of(CostChoice(kind="full", model="mistral-7b", hardware="a100-80gb"))
    assert spec.with_serving(256, max_num_batched_tokens=128).serving.num_seqs_limit == 128
    assert spec.with_serving(64, max_num_batched_tokens=128).serving.num_seqs_limit == 64
    # The whole-prompt policies' budget caps prompt tokens, not running sequences.
    whole = spec.with_serving(256, policy="prefill-first", max_num_batched_tokens=128)
    assert whole.serving.num_seqs_limit == 256 and whole.token_budget == 128
