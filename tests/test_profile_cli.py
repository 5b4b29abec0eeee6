"""``stallfree profile`` on the tiny random model: a valid profile file the measured model reads."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from stallfree.cli import main
from stallfree.core import ScheduledChunk, StepPlan
from stallfree.sim.measured import MeasuredCostModel
from stallfree.specs.step_profile import SAMPLING_MODES, STEP_KINDS, load_profile


@pytest.fixture(scope="module")
def tiny_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("profile") / "tiny.profile.json"
    args = ["profile", "--model", "random:tiny", "--quick", "--max-num-seqs", "8"]
    assert main([*args, "--max-attempts", "1", "--dtype", "float32", "--out", str(path)]) == 0
    return path


def test_profile_writes_a_fingerprinted_file_covering_the_grid(tiny_profile: Path) -> None:
    profile = load_profile(tiny_profile)
    fp = profile.fingerprint
    assert fp["model"] == "random:tiny" and fp["dtype"] == "float32" and fp["dtype_bytes"] == 4
    for key in ("device", "device_name", "threads", "torch", "date"):
        assert fp[key]
    assert {p.kind for p in profile.steps} == set(STEP_KINDS)
    assert max(len(p.decode_contexts) for p in profile.steps) == 8
    assert {p.mode for p in profile.sampling} == set(SAMPLING_MODES)
    assert profile.linear and profile.overhead
    for point in profile.steps:
        stats = point.stats
        assert len(stats.times_s) == 3 and stats.q1_s <= stats.median_s <= stats.q3_s
        assert stats.attempts == 1
    assert profile.model["kv_bytes_per_token"] == 2 * 4 * 2 * 32 * 4  # K+V, layers, kv heads, dim, fp32


def test_the_measured_model_reads_the_profile(tiny_profile: Path) -> None:
    model = MeasuredCostModel.from_file(str(tiny_profile))
    assert model.model_spec().num_layers == 4
    plan = StepPlan(tuple(ScheduledChunk(f"d{i}", 50, 1, 51) for i in range(4)))
    assert model.step_time_s(plan) > model.forward_time_s(plan) > 0
    assert model.prefill_time_s(128) > model.prefill_time_s(16)


def test_specs_prints_the_fitted_parameters(tiny_profile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["specs", "--profile", str(tiny_profile)]) == 0
    out = capsys.readouterr().out
    assert "weight streaming" in out and "fit error" in out
    # the reference step, timed before, every 16 step points, and after: how steady the machine was
    settings = load_profile(tiny_profile).settings
    reference = settings["reference_step_s"]
    num_steps = len(load_profile(tiny_profile).steps)
    assert len(reference) == 2 + num_steps // 16 and min(reference) > 0
    assert settings["reference_drift"] == pytest.approx(max(reference) / min(reference) - 1)
    assert f"over the profile (+{settings['reference_drift']:.0%}, {len(reference)} timings)" in out


@pytest.mark.parametrize("max_model_len", [512, 2048, 3000, 4096, 8192])
def test_the_default_grid_fits_the_context_and_times_long_whole_prompts(max_model_len: int) -> None:
    from stallfree.engine.profiler import default_grid

    grid = default_grid(64, max_model_len)
    for _kind, decodes, chunks in grid.step_points():
        assert all(c < max_model_len for c in decodes)
        assert all(tokens + before <= max_model_len for tokens, before, _ in chunks)
    whole = [c[0][0] for _k, d, c in grid.step_points() if not d and len(c) == 1 and c[0][1] == 0 and c[0][2]]
    assert whole == [n for n in (2048, 3072) if n < max_model_len]
