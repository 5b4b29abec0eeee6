"""The GPU cost model from Vidur's shipped operator tables (costs/vidur.py)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from stallfree.core.plan import StepPlan, synthetic_plan
from stallfree.costs.choice import CostChoice
from stallfree.costs.vidur import (
    GPU_FAMILIES,
    SHORT_RUN_STEPS,
    GpuMeasuredCostModel,
    gpu_family,
    load_gpu_table,
)
from stallfree.sim import Deployment, simulate
from stallfree.specs import load_hardware_spec, load_model_spec
from stallfree.workload import Workload, parse_lengths, poisson
from tests.factories import shifted_plans


def _model(name: str = "llama-3-8b", hw: str = "a100-80gb", tp: int = 1) -> GpuMeasuredCostModel:
    return GpuMeasuredCostModel(load_model_spec(name), load_hardware_spec(hw), tp=tp)


def test_shipped_tables_load() -> None:
    for family in GPU_FAMILIES:
        data = load_gpu_table(family)
        assert data["shapes"] and "MIT" in data["licence"]
    assert "2" in load_gpu_table("a100")["all_reduce"]
    assert (
        gpu_family("a100-80gb") == "a100" and gpu_family("h100-sxm") == "h100" and gpu_family("l40s") is None
    )


def test_interpolation_hits_table_points() -> None:
    cost = _model()
    assert cost.measured and "Meta-Llama-3-8B" in cost.source
    entry = next(s for s in load_gpu_table("a100")["shapes"] if s["model"] == "Meta-Llama-3-8B")["tp"]["1"]
    for tokens, linear, other in zip(entry["tokens"], entry["linear_ms"], entry["other_ms"], strict=True):
        assert cost.layer_s(tokens) == pytest.approx((linear + other) * 1e-3, rel=1e-12)


def test_monotone_in_tokens() -> None:
    for cost in (_model(), _model(tp=2), _model("llama-3-8b", "h100-sxm")):
        times = [cost.prefill_time_s(n) for n in range(1, 5000, 7)]
        assert all(b >= a for a, b in itertools.pairwise(times))
        decodes = [cost.decode_step_s(n, 1024) for n in range(1, 257)]
        assert all(b >= a for a, b in itertools.pairwise(decodes))


def test_soft_knee_not_max() -> None:
    # between 64 and 256 tokens a step is neither flat (weight-bound) nor proportional
    cost = _model()
    t64, t128, t256 = (cost.layer_s(n) for n in (64, 128, 256))
    assert t64 < t128 < t256 < 4 * t64


def test_steady_durations_equal_shifted_step_times() -> None:
    cost = _model(tp=2)
    plan = synthetic_plan(12, 900, 256)
    for steps in (9, SHORT_RUN_STEPS + 7):  # priced step by step, and with numpy
        got = cost.steady_durations(plan, steps)
        assert len(got) == steps
        for j, shifted in enumerate(shifted_plans(plan, steps)):
            assert got[j] == cost.step_time_s(shifted)
    assert cost.steady_durations(StepPlan(()), 3).tolist() == [0.0, 0.0, 0.0]


def test_unknown_pair_falls_back_with_its_source() -> None:
    cost = _model("llama-3-8b", "h100-sxm")  # h100 has no Llama-3-8B table
    assert not cost.measured
    assert cost.source.startswith("derived: h100 efficiency curve") and "Llama-2-7b-hf" in cost.source
    assert math.isfinite(cost.decode_step_s(8, 512)) and cost.decode_step_s(8, 512) > 0
    with pytest.raises(ValueError, match="no measured GPU table"):
        _model("llama-3-8b", "l40s")


def test_simulate_uses_it_for_gpu_presets() -> None:
    workload = Workload(arrivals=poisson(2.0), lengths=parse_lengths("fixed:256,16"))
    measured = simulate(
        workload, Deployment(costs=CostChoice(model="mistral-7b", kind="measured")), num_requests=20
    )
    roofline = simulate(
        workload, Deployment(costs=CostChoice(model="mistral-7b", kind="full")), num_requests=20
    )
    assert measured.summary["median_tpot_ms"] > roofline.summary["median_tpot_ms"]
    with pytest.raises(ValueError, match="needs a profile"):
        simulate(workload, Deployment(costs=CostChoice(hardware="mi300x", kind="measured")), num_requests=5)
    assert np.isfinite(measured.summary["median_ttft_ms"])


def test_simulate_auto_is_the_kind_it_picks() -> None:
    workload = Workload(arrivals=poisson(2.0), lengths=parse_lengths("fixed:256,16"))
    auto = simulate(workload, Deployment(costs=CostChoice(model="mistral-7b", kind="auto")), num_requests=20)
    assert (
        auto.summary
        == simulate(
            workload, Deployment(costs=CostChoice(model="mistral-7b", kind="measured")), num_requests=20
        ).summary
    )
    auto = simulate(
        workload,
        Deployment(costs=CostChoice(model="mistral-7b", hardware="l40s", kind="auto")),
        num_requests=20,
    )
    full = simulate(
        workload,
        Deployment(costs=CostChoice(model="mistral-7b", hardware="l40s", kind="full")),
        num_requests=20,
    )
    assert auto.summary == full.summary
