"""Ctrl-C on the real ``stallfree sweep`` / ``tune``: the pool stops, every worker is reaped,
exit 130 within seconds, and the rows already written are kept (the sweep resumes from them).

Each case runs the CLI as a subprocess and interrupts it at different moments (before the
workers start, while trials run, right after a row lands), to the whole process group as a
terminal does and to the CLI alone as ``timeout -s INT`` does: the race the hang came from."""

from __future__ import annotations

import csv
import subprocess
from pathlib import Path

import pytest

from interrupts import CLI, interrupt

# Trials of ~0.3-1 s each on two workers: an interrupt lands while some are in flight.
GRID = """
models: [mistral-7b]
hardware: [a100-80gb]
tp: [1]
policies: [chunked, prefill-first]
budgets: [256, 512, 1024]
workload: {lengths: sharegpt, num_requests: 300, seed: 0}
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
    ready = {"start": None, "running": None, "first-row": lambda: data_rows(trials) >= 1}[when]
    delay = {"start": 0.8, "running": 3.0, "first-row": 0.0}[when]
    result = interrupt(args, ready=ready, delay_s=delay, whole_group=whole_group)
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
