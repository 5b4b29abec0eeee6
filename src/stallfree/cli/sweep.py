"""``stallfree sweep``: a YAML grid of trials to a tidy CSV, resumable; and the flags and helpers
it shares with ``stallfree tune`` (the trial pool, the progress bar, output folders)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from stallfree.cli.common import UsageError, positive_int
from stallfree.tune.sigint import SigintGuard  # light: stdlib only

if TYPE_CHECKING:
    from stallfree.tune.pools import TrialPool


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    s = sub.add_parser(
        "sweep",
        help="run a YAML grid (models x hardware x TP x policies x budgets x QPS or capacity) to CSV",
        description=(
            "Run every trial of a YAML grid and write a tidy CSV of them (trials.csv, one row appended per "
            "trial) plus capacity.csv for capacity searches. Rerunning with the same --out resumes: trials "
            "already in trials.csv are not run again. The grid's cost_model defaults to auto, resolved per "
            "hardware as in tune (measured on an a100-*/h100-* preset or with a profile, else full); the "
            "files record the resolved kind."
        ),
    )
    s.add_argument("grid", help="the YAML grid file")
    s.add_argument(
        "--out", required=True, metavar="DIR", help="output directory (created; resumed if present)"
    )
    add_run_args(s)
    s.set_defaults(handler=run_sweep)


def add_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--backend",
        choices=("local", "ray"),
        default="local",
        help="local process pool (default) or Ray tasks",
    )
    p.add_argument(
        "--workers",
        type=positive_int,
        default=None,
        help="local pool size, or CPUs of a local Ray (default: the number of cores)",
    )
    p.add_argument(
        "--address", help="Ray cluster address (auto, HOST:PORT, ray://HOST:PORT); default: a local Ray"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def trial_pool(args: argparse.Namespace) -> TrialPool:
    from stallfree.tune.pools import make_pool
    from stallfree.tune.trial import run_trial

    if args.address is not None and args.backend != "ray":
        raise UsageError("--address applies to --backend ray only")
    workers = args.workers or os.cpu_count() or 1
    return make_pool(args.backend, run_trial, workers=workers, address=args.address)


def make_dir(path: str, flag: str) -> None:
    """Create an output directory now, so a bad path fails before minutes of trials."""
    from pathlib import Path

    if Path(path).exists() and not Path(path).is_dir():
        raise UsageError(f"{flag} {path} is a file, not a directory")
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(f"{flag} {path}: {error.strerror or error}") from None


def show_progress(args: argparse.Namespace) -> bool:
    return not args.no_progress and sys.stderr.isatty()


def run_sweep(args: argparse.Namespace) -> int:
    # Ctrl-C at any moment: the pool stops and reaps its workers, the rows finished so far stay
    # in trials.csv. The guard records it and raises it where that is safe (each pool call, the
    # checks here), so no C code or callback in between can swallow it.
    with SigintGuard() as sigint:
        try:
            started = time.perf_counter()
            from stallfree.tune.grid import load_grid
            from stallfree.tune.report import duration
            from stallfree.tune.sweep import run_sweep_grid

            grid = load_grid(args.grid)
            make_dir(args.out, "--out")
            sigint.check()
            with trial_pool(args) as backend:
                summary = run_sweep_grid(grid, args.out, backend, progress=show_progress(args))
            sigint.check()
        except KeyboardInterrupt:
            return _sweep_interrupted(Path(args.out) / "trials.csv")
    print(
        f"{summary.num_trials} trials: {summary.num_run} run, {summary.num_resumed} resumed from "
        f"{summary.trials_path}, {summary.num_trials - summary.num_run - summary.num_resumed} repeats "
        f"(the same spec twice) in {duration(time.perf_counter() - started)}"
    )
    print(f"trials:   {summary.trials_path}")
    if summary.capacity_path is not None:
        print(f"capacity: {summary.capacity_path}")
    return 0


def _sweep_interrupted(trials_path: Path) -> int:
    """Say where the finished rows are (a rerun resumes from them); exit code 130 (143 after a SIGTERM)."""
    data = trials_path.read_bytes() if trials_path.is_file() else b""
    rows = max(0, data.count(b"\n") - 1)  # whole lines after the header (a torn one is cut on resume)
    print(
        f"INTERRUPTED: {rows} finished trial{'s' if rows != 1 else ''} in {trials_path}; "
        "rerun the same command to resume from them"
    )
    sys.stdout.flush()
    print("stallfree sweep: interrupted", file=sys.stderr)
    return 130
