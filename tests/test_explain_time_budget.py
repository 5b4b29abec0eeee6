"""``stallfree explain --step-budget-ms``: the chunked run sizes its chunks by time."""

from __future__ import annotations

import json

import pytest

from stallfree.cli import main


def test_chunks_shrink_along_the_prompt_and_every_step_stays_within_the_target(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["explain", "--cost-model", "full", "--step-budget-ms", "40", "--sweep", "256"]
    assert main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    pc = out["prompt_chunks"]
    sizes = pc["chunk_tokens"]
    assert sum(sizes) == out["scenario"]["prompt_tokens"] == 16384
    assert sizes[0] > sizes[-2] and sizes[:-1] == sorted(sizes[:-1], reverse=True)
    assert pc["num_steps_over_budget"] == 0 and max(pc["step_s"]) <= 0.040
    assert out["policies"]["chunked"]["max_gap_s"] <= 0.040 + 1e-12
    assert out["scenario"]["step_budget_ms"] == 40
    # the sweep still runs fixed chunks: 256 tokens grow past 40 ms as the context grows
    assert out["sweep"][0]["chunk_tokens"] == 256 and out["sweep"][0]["max_gap_s"] > 0.040
    assert main(args) == 0
    table = capsys.readouterr().out
    assert "chunked (40 ms steps)" in table and "every step within the target" in table


def test_without_a_budget_the_chunk_sizes_are_the_fixed_chunk(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "--json", "--sweep", "256", "--prompt-tokens", "2048"]) == 0
    pc = json.loads(capsys.readouterr().out)["prompt_chunks"]
    assert pc["chunk_tokens"] == [256] * 8 and pc["num_steps_over_budget"] is None


def test_torch_needs_a_profile_to_predict(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    code = main(["explain", "--engine", "torch", "--step-budget-ms", "40", "--model", "random:tiny"])
    assert code == 2 and "needs --profile FILE" in capsys.readouterr().err
