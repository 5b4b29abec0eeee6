"""How many threads the engine's kernels should use now, on a CPU other processes share.

A step's kernels split their work evenly over the threads of one OpenMP pool and wait for the
slowest. When another process keeps one of the cores busy, the thread on that core gets half of
it in time slices of several milliseconds, and every kernel waits for it while the others spin:
a 2-core machine with one busy process ran 256 decode steps 3.3-3.6x slower on two threads, 1.2x
on one. :class:`CoreShare` reads the CPU time the allowed cores spent busy (``/proc/stat``) less
this process's own (``time.process_time``) over a window, and says how many threads fit in the
cores left: the engine resizes its pool between steps. It only ever lowers the count below the
configured threads, and climbs back once the others have left (with a margin, so it does not
flap). Where ``/proc/stat`` cannot be read it keeps the configured count.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

WINDOW_S = 0.5  # how often the share is re-read (the engine asks every step)
CLIMB_MARGIN = 0.75  # free cores needed above the current threads before adding one
_STAT = Path("/proc/stat")


def busy_seconds(cpus: set[int], stat: Path = _STAT) -> float | None:
    """Seconds the ``cpus`` spent busy since boot (user, nice, system, irq, softirq, steal);
    None where the kernel does not say."""
    try:
        lines = stat.read_text().splitlines()
        hz = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return None
    busy = 0
    for line in lines:
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
            continue
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
        busy += user + nice + system + irq + softirq + steal
    return busy / hz


class CoreShare:
    """The threads to run with now: at most ``max_threads``, at least 1, and no more than the
    allowed cores that other processes left free over the last window."""

    def __init__(
        self,
        max_threads: int,
        *,
        busy: Callable[[], float | None] | None = None,
        own: Callable[[], float] = time.process_time,
        clock: Callable[[], float] = time.monotonic,
        window_s: float = WINDOW_S,
    ) -> None:
        cpus = os.sched_getaffinity(0)
        self.max_threads = max_threads
        self.num_cpus = len(cpus)
        self._busy = busy if busy is not None else lambda: busy_seconds(cpus)
        self._own, self._clock, self._window_s = own, clock, window_s
        self.threads = max_threads
        self.other_cores = 0.0  # what other processes kept busy over the last window
        self._mark = self._read()

    def _read(self) -> tuple[float, float | None, float]:
        return self._clock(), self._busy(), self._own()

    def update(self) -> int:
        """The thread count for the next step (the counters re-read once a window has passed;
        between, a clock read: it runs every step)."""
        then, busy0, own0 = self._mark
        if self._clock() - then < self._window_s:
            return self.threads
        now, busy, own = self._mark = self._read()
        if busy is None or busy0 is None:
            return self.threads
        self.other_cores = max(0.0, (busy - busy0 - (own - own0)) / (now - then))
        free = self.num_cpus - self.other_cores
        want = max(1, min(self.max_threads, int(free + 0.5)))
        if want < self.threads:
            self.threads = want
        elif free >= self.threads + CLIMB_MARGIN:
            self.threads = min(self.max_threads, self.threads + 1)
        return self.threads


class CpuMeter:
    """CPU seconds the rest of the machine (the CPUs this process may run on) used between
    :meth:`start` and :meth:`stop`, so a profile can tell a quiet measurement from one that
    shared its cores. ``None`` where ``/proc/stat`` is unreadable (not Linux)."""

    def __init__(self) -> None:
        self._cpus = os.sched_getaffinity(0)
        self.tick_s = 1.0 / os.sysconf("SC_CLK_TCK")  # /proc/stat's resolution
        self._start: tuple[float, float] | None = None

    @staticmethod
    def num_cpus() -> int:
        return len(os.sched_getaffinity(0))

    def start(self) -> None:
        busy = busy_seconds(self._cpus)
        self._start = None if busy is None else (busy, time.process_time())

    def stop(self) -> float | None:
        """Other processes' CPU seconds since :meth:`start` (>= 0), or None."""
        busy = busy_seconds(self._cpus)
        if self._start is None or busy is None:
            return None
        busy0, own0 = self._start
        return max(0.0, (busy - busy0) - (time.process_time() - own0))
