"""DynoSim interop: the mocker-format tables, the pricer that reads them by DynoSim's rule, the
Mooncake trace writer, the command-line module, and the side-by-side benchmark's parsing of
DynoSim's report JSON (a recorded report; the live part runs where DynoSim's venv is)."""

from __future__ import annotations

import importlib.util
import json
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import yaml

from stallfree.core.plan import ScheduledChunk, StepPlan, synthetic_plan
from stallfree.core.request import PromptBlocks, Request
from stallfree.interop.dynosim import main, write_mooncake
from stallfree.interop.dynosim_tables import DynoSimPricer, DynoSimTables, tables_from_pricer
from stallfree.workload import Sessions, UniformLengths, Workload, generate, poisson
from stallfree.workload.traces import load_trace

ROOT = Path(__file__).resolve().parent.parent
REPORT = ROOT / "tests" / "data" / "dynosim_report.json"
DYNOSIM_VENV = Path("/tmp/dynosim-venv")


def linear_tables() -> DynoSimTables:
    """prefill 10 + 0.01 n ms; decode 5 + 1e-4 kv + 1e-3 context ms (bilinear is exact on these)."""
    isl = np.array([0.0, 1_000.0, 100_000.0])
    kv = np.array([0.0, 500_000.0, 1_000_000.0])
    ctx = np.array([1.0, 50_001.0, 100_001.0])
    itl = 5 + 1e-4 * kv[:, None] + 1e-3 * ctx[None, :]
    return DynoSimTables(isl, 10 + 0.01 * isl, kv, ctx, itl)


class AdditivePricer:
    """A stand-in cost model: 2 ms a step + 10 us a token + 1 us a context token a decode reads."""

    def step_time_s(self, plan: StepPlan) -> float:
        decode_context = sum(c.num_computed_tokens for c in plan.chunks if c.is_decoding)
        return 2e-3 + 1e-5 * plan.num_tokens + 1e-6 * decode_context


def test_tables_round_trip_and_interpolate(tmp_path: Path) -> None:
    tables = linear_tables()
    tables.save(tmp_path / "t.npz")
    again = DynoSimTables.load(tmp_path / "t.npz")
    assert again.prefill_ms(500) == pytest.approx(15.0)
    assert again.prefill_ms(200_000) == pytest.approx(2_010.0)  # past the end: the last segment goes on
    assert again.prefill_ms(0) == 0.0
    got = again.decode_ms(np.array([1_008.0, 0.0]), np.array([1_000.0, 1.0]))
    np.testing.assert_allclose(got, [5 + 0.1008 + 1.0, 5.001])
    floored = DynoSimTables(tables.prefill_isl, tables.prefill_ttft_ms, tables.decode_active_kv_tokens,
                            tables.decode_context_length, np.zeros((3, 3)))  # fmt: skip
    assert floored.decode_ms(np.array([10.0]), np.array([10.0]))[0] == 1.0  # the mocker's 1 ms floor


def test_tables_refuse_bad_arrays(tmp_path: Path) -> None:
    t = linear_tables()
    with pytest.raises(ValueError, match="strictly increasing"):
        DynoSimTables(t.prefill_isl[::-1], t.prefill_ttft_ms, t.decode_active_kv_tokens,
                      t.decode_context_length, t.decode_itl)  # fmt: skip
    np.savez(tmp_path / "bad.npz", prefill_isl=t.prefill_isl)
    with pytest.raises(ValueError, match="missing"):
        DynoSimTables.load(tmp_path / "bad.npz")


def test_pricer_follows_dynosims_rule() -> None:
    """One prompt chunk finishing at 1,000 tokens beside two decodes: prefill(1,000 new tokens)
    + decode(KV blocks in use x 16, mean known tokens of the three that emit)."""
    pricer = DynoSimPricer(linear_tables(), block_size=16)
    plan = StepPlan(
        (
            ScheduledChunk("a", 100, 1, 101),
            ScheduledChunk("b", 300, 1, 301),
            ScheduledChunk("p", 24, 1_000, 1_024),  # 24 cached tokens, 1,000 new
        )
    )
    blocks = 7 + 19 + 64  # ceil(101/16) + ceil(301/16) + ceil(1024/16)
    mean_known = (101 + 301 + 1_024) // 3
    expected_ms = (10 + 0.01 * 1_000) + (5 + 1e-4 * blocks * 16 + 1e-3 * mean_known)
    assert pricer.step_time_s(plan) == pytest.approx(expected_ms / 1000)
    # a chunk that stops short of its prompt's end emits nothing: the prompt part alone
    assert pricer.step_time_s(StepPlan((ScheduledChunk("p", 0, 512, 2_000),))) == pytest.approx(15.12e-3)


def test_steady_durations_equal_shifted_steps() -> None:
    pricer = DynoSimPricer(linear_tables(), block_size=16)
    plan = synthetic_plan(5, 30)
    durations = pricer.steady_durations(plan, 40)
    for j in (0, 1, 2, 17, 39):
        shifted = synthetic_plan(5, 30 + j)
        assert durations[j] == pytest.approx(pricer.step_time_s(shifted), rel=1e-12)
    assert np.all(np.diff(durations) >= 0)  # contexts grow, prices never shrink


def test_tables_from_pricer_hold_its_prices() -> None:
    pricer = AdditivePricer()
    tables = tables_from_pricer(
        pricer, max_prefill_tokens=4_096, max_num_seqs=64, max_context_len=8_192, max_kv_tokens=100_000
    )
    for n in (1, 100, 4_096):
        assert tables.prefill_ms(n) == pytest.approx(
            pricer.step_time_s(StepPlan((ScheduledChunk("p", 0, n, n + 1),))) * 1000
        )
    # a grid point: b = kv / context decodes at context known tokens
    c = int(tables.decode_context_length[10])
    a = int(np.searchsorted(tables.decode_active_kv_tokens, 8 * c))
    kv = tables.decode_active_kv_tokens[a]
    b = min(kv / c, 64)
    low, high = int(b), min(int(b) + 1, 64)
    lo_ms, hi_ms = (pricer.step_time_s(synthetic_plan(k, c - 1)) * 1000 for k in (low, high))
    assert tables.decode_itl[a, 10] == pytest.approx(lo_ms + (hi_ms - lo_ms) * (b - low))


def test_mooncake_rows_share_ids_where_prompts_share_tokens(tmp_path: Path) -> None:
    w = Workload(
        poisson(1.0),
        UniformLengths(600, 700, 100, 120),
        sessions=Sessions(turns=3, system_prompt_tokens=1_100),
    )
    requests = generate(w, 6, seed=0)
    path = tmp_path / "s.jsonl"
    assert write_mooncake(requests, path) == 6
    trace = load_trace(path)
    assert trace.hash_ids is not None
    by_id = {r.request_id: ids for r, ids in zip(requests, trace.hash_ids, strict=True)}
    assert all(
        len(ids) == -(-r.num_prompt_tokens // 512) for r, ids in zip(requests, trace.hash_ids, strict=True)
    )
    firsts = {ids[:2] for ids in by_id.values()}
    assert len(firsts) == 1  # the 1,100-token system prompt: two whole 512-token blocks, in every session
    turns = [r for r in requests if r.session_id == requests[0].session_id]
    earlier, later = by_id[turns[0].request_id], by_id[turns[1].request_id]
    whole = turns[0].num_prompt_tokens // 512
    assert later[:whole] == earlier[:whole]  # the next turn repeats the conversation so far
    plain = Request(request_id="x", num_prompt_tokens=1_500, max_tokens=5, arrival_time_s=9.0)
    other = Request(request_id="y", num_prompt_tokens=1_500, max_tokens=5, arrival_time_s=9.5,
                    prompt_blocks=PromptBlocks((1, 2, 3), tokens_per_id=512))  # fmt: skip
    write_mooncake([plain, other, other], path)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(set(rows[0]["hash_ids"])) == 3 and not set(rows[0]["hash_ids"]) & set(rows[1]["hash_ids"])
    assert rows[1]["hash_ids"] == rows[2]["hash_ids"] and rows[0]["timestamp"] == 9000.0


def test_command_line_module(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    deployment = {
        "costs": {"kind": "full", "model": "llama-3-8b", "hardware": "a100-80gb"},
        "serving": {"max_num_batched_tokens": 512, "max_num_seqs": 64, "num_blocks": 2_000},
        "replicas": 4,
        "router": "cache-aware",
    }
    (tmp_path / "d.yaml").write_text(yaml.safe_dump(deployment))
    out = tmp_path / "out"
    assert main([str(tmp_path / "d.yaml"), "--trace", "mooncake-synthetic", "--out", str(out)]) == 0
    line = capsys.readouterr().out
    assert "--num-workers 4" in line and "--router-mode kv_router" in line
    args = json.loads((out / "engine_args.json").read_text())
    assert (args["num_gpu_blocks"], args["max_num_batched_tokens"], args["max_num_seqs"]) == (2_000, 512, 64)
    tables = DynoSimTables.load(out / "perf_data.npz")
    assert tables.prefill_isl[-1] >= 512 and tables.decode_active_kv_tokens[-1] >= 2_000 * 16
    assert len(load_trace(out / "mooncake_synthetic_1000.jsonl")) == 1000

    deployment["router"] = "least-requests"
    (tmp_path / "d.yaml").write_text(yaml.safe_dump(deployment))
    assert main([str(tmp_path / "d.yaml"), "--trace", "mooncake-synthetic", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: router 'least-requests'") and err.count("\n") == 1


def benchmark() -> ModuleType:
    path = ROOT / "benchmarks" / "peers" / "dynosim_side_by_side.py"
    spec = importlib.util.spec_from_file_location("dynosim_side_by_side", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_benchmark_reads_dynosims_report() -> None:
    report = json.loads(REPORT.read_text())
    metrics = benchmark().dynosim_metrics(report)
    assert metrics["completed"] == report["completed_requests"] > 0
    assert metrics["median_ttft_ms"] == report["median_ttft_ms"]
    assert metrics["p99_itl_ms"] == report["p99_itl_ms"]
    assert metrics["prefix_cache_hit_rate"] == report["prefix_cache_reused_ratio"]
    assert metrics["duration_s"] == pytest.approx(report["duration_ms"] / 1000)


@pytest.mark.skipif(
    not (DYNOSIM_VENV / "bin" / "python").exists(), reason="DynoSim's venv (the benchmark makes it)"
)
def test_live_dynosim_prices_a_prompt_as_the_pricer_does(tmp_path: Path) -> None:
    """A lone request through DynoSim on our tables: its first token at the price the pricer
    gives the prompt's steps, its report parsed by the benchmark."""
    tables = linear_tables()
    tables.save(tmp_path / "t.npz")
    trace = tmp_path / "one.jsonl"
    trace.write_text(
        json.dumps(
            {"timestamp": 0, "input_length": 3_000, "output_length": 3, "hash_ids": [1, 2, 3, 4, 5, 6]}
        )
        + "\n"
    )
    engine = {"block_size": 16, "num_gpu_blocks": 10_000, "max_num_batched_tokens": 2_048, "max_num_seqs": 8,
              "planner_profile_data": str(tmp_path / "t.npz")}  # fmt: skip
    cmd = [str(DYNOSIM_VENV / "bin" / "python"), "-m", "dynamo.replay", str(trace), "--trace-format", "mooncake",
           "--trace-block-size", "512", "--num-workers", "1", "--replay-mode", "offline",
           "--extra-engine-args", json.dumps(engine), "--report-json", str(tmp_path / "r.json")]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, cwd=tmp_path)
    report = json.loads((tmp_path / "r.json").read_text())
    pricer = DynoSimPricer(tables, 16)
    steps = [
        StepPlan((ScheduledChunk("p", 0, 2_048, 3_000),)),
        StepPlan((ScheduledChunk("p", 2_048, 952, 3_000),)),
    ]
    assert report["mean_ttft_ms"] == pytest.approx(sum(pricer.step_time_s(s) for s in steps) * 1000, rel=1e-6)
    assert benchmark().dynosim_metrics(report)["completed"] == 1


@pytest.mark.skipif(
    not (DYNOSIM_VENV / "bin" / "python").exists(), reason="DynoSim's venv (the benchmark makes it)"
)
def test_live_printed_command_runs_on_dynosim(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The command the module prints runs in DynoSim's venv and replays every request it can."""
    deployment = {
        "costs": {"kind": "full", "model": "llama-3-8b", "hardware": "h100-sxm"},
        "serving": {"max_num_batched_tokens": 2_048, "max_num_seqs": 64, "max_model_len": 200_000},
        "replicas": 4,
    }
    (tmp_path / "d.yaml").write_text(yaml.safe_dump(deployment))
    assert (
        main([str(tmp_path / "d.yaml"), "--trace", "mooncake-synthetic", "--out", str(tmp_path / "out")]) == 0
    )
    argv = shlex.split(capsys.readouterr().out)
    assert argv[:3] == ["python", "-m", "dynamo.replay"]
    subprocess.run(
        [str(DYNOSIM_VENV / "bin" / "python"), *argv[1:]], check=True, capture_output=True, cwd=tmp_path
    )
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["completed_requests"] == 1000
