"""The machine a benchmark runs on: its CPU in one line, its load average, a wait for quiet.

Every recorded figure names its machine and the load around it (benchmarks/README.md), because
the project's 2-vCPU VMs drift: these are the lines the scripts print for that.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time


def log(message: str) -> None:
    """``message`` on stderr with the wall-clock time, flushed (stdout stays the results)."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def machine() -> str:
    """The CPU's model name (``lscpu``) and the cores this process may use."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown CPU"
    name = next((line.split(":", 1)[1].strip() for line in out.splitlines() if "Model name" in line), "?")
    return f"{name}, {len(os.sched_getaffinity(0))} cores usable"


def loadavg() -> str:
    """The 1, 5 and 15-minute load averages, ``1.00/0.80/0.65``."""
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def wait_for_quiet(max_load: float, max_wait_s: float) -> None:
    """Wait (30 s at a time, at most ``max_wait_s``) until the 1-minute load is at most ``max_load``."""
    deadline = time.monotonic() + max_wait_s
    while os.getloadavg()[0] > max_load and time.monotonic() < deadline:
        log(f"load average {loadavg()} > {max_load}: waiting 30 s")
        time.sleep(30)
