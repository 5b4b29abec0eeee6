"""`stallfree explain --engine torch`: the seed's scenario on the real engine (tiny model).

Timing is not asserted here (shared CPUs are noisy; the measured figures live in the
README's benchmarks); the structure of the run and the JSON contract are.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from stallfree.cli import main
from stallfree.core.plan import synthetic_plan
from stallfree.costs.measured import MeasuredCostModel
from tests.test_validate import tiny_profile

pytest.importorskip("torch")


def test_measured_explainer_runs_the_same_scenario_and_contract(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["explain", "--engine", "torch", "--model", "random:tiny", "--dtype", "float32", "--device", "cpu"]
    args += ["--streams", "3", "--context-tokens", "24", "--prompt-tokens", "100", "--chunk-tokens", "16"]
    assert main([*args, "--sweep", "32,64", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["scenario"]["cost_model"] == "measured" and out["scenario"]["model"] == "random-tiny"
    assert set(out["policies"]) == {"prefill-first", "chunked"}
    for p in out["policies"].values():
        assert p["max_gap_s"] >= p["median_gap_s"] > 0
        assert p["ttft_s"] > 0 and p["ttft_vs_alone"] > 0
    assert out["prompt_chunks"]["num_steps"] == 7  # ceil(100 / 16) chunks of the prompt
    assert [row["chunk_tokens"] for row in out["sweep"]] == [32, 64]
    assert out["ridge_tokens"] >= 8 and out["decode_step_s"] > 0 and out["prefill_alone_s"] > 0


def test_prompt_longer_than_the_model_context_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "explain",
        "--engine",
        "torch",
        "--model",
        "random:tiny",
        "--prompt-tokens",
        "5000",
        "--chunk-tokens",
        "64",
    ]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "positions" in err


def test_engine_runs_stay_inside_the_real_kv_cache() -> None:
    """Runs schedule against the engine's own cache: every block id handed out exists."""
    import torch

    from stallfree.core import make_policy
    from stallfree.explain import Scenario, run_scenario
    from stallfree.explain.engine import EngineTimer

    scenario = Scenario(prompt_tokens=300, streams=4, context_tokens=40, chunk_tokens=8)
    timer = EngineTimer(
        "random:tiny", max_tokens=4 * (40 + 300 // 8 + 32) + 300, max_seq_tokens=301, dtype=torch.float32
    )
    num_blocks = timer.model_runner.kv_cache.num_blocks
    seen: list[int] = []
    execute = timer.model_runner.execute

    def checked(plan, token_ids):  # type: ignore[no-untyped-def]
        seen.extend(b for blocks in plan.new_block_ids.values() for b in blocks)
        return execute(plan, token_ids)

    timer.model_runner.execute = checked  # type: ignore[method-assign]
    for policy in (make_policy("prefill-first"), make_policy("chunked", chunk_tokens=8)):
        run = run_scenario(scenario, policy, timer)
        assert run.first_token_s > run.arrival_s
    assert seen and max(seen) < num_blocks


def test_a_profile_prices_the_same_scenario_beside_the_measured_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--engine torch --profile: the run as measured, and the same scenario priced by the profile,
    with predicted / measured per policy (the measured model checked in the same run)."""
    profile = tiny_profile(tmp_path / "tiny.json")
    args = ["explain", "--engine", "torch", "--model", "random:tiny", "--dtype", "float32", "--device", "cpu"]
    args += ["--streams", "3", "--context-tokens", "24", "--prompt-tokens", "100", "--chunk-tokens", "16"]
    args += ["--sweep", "32", "--profile", str(profile)]
    assert main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    cost = MeasuredCostModel.from_file(str(profile))
    assert set(out["predicted"]) == {"prefill-first", "chunked"}
    for name, keys in out["predicted"].items():
        for key, m in keys.items():
            assert m["measured"] == out["policies"][name][key]
            assert m["ratio"] == pytest.approx(m["predicted"] / m["measured"])
    # prefill-first's prompt TTFT: the arrival's wait for the step in flight plus the prompt's own
    # step, priced by the profile (the synthetic one costs ~1 ms + 20 us a token: ~3 ms here)
    prompt_step = cost.step_time_s(synthetic_plan(0, 0, 100))
    assert prompt_step <= out["predicted"]["prefill-first"]["ttft_s"]["predicted"] < 3 * prompt_step
    assert main(args) == 0
    table = capsys.readouterr().out
    assert f"the same scenario priced by the profile {profile}" in table
    priced = table.split("priced by the profile")[1]  # a second run: its own measured times
    cell = r"\s+[\d.,]+ m?s x\d+\.\d\d"
    assert re.search(r"chunked \(16-token chunks\)" + 3 * cell, priced)
    assert re.search(r"prefill-first" + 3 * cell, priced)
