"""How many threads the engine runs with on a CPU other processes share (engine/cpu_share.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stallfree.engine.cpu_share import CoreShare, busy_seconds


class _Machine:
    """A fake clock and CPU-time counters: ``others`` cores busy besides this process's ``own``."""

    def __init__(self) -> None:
        self.now = 0.0
        self.busy = 0.0
        self.own = 0.0
        self.readable = True

    def run(self, seconds: float, others: float, own: float) -> None:
        self.now += seconds
        self.busy += seconds * (others + own)
        self.own += seconds * own

    def share(self, max_threads: int) -> CoreShare:
        share = CoreShare(
            max_threads,
            busy=lambda: self.busy if self.readable else None,
            own=lambda: self.own,
            clock=lambda: self.now,
            window_s=0.5,
        )
        share.num_cpus = 2
        return share


def test_threads_drop_to_the_free_cores_and_climb_back_once_they_free() -> None:
    m = _Machine()
    share = m.share(2)
    m.run(0.6, others=0.0, own=2.0)
    assert share.update() == 2
    m.run(0.6, others=0.7, own=1.3)  # a busy process got 0.7 of a core beside our two threads
    assert share.update() == 1 and share.other_cores == pytest.approx(0.7)
    m.run(0.1, others=0.0, own=1.0)  # within the window: not re-read
    assert share.update() == 1
    m.run(0.6, others=0.4, own=1.0)  # 1.6 free: not enough margin to climb
    assert share.update() == 1
    m.run(0.6, others=0.1, own=1.0)  # 1.9 free
    assert share.update() == 2


def test_never_above_the_configured_threads_nor_below_one() -> None:
    m = _Machine()
    share = m.share(1)
    m.run(0.6, others=0.0, own=1.0)
    assert share.update() == 1
    busy = m.share(2)
    m.run(0.6, others=2.0, own=0.3)
    assert busy.update() == 1


def test_unreadable_counters_keep_the_configured_threads() -> None:
    m = _Machine()
    m.readable = False
    share = m.share(2)
    m.run(0.6, others=2.0, own=0.5)
    assert share.update() == 2


def test_busy_seconds_sums_the_allowed_cpus(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text(
        "cpu  900 0 100 5000 0 0 0 0 0 0\n"
        "cpu0 100 10 20 2500 5 1 2 3 0 0\n"
        "cpu1 800 0 80 2500 0 0 0 0 0 0\n"
        "intr 12345\nctxt 999\n"
    )
    import os

    hz = os.sysconf("SC_CLK_TCK")
    assert busy_seconds({0}, stat) == pytest.approx((100 + 10 + 20 + 1 + 2 + 3) / hz)
    assert busy_seconds({0, 1}, stat) == pytest.approx((136 + 880) / hz)
    assert busy_seconds({0}, tmp_path / "missing") is None
