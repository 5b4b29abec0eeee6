"""``stallfree sweep``: grid checking, tidy CSV output, resume after an interruption."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from stallfree.cli import main
from stallfree.metrics import Summary
from stallfree.tune.grid import load_grid, parse_grid
from stallfree.tune.pools import SerialPool
from stallfree.tune.sweep import run_sweep_grid
from stallfree.tune.trial import TrialSpec

GRID = """
models: [mistral-7b]
hardware: a100-80gb
tp: [1]
policies: [chunked, prefill-first]
budgets: [512, 256]
workload: {lengths: "fixed:512,16", num_requests: 40, seed: 3}
qps: [1.0, 4.0]
capacity:
  slos: {tbt_p99_ms: 50}
  precision: 0.1
  qps_start: 2.0
"""


def fake_trial(spec: TrialSpec) -> Summary:
    """P99 TBT grows with QPS x budget; prefill-first is twice as bad."""
    factor = 2.0 if spec.serving.policy == "prefill-first" else 1.0
    return {"p99_itl_ms": factor * spec.qps * spec.token_budget / 50, "completed": spec.num_requests}


class Interrupt(Exception):
    pass


def interrupting_after(num_trials: int):  # type: ignore[no-untyped-def]
    calls = []

    def trial(spec: TrialSpec) -> Summary:
        if len(calls) == num_trials:
            raise Interrupt
        calls.append(spec)
        return fake_trial(spec)

    return trial, calls


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_sweep_writes_every_trial_and_the_capacity_table(tmp_path: Path) -> None:
    grid_path = tmp_path / "grid.yaml"
    grid_path.write_text(GRID)
    summary = run_sweep_grid(load_grid(grid_path), tmp_path / "out", SerialPool(fake_trial))
    rows = read_csv(summary.trials_path)
    assert summary.num_resumed == 0 and len(rows) == summary.num_run
    # Fixed-QPS trials the searches also tried are run once and written once.
    assert summary.num_trials > summary.num_run
    assert len({r["key"] for r in rows}) == len(rows)
    fixed = {(r["policy"], r["token_budget"], float(r["qps"])) for r in rows}
    for policy in ("chunked", "prefill-first"):
        for budget in ("256", "512"):
            assert {(policy, budget, 1.0), (policy, budget, 4.0)} <= fixed
    assert all(r["passed"] == str(float(r["p99_itl_ms"]) <= 50) for r in rows)
    assert {r["lengths"] for r in rows} == {"fixed:512,16"} and {r["seed"] for r in rows} == {"3"}

    capacity = read_csv(tmp_path / "out" / "capacity.csv")
    assert [(r["policy"], r["token_budget"]) for r in capacity] == [
        ("chunked", "256"),
        ("chunked", "512"),
        ("prefill-first", "256"),
        ("prefill-first", "512"),
    ]
    for r in capacity:
        true_capacity = 50 * 50 / int(r["token_budget"]) / (2 if r["policy"] == "prefill-first" else 1)
        assert float(r["capacity_qps"]) <= true_capacity < float(r["capacity_qps"]) * 1.1
    assert [r["best"] for r in capacity] == ["True", "False", "True", "False"]


def test_interrupted_sweep_resumes_from_what_it_wrote(tmp_path: Path) -> None:
    grid = parse_grid(__import__("yaml").safe_load(GRID))
    complete = run_sweep_grid(grid, tmp_path / "complete", SerialPool(fake_trial))

    trial, calls = interrupting_after(7)
    with pytest.raises(Interrupt):
        run_sweep_grid(grid, tmp_path / "out", SerialPool(trial))
    trials_path = tmp_path / "out" / "trials.csv"
    assert len(read_csv(trials_path)) == 7
    # Killed while writing a row: the torn line is dropped on resume.
    with trials_path.open("a") as f:
        f.write("mistral-7b,a100-80gb,1,chu")

    trial, calls = interrupting_after(1000)
    resumed = run_sweep_grid(grid, tmp_path / "out", SerialPool(trial))
    assert resumed.num_run == len(calls) == complete.num_run - 7
    assert resumed.num_resumed >= 7  # a written trial two jobs share is resumed by both
    assert sorted(r["key"] for r in read_csv(trials_path)) == sorted(
        r["key"] for r in read_csv(complete.trials_path)
    )
    assert (tmp_path / "out" / "capacity.csv").read_text() == (
        tmp_path / "complete" / "capacity.csv"
    ).read_text()

    # A finished sweep rerun runs nothing.
    trial, calls = interrupting_after(0)
    again = run_sweep_grid(grid, tmp_path / "out", SerialPool(trial))
    assert again.num_run == 0 and again.num_resumed >= complete.num_run and not calls


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "the grid is empty"),
        ("- a\n- b\n", "must be a mapping"),
        ("models: [m\n", "not valid YAML at line"),
        ("hardware: [a100-80gb]\npolicies: [chunked]\nqps: [1]\n", "field 'models' is missing"),
        ("models: []\nhardware: [x]\npolicies: [chunked]\nqps: [1]\n", "field 'models' is empty"),
        (
            "models: [m]\nhardware: [x]\npolicies: [chunked]\nqps: [1]\nmodles: [m]\n",
            "unknown field 'modles'",
        ),
        ("models: [m]\nhardware: [x]\npolicies: [chunked]\ntp: [0]\nqps: [1]\n", "field 'tp'"),
        ("models: [m]\nhardware: [x]\npolicies: [fast]\nqps: [1]\n", "field 'policies': unknown policy"),
        ("models: [m]\nhardware: [x]\npolicies: [chunked]\n", "give field 'qps'"),
        ("models: [m]\nhardware: [x]\npolicies: [chunked]\nqps: [-1]\n", "field 'qps'"),
        ("models: [m]\nhardware: [x]\npolicies: [chunked]\ncapacity: {slos: {}}\n", "field 'capacity.slos'"),
        (
            "models: [m]\nhardware: [x]\npolicies: [chunked]\ncapacity: {slos: {tbt_p95_ms: 1}}\n",
            "unknown SLO 'tbt_p95_ms'",
        ),
        (
            "models: [m]\nhardware: [x]\npolicies: [chunked]\nqps: [1]\nworkload: {num_requests: many}\n",
            "field 'workload.num_requests'",
        ),
        ("models: [m]\nhardware: [x]\npolicies: [chunked]\nqps: [1]\nbudgets: fifty\n", "field 'budgets'"),
    ],
)
def test_bad_grid_names_the_field(
    text: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    grid_path = tmp_path / "grid.yaml"
    grid_path.write_text(text)
    assert main(["sweep", str(grid_path), "--out", str(tmp_path / "out"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert message in err and str(grid_path) in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_sweep_out_must_be_a_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grid_path = tmp_path / "grid.yaml"
    grid_path.write_text(GRID)
    assert main(["sweep", str(grid_path), "--out", str(grid_path), "--no-progress"]) == 2
    assert "is a file, not a directory" in capsys.readouterr().err


def test_sweep_cli_runs_a_small_real_grid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grid_path = tmp_path / "grid.yaml"
    grid_path.write_text(
        "models: [mistral-7b]\nhardware: [a100-80gb]\npolicies: [chunked]\nbudgets: [512]\n"
        "workload: {lengths: 'fixed:256,16', num_requests: 30}\nqps: [2, 4]\n"
    )
    argv = ["sweep", str(grid_path), "--out", str(tmp_path / "out"), "--workers", "1", "--no-progress"]
    assert main(argv) == 0
    assert "2 trials: 2 run, 0 resumed" in capsys.readouterr().out
    rows = read_csv(tmp_path / "out" / "trials.csv")
    assert [float(r["qps"]) for r in rows] == [2.0, 4.0]
    assert all(int(r["completed"]) == 30 for r in rows)
    assert not (tmp_path / "out" / "capacity.csv").exists()
    assert main(argv) == 0
    assert "2 trials: 0 run, 2 resumed" in capsys.readouterr().out


def test_auto_cost_model_is_resolved_per_hardware_and_recorded(tmp_path: Path) -> None:
    text = GRID.replace("hardware: a100-80gb", "hardware: [a100-80gb, l40s]")
    summary = run_sweep_grid(
        parse_grid(__import__("yaml").safe_load(text)), tmp_path / "a", SerialPool(fake_trial)
    )
    kinds = {(r["hardware"], r["cost_model"]) for r in read_csv(summary.trials_path)}
    assert kinds == {("a100-80gb", "measured"), ("l40s", "full")}  # Vidur's A100 tables; none for L40S
    capacity = read_csv(tmp_path / "a" / "capacity.csv")
    assert {(r["hardware"], r["cost_model"]) for r in capacity} == kinds

    named = parse_grid(__import__("yaml").safe_load(text + "cost_model: full\n"))
    summary = run_sweep_grid(named, tmp_path / "b", SerialPool(fake_trial))
    assert {r["cost_model"] for r in read_csv(summary.trials_path)} == {"full"}


def test_measured_without_a_profile_needs_a_gpu_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    grid_path = tmp_path / "grid.yaml"
    grid_path.write_text(
        GRID.replace("hardware: a100-80gb", "hardware: [a100-80gb, mi300x]") + "cost_model: measured\n"
    )
    assert main(["sweep", str(grid_path), "--out", str(tmp_path / "out"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "needs a profile" in err and "mi300x has none" in err and err.count("\n") == 1
