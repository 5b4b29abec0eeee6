"""The one cost-model factory: what each choice picks, and why it says it did."""

from __future__ import annotations

import dataclasses
import json
import pickle
from pathlib import Path

import pytest

from stallfree.costs.choice import CostChoice, pick_cost_model
from stallfree.costs.measured import MeasuredCostModel
from stallfree.costs.roofline import CostModel
from stallfree.costs.vidur import GpuMeasuredCostModel
from stallfree.specs import HARDWARE_PRESETS
from stallfree.specs.step_profile import save_profile
from tests.test_profile_measured import synthetic_profile


def test_auto_picks_the_most_accurate_source_and_says_why(tmp_path: Path) -> None:
    a100 = pick_cost_model(CostChoice(hardware="a100-80gb"))
    assert isinstance(a100.pricer, GpuMeasuredCostModel) and a100.source == "gpu-tables"
    assert (a100.kind, a100.why, a100.model.name) == ("measured", "Vidur's A100 tables; auto", "llama-3-8b")
    h100 = pick_cost_model(CostChoice(hardware="h100-sxm"))
    assert h100.why == "Vidur's H100 tables, Llama-2-7b-hf's curve; auto"  # no Llama-3-8B table: borrowed
    l40s = pick_cost_model(CostChoice(hardware="l40s"))
    assert isinstance(l40s.pricer, CostModel) and (l40s.kind, l40s.source) == ("full", "roofline")
    assert l40s.why == "no measured table for l40s; auto"
    assert pick_cost_model(CostChoice(hardware="h200")).kind == "full"  # a preset, but no shipped table
    # A spec or file that differs from the preset is not priced from its table, whatever its name.
    derated = dataclasses.replace(
        HARDWARE_PRESETS["a100-80gb"], peak_flops_per_s=0.7 * HARDWARE_PRESETS["a100-80gb"].peak_flops_per_s
    )
    assert pick_cost_model(CostChoice(hardware=derated)).source == "roofline"
    path = tmp_path / "a100.json"
    path.write_text(json.dumps(dataclasses.asdict(derated)))
    assert pick_cost_model(CostChoice(hardware=str(path))).source == "roofline"


def test_a_profile_wins_and_brings_its_model_and_dtype(tmp_path: Path) -> None:
    path = str(save_profile(synthetic_profile(), tmp_path / "p.json"))
    pick = pick_cost_model(CostChoice(hardware="l40s", profile=path, model="llama-3-8b"))
    assert isinstance(pick.pricer, MeasuredCostModel) and pick.measured is pick.pricer
    assert (pick.kind, pick.source, pick.dtype_bytes) == ("measured", "profile", 2)
    assert pick.why == f"profile {path}; auto"
    asked = pick_cost_model(
        CostChoice(kind="full", profile=path, model="llama-3-8b")
    )  # a profile implies measured
    assert asked.kind == "measured" and asked.why.endswith("; asked")


def test_asked_kinds_and_their_errors() -> None:
    seed = pick_cost_model(CostChoice(kind="seed", hardware="a100-80gb", model="llama-3-70b", tp=4))
    assert (seed.kind, seed.why, seed.tp, seed.model.name) == ("weights-only", "asked", 4, "llama-3-70b")
    gpu = pick_cost_model(CostChoice(kind="measured", hardware="a100-40gb", model="mistral-7b"))
    assert gpu.source == "gpu-tables" and gpu.why == "Vidur's A100 tables"
    with pytest.raises(ValueError, match="needs a profile"):
        pick_cost_model(CostChoice(kind="measured", hardware="mi300x"))
    # only aiconfigurator-core has L40S tables: why they cannot price llama-3-8b, installed or not
    with pytest.raises(
        ValueError, match=r"aiconfigurator-core (ships no config for llama-3-8b|is not installed)"
    ):
        pick_cost_model(CostChoice(kind="measured", hardware="l40s"))
    with pytest.raises(ValueError, match="unknown cost model"):
        pick_cost_model(CostChoice(kind="exact"))


def test_a_choice_of_names_pickles_and_hashes_for_tune_workers() -> None:
    choice = CostChoice(kind="full", model="llama-3-8b", hardware="h100-sxm", tp=2)
    assert pickle.loads(pickle.dumps(choice)) == choice and hash(choice) == hash(dataclasses.replace(choice))
