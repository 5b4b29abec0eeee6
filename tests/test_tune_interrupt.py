"""Ctrl-C on the real ``stallfree sweep`` / ``tune``: the pool stops, every worker is reaped,
exit 130 within seconds, and the rows already written are kept (the sweep resumes from them).

Each case runs the CLI as a subprocess and interrupts it at different moments (before the
workers start, while trials run, right after a row lands), to the whole process group as a
terminal does and to the CLI alone as ``timeout -s INT`` does: the race the hang came from."""

from __future__ import annotations

import csv
import re
import subprocess
from pathlib import Path

import pytest

from stallfree.metrics import Summary
from stallfree.tune.trial import TrialSpec
from tests.interrupts import CLI, interrupt, session_pids

# Trials of a few seconds each on two workers (quiet 2-core machine: the whole sweep takes ~20 s), so
# an interrupt 2 s after the workers start lands while some are in flight. The roofline (full)
# keeps these timings independent of the default cost model.
GRID = """
models: [mistral-7b]
hardware: [a100-80gb]
cost_model: full
tp: [1]
policies: [chunked, prefill-first]
budgets: [256, 512, 1024]
workload: {lengths: sharegpt, num_requests: 3000, seed: 0}
qps: [1, 2, 4, 8, 16]
"""


def rows(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def data_rows(path: Path) -> int:
    return len(path.read_text().splitlines()) - 1 if path.exists() else 0


@pytest.mark.parametrize(
    ("when", "whole_group"),
    [
        ("start", True),  # while the workers are still being spawned
        ("running", True),
        ("first-row", True),
        ("first-row", False),  # timeout -s INT: the CLI alone gets the signal
        ("running", False),
    ],
)
def test_sweep_ctrl_c_reaps_workers_exits_130_and_keeps_rows(
    tmp_path: Path, when: str, whole_group: bool
) -> None:
    grid = tmp_path / "grid.yaml"
    grid.write_text(GRID)
    out = tmp_path / "out"
    trials = out / "trials.csv"
    args = ["sweep", str(grid), "--out", str(out), "--workers", "2", "--no-progress"]
    started: list[int] = []

    def spawning() -> bool:  # the first worker process exists: the pool is starting
        return bool(started) and len(session_pids(started[0])) > 1

    ready = {"start": spawning, "running": spawning, "first-row": lambda: data_rows(trials) >= 1}[when]
    delay = {"start": 0.0, "running": 2.0, "first-row": 0.0}[when]
    result = interrupt(args, ready=ready, delay_s=delay, whole_group=whole_group, on_start=started.append)
    assert result.returncode == 130, result.stderr
    assert result.exit_s < 8, f"took {result.exit_s:.1f} s to exit"
    assert not result.survivors, f"processes left running: {result.survivors}"
    assert "Traceback" not in result.stderr, result.stderr
    assert "interrupted" in result.stderr
    kept = rows(trials)
    assert len({r["key"] for r in kept}) == len(kept)

    if when == "first-row" and whole_group:
        # Resume: the kept rows are not run again, and the finished sweep has every trial once.
        done = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert f"{len(kept)} resumed" in done.stdout
        final = rows(trials)
        assert len(final) == 2 * 3 * 5 and len({r["key"] for r in final}) == len(final)
        assert {r["key"] for r in kept} <= {r["key"] for r in final}


def test_tune_ctrl_c_exits_130_without_workers_left() -> None:
    args = [
        "tune",
        "--num-requests",
        "3000",
        "--budgets",
        "256,512,1024,2048",
        "--workers",
        "2",
        "--cost-model",
        "full",
    ]  # ~20 s whole
    result = interrupt([*args, "--no-progress"], delay_s=4.0, whole_group=True)
    assert result.returncode == 130, result.stderr
    assert not result.survivors and "Traceback" not in result.stderr
    assert result.exit_s < 8
    assert re.search(r"^INTERRUPTED: \d of 8 \(policy, budget\) searches had finished", result.stdout, re.M)


def test_tune_ctrl_c_prints_the_budgets_already_finished(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """In process (no timing): Ctrl-C lands at the 12th trial; the search done by then is
    printed with its capacity, the other is not."""
    import stallfree.tune.trial as trial_module
    from stallfree.cli import main

    calls: list[TrialSpec] = []

    def trial(spec: TrialSpec) -> Summary:
        if len(calls) == 11:
            raise KeyboardInterrupt
        calls.append(spec)
        p99 = spec.qps * spec.token_budget / 10  # TBT grows with QPS x budget
        return {
            "p99_itl_ms": p99,
            "median_scheduling_delay_ms": 1.0,
            "completed": 10,
            "total_output_tokens": 99,
        }

    monkeypatch.setattr(trial_module, "run_trial", trial)
    args = ["tune", "--budgets", "256,4096", "--policy", "chunked", "--workers", "1", "--no-progress"]
    code = main([*args, "--slo-tbt-p99-ms", "100", "--qps-start", "4", "--precision", "0.3"])
    out = capsys.readouterr()
    assert code == 130 and "interrupted" in out.err
    assert "INTERRUPTED: 1 of 2 (policy, budget) searches had finished" in out.out
    rows = re.findall(r"^  chunked +([\d,]+) +\d+ +([\d.]+)", out.out, re.M)
    assert len(rows) == 1
    budget, capacity = int(rows[0][0].replace(",", "")), float(rows[0][1])
    assert 1000 / budget / 1.3 < capacity <= 1000 / budget  # the true capacity, within the precision
    assert "best budget per policy of the budgets finished" in out.out


def test_tune_says_why_a_large_chunked_budget_misses_the_strict_tbt_slo() -> None:
    done = subprocess.run(
        [
            *CLI,
            "tune",
            "--num-requests",
            "200",
            "--budgets",
            "512,2048",
            "--policy",
            "chunked",
            "--workers",
            "1",
            "--cost-model",
            "full",  # the roofline's strict SLO: 5 x its 15.4 ms decode step
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    note = done.stdout[done.stdout.index("chunked budgets whose full step") :]
    assert "2,048 (" in note.splitlines()[0] and "512 (" not in note.splitlines()[0]
    assert "P99 TBT SLO of 77 ms" in note
