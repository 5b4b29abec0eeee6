"""Wall time of a 200-trial ``stallfree sweep``: serial vs the local process pool.

The grid: Mistral-7B on one A100-80GB (full cost model), ShareGPT lengths, 2 policies x 4
budgets x 25 QPS values = 200 fixed-rate trials of ``--num-requests`` requests each. The same grid runs serially (one
process) and on a pool of ``--workers`` processes (default: every core), each into its own
output directory; the script checks that both wrote the same trials, byte for byte per row.
Wall and CPU time are printed with the 1-minute load average before each run, and a control
(the same busy loop on 1 and on ``--workers`` processes) says how much parallel speed the
cores had to give at that moment: other work on a shared machine eats the pool's gain, and CPU
time shows what the pool itself costs (spawning workers, importing numpy, loading the trace).

    .venv/bin/python benchmarks/speed/tune_sweep_speed.py [--num-requests 200] [--workers N]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import tempfile
import time
from pathlib import Path

from stallfree.tune.grid import parse_grid
from stallfree.tune.pools import ProcessPool, SerialPool
from stallfree.tune.sweep import run_sweep_grid
from stallfree.tune.trial import run_trial


def _cpu_s() -> float:
    """CPU seconds of this process and of its finished children (the pool's workers)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def _busy(num_steps: int) -> int:
    total = 0
    for i in range(num_steps):
        total += i * i
    return total


def cpu_headroom(workers: int, num_steps: int = 3_000_000) -> float:
    """How many times faster ``workers`` processes run ``2 x workers`` busy loops than one process:
    the most any pool can gain on this machine right now (``workers`` when the cores are idle)."""
    started = time.perf_counter()
    for _ in range(2 * workers):
        _busy(num_steps)
    serial_s = time.perf_counter() - started
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        pool.map(_busy, [num_steps])  # start the workers before timing
        started = time.perf_counter()
        pool.map(_busy, [num_steps] * (2 * workers), chunksize=1)
        pooled_s = time.perf_counter() - started
    return serial_s / pooled_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=200)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    grid = parse_grid(
        {
            "models": ["mistral-7b"],
            "hardware": ["a100-80gb"],
            "policies": ["chunked", "prefill-first"],
            "budgets": [256, 512, 1024, 2048],
            "cost_model": "full",  # the recorded figures' model (a grid's default is auto)
            "workload": {"lengths": "sharegpt", "num_requests": args.num_requests, "seed": 0},
            "qps": [0.5 * (i + 1) for i in range(25)],
        },
        "benchmark grid",
    )
    with tempfile.TemporaryDirectory() as tmp:
        times_s = {}
        for name, backend in (
            ("serial", SerialPool(run_trial)),
            (f"pool of {args.workers}", ProcessPool(run_trial, args.workers)),
        ):
            load = os.getloadavg()[0]
            started, cpu_started = time.perf_counter(), _cpu_s()
            with backend:
                summary = run_sweep_grid(grid, Path(tmp) / name, backend)
            times_s[name] = time.perf_counter() - started
            cpu_s = _cpu_s() - cpu_started
            print(
                f"{name:>12}: {summary.num_run} trials in {times_s[name]:6.1f} s wall, {cpu_s:6.1f} s CPU "
                f"(load average before: {load:.1f})"
            )
        rows = [sorted((Path(tmp) / name / "trials.csv").read_text().splitlines()) for name in times_s]
        assert rows[0] == rows[1], "the pool wrote different trials than the serial run"
    serial_s, pool_s = times_s.values()
    print(f"speed-up: {serial_s / pool_s:.2f}x on {os.cpu_count()} cores; identical trials.csv rows: yes")
    print(
        f"control: a pure-Python busy loop runs {cpu_headroom(args.workers):.2f}x as fast on {args.workers} processes"
    )


if __name__ == "__main__":
    main()
