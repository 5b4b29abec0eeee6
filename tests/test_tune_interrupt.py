"""Ctrl-C on the real ``stallfree sweep`` / ``tune``: the pool stops, every worker is reaped,
exit 130 within seconds, and the rows already written are kept (the sweep resumes from them).

Each sweep case runs the CLI as a subprocess and interrupts it at one kind of moment, many times
over (the losses it guards against were races: a Ctrl-C swallowed by numpy's C code while the
grid is checked, raised inside concurrent.futures while a worker spawns, or lost after main
returned), to the whole process group as a terminal does and to the CLI alone as
``timeout -s INT`` does."""

from __future__ import annotations

import csv
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from stallfree.metrics import Summary
from stallfree.tune.trial import TrialSpec
from tests.interrupts import CLI, Interrupted, interrupt, session_pids

# 30 trials of 300 requests on two workers: ~5 s on a quiet 2-core machine, so every interrupt
# below (at most ~1.5 s after the start) lands while the sweep runs.
GRID = """
models: [mistral-7b]
hardware: [a100-80gb]
tp: [1]
policies: [chunked, prefill-first]
budgets: [256, 512, 1024]
workload: {lengths: sharegpt, num_requests: 300, seed: 0}
qps: [1, 2, 4, 8, 16]
"""
NUM_TRIALS = 2 * 3 * 5
# Repeats per moment (~45 s in all): most where the race was (the pool's start-up).
MOMENTS = {"start-up": 8, "0.3 s": 8, "pool start": 16, "1 s": 6, "first row": 6}


def rows(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def data_rows(path: Path) -> int:
    return len(path.read_text().splitlines()) - 1 if path.exists() else 0


def maps(pid: int, name: str) -> bool:
    """Whether process ``pid`` has a file whose path holds ``name`` mapped (a loaded library)."""
    try:
        return name in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def sweep_args(grid: Path, out: Path) -> list[str]:
    return ["sweep", str(grid), "--out", str(out), "--workers", "2", "--no-progress"]


def interrupt_sweep(grid: Path, out: Path, moment: str, repeat: int) -> Interrupted:
    """Start the sweep, Ctrl-C it at ``moment`` (repeats alternate a group's and a lone SIGINT)."""
    trials = out / "trials.csv"
    started: list[int] = []

    def importing() -> bool:  # the CLI has reached main() and imports its commands (numpy)
        return bool(started) and maps(started[0], "numpy")

    def pool_starting() -> bool:  # the pool's first process (multiprocessing's resource tracker)
        return bool(started) and len(session_pids(started[0])) > 1

    ready: Callable[[], bool] | None = {
        "start-up": importing,
        "pool start": pool_starting,
        "first row": lambda: data_rows(trials) >= 1,
    }.get(moment)
    # After the pool's first process: 0-45 ms, across the grid check and the first spawns.
    delay = {"0.3 s": 0.3, "1 s": 1.0, "pool start": 0.015 * (repeat % 4)}.get(moment, 0.0)
    return interrupt(
        sweep_args(grid, out),
        ready=ready,
        delay_s=delay,
        whole_group=repeat % 2 == 0,
        on_start=started.append,
    )


@pytest.mark.parametrize("moment", MOMENTS)
def test_sweep_ctrl_c_at_any_moment_reaps_workers_exits_130_and_keeps_rows(
    tmp_path: Path, moment: str
) -> None:
    grid = tmp_path / "grid.yaml"
    grid.write_text(GRID)
    for repeat in range(MOMENTS[moment]):
        out = tmp_path / f"out{repeat}"
        trials = out / "trials.csv"
        result = interrupt_sweep(grid, out, moment, repeat)
        context = f"{moment}, repeat {repeat}: {result.stderr}"
        assert result.returncode == 130, context
        assert result.exit_s < 5, f"{context} took {result.exit_s:.1f} s to exit"
        assert not result.survivors, f"{context} left processes running: {result.survivors}"
        # One line: no traceback, no "Exception ignored", no resource-tracker warning.
        assert result.stderr in ("stallfree: interrupted\n", "stallfree sweep: interrupted\n"), context
        kept = rows(trials)
        assert len({r["key"] for r in kept}) == len(kept) < NUM_TRIALS, context
        # Once the sweep has started it says where the finished rows are; only a Ctrl-C before
        # that (while the CLI starts: nothing can have finished yet) ends with the line alone.
        if "INTERRUPTED" in result.stdout or moment in ("1 s", "first row"):
            trial_word = "trial" if len(kept) == 1 else "trials"
            assert f"INTERRUPTED: {len(kept)} finished {trial_word} in {trials};" in result.stdout, context
        else:
            assert not kept, context
        if moment == "first row":
            assert kept, context

        if moment == "first row" and repeat == 0:
            # Resume: the kept rows are not run again, and the finished sweep has every trial once.
            done = subprocess.run([*CLI, *sweep_args(grid, out)], capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
            assert f"{len(kept)} resumed" in done.stdout
            final = rows(trials)
            assert len(final) == NUM_TRIALS and len({r["key"] for r in final}) == len(final)
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
