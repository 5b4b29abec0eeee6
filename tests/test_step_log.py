"""``serve --step-log``: a JSON line per engine step, and ``validate --step-log`` pricing them."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import httpx
import pytest

pytest.importorskip("torch")

from stallfree.cli import main
from stallfree.core import ScheduledChunk, StepPlan
from stallfree.server.launch import ServerThread, build_server
from stallfree.server.step_log import load_step_log, write_step
from tests.test_validate import tiny_profile, write_bench_result


def test_a_step_log_round_trips_and_bad_files_are_one_line(tmp_path: Path) -> None:
    path = tmp_path / "steps.jsonl"
    plan = StepPlan((ScheduledChunk("a", 10, 1, 11), ScheduledChunk("b", 0, 32, 40)))
    with path.open("w") as out:
        write_step(out, plan, 1.0, 1.25, 0.2)
    (step,) = load_step_log(path)
    assert step.duration_s == pytest.approx(0.25) and step.executor_s == 0.2
    shape = [(c.num_computed_tokens, c.num_tokens, c.num_known_tokens) for c in step.plan.chunks]
    assert shape == [(10, 1, 11), (0, 32, 40)]
    assert step.plan.num_prefill_tokens == plan.num_prefill_tokens
    (tmp_path / "bad.jsonl").write_text('{"start_s": 1}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:1: not a step-log line"):
        load_step_log(tmp_path / "bad.jsonl")
    with pytest.raises(ValueError, match="cannot read step log"):
        load_step_log(tmp_path / "missing.jsonl")


def test_the_server_logs_every_step_it_runs(tmp_path: Path) -> None:
    log = tmp_path / "steps.jsonl"
    app = build_server("random:tiny", dtype="float32", device="cpu", token_budget=16, step_log=str(log))
    with ServerThread(app) as server:
        body = {"model": "random:tiny", "prompt": [5] * 40, "max_tokens": 4, "temperature": 0}
        response = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=60)
        assert response.status_code == 200
    steps = load_step_log(log)
    # a 40-token prompt in chunks of at most 16 tokens, then 3 more decodes
    assert [s.plan.num_prefill_tokens for s in steps] == [16, 16, 8, 0, 0, 0]
    assert all(s.duration_s >= s.executor_s > 0 for s in steps)
    assert all(a.end_s <= b.start_s for a, b in itertools.pairwise(steps))


def test_validate_prices_the_logged_steps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = tiny_profile(tmp_path / "tiny.json")
    log = tmp_path / "steps.jsonl"
    with log.open("w") as out:
        for i in range(4):
            write_step(
                out, StepPlan((ScheduledChunk("a", 20 + i, 1, 21 + i),)), i * 0.01, i * 0.01 + 0.002, 0.001
            )
    args = ["validate", "--profile", str(profile), "--measured", str(write_bench_result(tmp_path / "r.json"))]
    assert main([*args, "--num-blocks", "64", "--step-log", str(log), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)["policies"]["chunked"]
    steps = result["per_step"]
    assert steps["num_steps"] == 4 and steps["measured_step_s_total"] == pytest.approx(0.008)
    # four decode-only served steps: the simulation again at their speed; no prompt steps logged
    assert result["run_step_scales"] == [pytest.approx(1 / (1 + steps["decode_only"]["median_error"])), 1.0]
    assert main([*args, "--num-blocks", "64", "--step-log", str(log)]) == 0
    assert "at run speed: the same simulation with decode-only steps x" in capsys.readouterr().out
    assert main(["validate", "--profile", str(profile), "--step-log", str(log)]) == 2
