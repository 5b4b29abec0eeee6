"""``tune --gpus N --mode agg,disagg``: the layouts of N GPUs, the ranking by goodput per GPU,
what binds above capacity, the launch lines, and a search checked against its own simulations."""

from __future__ import annotations

import dataclasses
import json

import pytest

from stallfree.cli import main
from stallfree.costs.choice import CostChoice
from stallfree.costs.kv_transfer import PoolShape
from stallfree.sim.disagg import Disaggregation
from stallfree.tune.jobs import TrialRecord
from stallfree.tune.modes import (
    ModeTuneConfig,
    _to_json,
    layout_name,
    layouts,
    mode_commands,
    mode_searches,
    tune_modes,
)
from stallfree.tune.pools import SerialPool
from stallfree.tune.slo import Slos
from stallfree.tune.trial import TrialSpec, run_trial

SPEC = TrialSpec.of(
    CostChoice(kind="full", model="llama-3.1-8b", hardware="h100-sxm"),
    lengths="fixed:1000,100",
    num_requests=200,
)
SLOS = Slos.from_mapping({"ttft_p99_ms": 500.0, "tpot_p99_ms": 30.0})


def _config(**changes: object) -> ModeTuneConfig:
    fields: dict[str, object] = {
        "base": SPEC,
        "gpus": 4,
        "modes": ("agg", "disagg"),
        "tp_sizes": (1, 2),
        "budgets": (256, 1024),
        "ridge_tokens": 500.0,
        "slos": SLOS,
    }
    return ModeTuneConfig(**{**fields, **changes})  # type: ignore[arg-type]


def test_every_layout_of_the_gpus_is_a_candidate() -> None:
    names = [
        (
            layout_name(s),
            s.token_budget if (d := s.deployment.disaggregate) is None else d.prefill_token_budget,
        )
        for s in layouts(_config())
    ]
    assert names == [
        ("4 x tp1", 256),
        ("4 x tp1", 1024),
        ("2 x tp2", 256),
        ("2 x tp2", 1024),
        # prefill replicas take the budgets at or past the ridge (500): 1024 only
        ("1P3D tp1/tp1", 1024),
        ("2P2D tp1/tp1", 1024),
        ("3P1D tp1/tp1", 1024),
        ("2P1D tp1/tp2", 1024),
        ("1P2D tp2/tp1", 1024),
        ("1P1D tp2/tp2", 1024),
    ]
    assert all(s.num_gpus == 4 for s in layouts(_config()))
    with pytest.raises(ValueError, match="too few"):
        _config(gpus=1, modes=("disagg",))
    with pytest.raises(ValueError, match="--mode"):
        _config(modes=("agg", "pd"))


def _record(job: int, index: int, spec: TrialSpec, qps: float, ttft: float, tpot: float) -> TrialRecord:
    metrics = {"completed": 10, "p99_ttft_ms": ttft, "p99_tpot_ms": tpot, "request_throughput": qps}
    return TrialRecord(job, index, spec.at_qps(qps), metrics, SLOS.is_met(metrics), SLOS.violations(metrics))


def test_layouts_rank_by_qps_a_gpu_and_say_what_binds_above_capacity() -> None:
    config = _config(tp_sizes=(2,), budgets=(1024,), precision=0.99)  # a doubling settles each search
    jobs = mode_searches(config)
    assert [layout_name(j.base) for j in jobs] == ["2 x tp2", "1P1D tp2/tp2"]
    # a hand-built outcome: aggregated passes 4 QPS and misses TPOT at 6; pools pass 8, miss TTFT at 12
    outcomes = {0: [(4.0, 300, 20), (6.0, 400, 45)], 1: [(8.0, 450, 12), (12.0, 900, 14)]}
    trials = []
    for j, job in enumerate(jobs):
        for qps, ttft, tpot in outcomes[j]:
            trials.append(_record(j, len(trials), job.base, qps, ttft, tpot))
        job.probe.lo, job.probe.hi = outcomes[j][0][0], outcomes[j][1][0]  # type: ignore[attr-defined]
    out = _to_json(config, jobs, trials)
    first, second = out["layouts"]
    assert (first["layout"], first["capacity_qps"], first["qps_per_gpu"]) == ("1P1D tp2/tp2", 8.0, 2.0)
    assert (second["layout"], second["qps_per_gpu"], second["binds"]) == ("2 x tp2", 1.0, ["tpot_p99_ms"])
    assert first["binds"] == ["ttft_p99_ms"] and first["at_capacity"]["p99_tpot_ms"] == 12
    best = out["best"]
    assert best["layout"] == "1P1D tp2/tp2" and best["runner_up"]["layout"] == "2 x tp2"
    assert "NixlConnector" in best["commands"]["vllm"]["prefill"]
    assert (
        "--vllm-pd-disaggregation --prefill http://P_0:8001 --decode http://D_0:8001"
        in best["commands"]["vllm"]["router"]
    )
    assert "--disaggregation-mode decode" in best["commands"]["sglang"]["decode"]


def test_launch_lines_give_each_pool_its_tp_and_budget() -> None:
    spec = SPEC.with_serving(256, policy="chunked", max_num_batched_tokens=512).with_deployment(
        costs=dataclasses.replace(SPEC.costs, tp=2),
        disaggregate=Disaggregation(PoolShape(2, 3, 2, 1), prefill_token_budget=4096),
    )
    lines = mode_commands(spec)["vllm"]
    assert (
        "--max-num-batched-tokens 4096" in lines["prefill"] and "--tensor-parallel-size 2" in lines["prefill"]
    )
    assert (
        "--max-num-batched-tokens 512" in lines["decode"] and "--tensor-parallel-size" not in lines["decode"]
    )
    assert lines["router"].count("--prefill ") == 2 and lines["router"].count("--decode ") == 3


def test_the_search_finds_the_capacity_its_simulations_say() -> None:
    config = _config(tp_sizes=(2,), budgets=(1024,), precision=0.2)
    out, interrupted = tune_modes(config, SerialPool(run_trial))
    assert not interrupted
    specs = {layout_name(job.base): job.base for job in mode_searches(config)}
    for row in out["layouts"]:
        if row["capacity_qps"]:
            spec = specs[row["layout"]]
            assert SLOS.is_met(run_trial(spec.at_qps(row["capacity_qps"])))
            assert not SLOS.is_met(run_trial(spec.at_qps(row["capacity_qps"] * 1.2)))
    assert out["best"] is not None


def test_cli_modes(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "tune",
        "--model",
        "llama-3.1-8b",
        "--hardware",
        "h100-sxm",
        "--cost-model",
        "full",
        "--lengths",
        "fixed:1000,100",
    ]
    argv += ["--num-requests", "100", "--budgets", "1024", "--slo-ttft-p99-ms", "500", "--workers", "1"]
    assert main([*argv, "--gpus", "2", "--precision", "0.3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["layout"] for r in out["layouts"]].count("1P1D tp1/tp1") == 1
    assert main([*argv, "--gpus", "2", "--mode", "agg,pd"]) == 2
    assert "--mode" in capsys.readouterr().err
    assert main([*argv, "--kv-link", "ib-400"]) == 2
    assert "applies with --gpus" in capsys.readouterr().err
    assert main([*argv, "--gpus", "2", "--policy", "prefill-first"]) == 2
    assert "--policy does not apply with --gpus" in capsys.readouterr().err
