"""Step prices from aiconfigurator-core's measured tables (the optional ``gpu`` extra): the pricer
against the package's own estimates, the factory's choice, the hardware presets against its system
files, and the commands. Without the extra only the one-line refusals run."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from stallfree.cli import main
from stallfree.core import ServingConfig
from stallfree.core.plan import ScheduledChunk, StepPlan, synthetic_plan
from stallfree.costs.aiconfigurator import _Kept, _pack, _unpack
from stallfree.costs.choice import CostChoice, pick_cost_model
from stallfree.sim import Deployment, simulate
from stallfree.workload import FixedLengths, Workload, poisson
from tests.factories import shifted_plans

if TYPE_CHECKING:
    from stallfree.costs.aiconfigurator import AicCostModel

HAS_AIC = importlib.util.find_spec("aiconfigurator_core") is not None
needs_aic = pytest.mark.skipif(
    not HAS_AIC, reason='aiconfigurator-core not installed (pip install "stallfree[gpu]")'
)
LLAMA_8B = "meta-llama/Meta-Llama-3.1-8B"


@pytest.fixture(scope="module")
def h100() -> AicCostModel:
    from stallfree.costs.aiconfigurator import AicCostModel

    return AicCostModel(LLAMA_8B, "h100_sxm", "vllm")


@needs_aic
def test_steps_are_priced_as_the_package_prices_them(h100: AicCostModel) -> None:
    handle = h100._handle
    # one decode step of 16 streams at 1,024 cached tokens (the KV read: 1,025 with the new one)
    assert h100.decode_step_s(16, 1024) == pytest.approx(
        handle.predict_decode_latency(16, 1024, 2) / 1e3, rel=1e-4
    )  # (the decode attention is read on a grid of KV lengths, linear between points)
    assert h100.prefill_time_s(2048) == pytest.approx(handle.predict_prefill_latency(1, 2048) / 1e3, rel=1e-9)
    # a chunk after earlier context is the package's prefill with that prefix: later chunks cost more
    late = h100.step_time_s(synthetic_plan(0, 0, 1024, 15360))
    assert late == pytest.approx(handle.predict_prefill_latency(1, 16384, 15360) / 1e3, rel=1e-9)
    assert late > 1.4 * h100.prefill_time_s(1024)


@needs_aic
@pytest.mark.parametrize(
    ("model_id", "tp", "expert_parallel"),
    [
        ("deepseek-ai/DeepSeek-V3", 8, False),  # MLA blocks; its decode runs other MoE kernels (overlapped)
        ("deepseek-ai/DeepSeek-V3", 8, True),  # its experts split whole over the 8 GPUs: other MoE tables
        ("openai/gpt-oss-120b", 4, False),  # two attention ops a layer pair: sliding-window and full
    ],
)
def test_a_static_batch_replays_as_the_package_runs_it(model_id: str, tp: int, expert_parallel: bool) -> None:
    from stallfree.costs.aiconfigurator import AicCostModel

    cost = AicCostModel(model_id, "h200_sxm", "vllm", tp=tp, expert_parallel=expert_parallel)
    batch, isl, osl = 8, 1024, 32
    prompts = StepPlan(
        tuple(ScheduledChunk(f"r{i}", 0, isl, isl) for i in range(batch))
    )  # one step of every prompt, then osl - 1 decode steps
    ttft_ms = cost.step_time_s(prompts) * 1e3
    tpot_ms = sum(cost.decode_step_s(batch, isl + i) for i in range(osl - 1)) / (osl - 1) * 1e3
    ctx_ms, gen_ms, _ = cost._handle.run_static(batch_size=batch, isl=isl, osl=osl, stride=1)
    assert ttft_ms == pytest.approx(ctx_ms, rel=0.01)
    assert tpot_ms == pytest.approx(gen_ms / (osl - 1), rel=0.01)


@needs_aic
def test_a_steady_run_is_priced_as_its_steps(h100: AicCostModel) -> None:
    decodes = synthetic_plan(13, 700).chunks
    mixed = StepPlan((*decodes, *synthetic_plan(0, 0, 256, 512).chunks))
    # contexts that differ (a mean between integers), and runs across the grid's octaves
    uneven = StepPlan((*synthetic_plan(2, 3).chunks[:1], *synthetic_plan(1, 1019).chunks))
    for plan in (synthetic_plan(13, 700), mixed, synthetic_plan(3, 1), synthetic_plan(5, 1000), uneven):
        runs = h100.steady_durations(plan, 300)
        shifted = shifted_plans(plan, 300)
        assert np.array_equal(runs, [h100.step_time_s(p) for p in shifted])


@needs_aic
def test_auto_picks_the_tables_where_they_cover_model_and_gpu() -> None:
    pick = pick_cost_model(CostChoice(model="llama-3.1-70b", hardware="h200-sxm", tp=4))
    assert pick.source == "aiconfigurator" and "h200_sxm tables, vllm" in pick.why
    sglang = pick_cost_model(CostChoice(model=LLAMA_8B, hardware="b200-sxm", framework="sglang"))
    assert sglang.model.num_layers == 32 and "sglang" in sglang.why
    assert pick_cost_model(CostChoice(model="llama-3-8b", hardware="h100-sxm")).source == "gpu-tables"
    vidur = CostChoice(model="llama-3.1-8b", hardware="h100-sxm", gpu_tables="vidur")
    assert pick_cost_model(vidur).source == "gpu-tables"
    with pytest.raises(ValueError, match="ships no config for llama-3-8b"):
        pick_cost_model(CostChoice(model="llama-3-8b", hardware="h100-sxm", framework="vllm"))
    with pytest.raises(ValueError, match="no tables for a100-40gb"):
        pick_cost_model(CostChoice(model="llama-3.1-8b", hardware="a100-40gb", gpu_tables="aiconfigurator"))


@needs_aic
def test_hardware_presets_agree_with_its_system_files() -> None:
    from aiconfigurator_core.sdk import perf_database

    from stallfree.costs.aiconfigurator import AIC_SYSTEMS
    from stallfree.specs import load_hardware_spec

    for preset, system in AIC_SYSTEMS.items():
        ours, theirs = load_hardware_spec(preset), perf_database.load_system_spec(system)
        assert ours.mem_bandwidth_bytes_per_s == pytest.approx(theirs["gpu"]["mem_bw"], rel=1e-3)
        assert ours.peak_flops_per_s == pytest.approx(theirs["gpu"]["bfloat16_tc_flops"], rel=1e-3)
        assert ours.interconnect_bandwidth_bytes_per_s == pytest.approx(
            theirs["node"]["intra_node_bw"], rel=1e-3
        )
        # memory: datasheet GiB vs what nvidia-smi reports (L40S: 48 vs 45 GiB)
        assert ours.mem_capacity_bytes == pytest.approx(theirs["gpu"]["mem_capacity"], rel=0.07)


@needs_aic
def test_the_fast_path_equals_every_step() -> None:
    costs = CostChoice(model="llama-3.1-8b", hardware="h100-sxm", framework="sglang")
    workload = Workload(poisson(30.0), FixedLengths(600, 40))
    serving = ServingConfig(max_num_batched_tokens=256)
    fast = simulate(workload, Deployment(costs=costs, serving=serving), num_requests=60)
    slow = simulate(workload, Deployment(costs=costs, serving=serving), num_requests=60, fast=False)
    assert fast.records == slow.records and fast.summary["completed"] == 60


@needs_aic
def test_the_commands_say_which_tables(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "explain",
                "--model",
                "llama-3.1-70b",
                "--hardware",
                "h200-sxm",
                "--tp",
                "4",
                "--framework",
                "vllm",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "measured GPU tables, cost model: aiconfigurator-core's h200_sxm tables, vllm" in out
    assert (
        main(["specs", "--model", "llama-3.1-8b", "--hardware", "b200-sxm", "--cost-model", "measured"]) == 0
    )
    out = capsys.readouterr().out
    assert "roofline    tp=1" in out and "aiconfigurator-core's b200_sxm tables under vllm" in out


def test_without_the_extra_a_framework_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("stallfree.costs.aiconfigurator.aic_available", lambda: False)
    monkeypatch.setattr("stallfree.costs.choice.aic_available", lambda: False)
    argv = ["simulate", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--framework", "vllm"]
    assert main([*argv, "--num-requests", "5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and 'pip install "stallfree[gpu]"' in err
    # auto falls back to Vidur's tables, as without the extra
    assert pick_cost_model(CostChoice(model="llama-3.1-8b", hardware="h100-sxm")).source == "gpu-tables"


@needs_aic
def test_fp8_takes_its_fp8_kernels_or_says_which_table_is_missing() -> None:
    def decode_s(dtype_bytes: int, framework: str = "vllm") -> float:
        choice = CostChoice(
            model="llama-3.1-8b", hardware="h100-sxm", dtype_bytes=dtype_bytes, framework=framework
        )
        return pick_cost_model(choice).pricer.decode_step_s(16, 2048)

    assert decode_s(1) < 0.8 * decode_s(2)  # fp8 weights and KV: fewer bytes to read
    with pytest.raises(
        ValueError, match=r"sglang 0\.5\.14 in fp8: perf database error: context attention"
    ) as info:
        decode_s(1, "sglang")
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="bf16 and fp8"):
        decode_s(4)
    # not asked for (auto, no framework): fp32 goes to the tables that have it
    assert (
        pick_cost_model(CostChoice(model="llama-3.1-8b", hardware="h100-sxm", dtype_bytes=4)).source
        == "gpu-tables"
    )


def test_tunes_launch_lines_say_what_was_priced() -> None:
    from stallfree.tune.capacity import serve_commands

    lines = serve_commands("qwen3-30b-a3b", 2, 2048, 256, fp8=True)
    assert lines["vllm"].startswith("vllm serve Qwen/Qwen3-30B-A3B --max-num-batched-tokens 2048")
    assert lines["vllm"].endswith("--tensor-parallel-size 2 --quantization fp8 --kv-cache-dtype fp8")
    assert "--chunked-prefill-size 2048" in lines["sglang"] and "--kv-cache-dtype fp8_e4m3" in lines["sglang"]
    assert "quantization" not in serve_commands("llama-3.1-8b", 1, 512, 256)["vllm"]
    split = serve_commands("deepseek-v3", 8, 512, 256, expert_parallel=True)
    assert "--tensor-parallel-size 8 --enable-expert-parallel" in split["vllm"]
    assert "--tp 8 --ep-size 8" in split["sglang"]
    assert "expert" not in serve_commands("deepseek-v3", 8, 512, 256)["vllm"]


@needs_aic
def test_the_newest_table_version_is_found_once_per_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding it parses every table's YAML: the answer is kept on disk, keyed by the package's
    version, and read back (the search is not run again) by the next process."""
    from aiconfigurator_core.sdk import perf_database

    from stallfree.costs import aiconfigurator

    monkeypatch.setenv("STALLFREE_CACHE_DIR", str(tmp_path))
    aiconfigurator._latest_version.cache_clear()
    found = aiconfigurator._latest_version("h100_sxm", "vllm")
    assert found == perf_database.get_latest_database_version("h100_sxm", "vllm")
    kept = json.loads((tmp_path / "aiconfigurator-versions.json").read_text())
    assert list(kept.values()) == [found] and next(iter(kept)).endswith("/h100_sxm/vllm")

    def no_search(system: str, framework: str) -> str:
        raise AssertionError("searched again")

    monkeypatch.setattr(perf_database, "get_latest_database_version", no_search)
    aiconfigurator._latest_version.cache_clear()
    assert aiconfigurator._latest_version("h100_sxm", "vllm") == found
    (tmp_path / "aiconfigurator-versions.json").write_text("{not json")  # a damaged file: search again
    aiconfigurator._latest_version.cache_clear()
    with pytest.raises(AssertionError, match="searched again"):
        aiconfigurator._latest_version("h100_sxm", "vllm")
    aiconfigurator._latest_version.cache_clear()


@needs_aic
def test_the_compiled_engine_spec_is_kept_per_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compiling resolves every attention kernel's table (~1 s): the spec is kept on disk and the
    next model of the same arguments reads it back, pricing the same."""
    from aiconfigurator_core.sdk import engine

    from stallfree.costs.aiconfigurator import AicCostModel

    monkeypatch.setenv("STALLFREE_CACHE_DIR", str(tmp_path))
    first = AicCostModel(LLAMA_8B, "h100_sxm", "vllm")
    (kept,) = (tmp_path / "aiconfigurator-specs").iterdir()

    def no_compile(*args: object, **kwargs: object) -> bytes:
        raise AssertionError("compiled again")

    monkeypatch.setattr(engine, "compile_engine", no_compile)
    second = AicCostModel(LLAMA_8B, "h100_sxm", "vllm")
    plan = synthetic_plan(8, 900, 256, 128)
    assert second.step_time_s(plan) == first.step_time_s(plan)
    with pytest.raises(ValueError, match="compiled again"):  # other arguments: another spec
        AicCostModel(LLAMA_8B, "h100_sxm", "vllm", tp=2)
    assert list((tmp_path / "aiconfigurator-specs").iterdir()) == [kept]
    monkeypatch.undo()  # a damaged file is compiled again, and replaced
    monkeypatch.setenv("STALLFREE_CACHE_DIR", str(tmp_path))
    spec = kept.read_bytes()
    kept.write_bytes(b"damaged")
    assert AicCostModel(LLAMA_8B, "h100_sxm", "vllm").step_time_s(plan) == first.step_time_s(plan)
    assert kept.read_bytes() == spec


def test_table_points_are_kept_per_machine_and_price_without_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each table point a run reads is kept on disk at exit: the next model of the same arguments
    prices those steps from the file, the package's engine never made, with the same floats."""
    from stallfree.costs.aiconfigurator import AicCostModel

    monkeypatch.setenv("STALLFREE_CACHE_DIR", str(tmp_path))
    plans = [synthetic_plan(8, 900, 256, 128), synthetic_plan(3, 4000), synthetic_plan(0, 0, 2048)]
    first = AicCostModel(LLAMA_8B, "h100_sxm", "vllm")
    priced = [first.step_time_s(p) for p in plans]
    steady = first.steady_durations(plans[1], 50)
    first._write_memo()  # what atexit does
    (memo,) = (tmp_path / "aiconfigurator-points").iterdir()
    second = AicCostModel(LLAMA_8B, "h100_sxm", "vllm")
    assert [second.step_time_s(p) for p in plans] == priced
    assert second.steady_durations(plans[1], 50).tolist() == steady.tolist()
    assert second._engine is None  # every point came from the file
    assert (
        second.step_time_s(synthetic_plan(5, 777, 100)) > 0 and second._engine is not None
    )  # a new one: read
    second._write_memo()
    kept = json.loads(memo.read_text())
    assert set(kept["chunk"]) == {"codes", "values"}  # sorted codes, looked up as needed
    # a memo that kept its big tables in an older form (rows; columns in the order found) is read
    # whole, and kept again sorted
    points = {name: second_points(memo, name) for name in ("chunk", "decode")}
    legacy = memo.with_name(memo.name.replace(".sorted.json", ".json"))  # where they were kept
    for old in (lambda p: [[*key, value] for key, value in p.items()], _pack):
        memo.unlink()
        legacy.write_text(json.dumps(kept | {name: old(p) for name, p in points.items()}))
        third = AicCostModel(LLAMA_8B, "h100_sxm", "vllm")
        assert [third.step_time_s(p) for p in plans] == priced and third._engine is None
        third._write_memo()
        assert json.loads(memo.read_text()) == kept
        assert json.loads(legacy.read_text()) != kept  # an older stallfree still reads its own file
    memo.write_text("{damaged")
    assert [AicCostModel(LLAMA_8B, "h100_sxm", "vllm").step_time_s(p) for p in plans] == priced
    memo.write_text('{"chunk": [[1, 2, 3.0]], "context_ops": ["x"]}')  # wrong shapes: read the tables again
    assert [AicCostModel(LLAMA_8B, "h100_sxm", "vllm").step_time_s(p) for p in plans] == priced


@needs_aic
def test_a_memo_past_its_cap_keeps_only_what_the_last_run_priced_or_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The memo does not grow for ever: past ``memo_points`` a run keeps the points it priced or
    looked up, and drops the ones it never touched."""
    from stallfree.costs.aiconfigurator import AicCostModel

    monkeypatch.setenv("STALLFREE_CACHE_DIR", str(tmp_path))
    old, new = synthetic_plan(3, 4000), synthetic_plan(8, 900, 256, 128)
    first = AicCostModel(LLAMA_8B, "h100_sxm", "vllm")
    first.step_time_s(old)
    first._write_memo()
    (memo,) = (tmp_path / "aiconfigurator-points").iterdir()
    kept_first = second_points(memo, "decode")
    second = AicCostModel(LLAMA_8B, "h100_sxm", "vllm")
    priced = second.step_time_s(new)  # new points; none of the first run's looked up
    second.memo_points = len(kept_first)  # the union is past the cap
    second._write_memo()
    kept = second_points(memo, "decode")
    assert kept and not set(kept) & set(kept_first)  # the untouched ones went
    third = AicCostModel(LLAMA_8B, "h100_sxm", "vllm")
    assert third.step_time_s(new) == priced and third._engine is None  # what the run needed stayed


def second_points(memo: Path, name: str) -> dict[tuple[int, ...], float]:
    kept = json.loads(memo.read_text())[name]
    return _Kept.read(kept, 3 if name == "chunk" else 2).points()


def test_kept_points_round_trip_exactly_and_refuse_another_width() -> None:
    sorted_points = {(n, 2 * n, 7 * n): 1 / (n + 3) for n in range(1000)} | {(2**20, 0, 1): 5e-324}
    written = _Kept.write(sorted_points)
    assert isinstance(written, dict)
    kept = _Kept.read(written, 3)
    assert kept.points() == sorted_points and len(kept) == 1001
    assert all(kept.get(key) == value for key, value in sorted_points.items())
    assert kept.get((1, 2, 3)) is None and kept.get((2**40, 0, 0)) is None  # not kept; too big for a code

    points = {(n, 2 * n, 7 * n): 1 / (n + 3) for n in range(1000)} | {(2**40, 0, 1): 5e-324}
    assert _Kept.write(points) == _pack(points)  # a key too big for a code: kept as columns
    assert _unpack(_pack(points), 3) == points and _unpack(_pack({}), 3) == {}
    assert _unpack([[*key, value] for key, value in points.items()], 3) == points  # rows, as kept before
    with pytest.raises(ValueError):
        _unpack(_pack(points), 2)
