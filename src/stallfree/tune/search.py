"""Capacity search: the highest QPS whose trial meets the SLOs, by bracketing then bisection.

:class:`CapacitySearch` is a small state machine with no I/O and no simulator: it proposes the
next QPS (:meth:`~CapacitySearch.next_qps`) and is told whether a trial there met the SLOs
(:meth:`~CapacitySearch.record`). The caller runs the trials, so many searches can share one
pool of workers and the same results come out whatever order the trials finish in.

1. Bracket: start at ``qps_start``; double while trials pass, halve while they fail, until one
   passing QPS (``lo``) and one failing QPS (``hi``) are known; give up below ``qps_min``
   (capacity 0) or above ``qps_max`` (capacity at least ``qps_max``).
2. Bisect geometrically (``sqrt(lo * hi)``) until ``hi <= lo * (1 + precision)``.

Invariants: every passing QPS is below every failing one (the search assumes passing is
monotone in QPS, which holds for the same seeded requests arriving faster, up to noise);
``capacity_qps`` is the highest QPS that passed, so the true threshold lies in
``[capacity_qps, capacity_qps * (1 + precision))``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SearchConfig:
    """Where to start and when to stop; ``precision`` is relative (0.05: within 5%)."""

    qps_start: float
    precision: float = 0.05
    qps_min: float = 0.01
    qps_max: float = 1000.0

    def __post_init__(self) -> None:
        for label, value in (("qps_start", self.qps_start), ("qps_min", self.qps_min)):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{label} must be a positive number, got {value}")
        if not (math.isfinite(self.qps_max) and self.qps_min <= self.qps_start <= self.qps_max):
            raise ValueError(
                f"need qps_min <= qps_start <= qps_max, got {self.qps_min}, {self.qps_start}, {self.qps_max}"
            )
        if not (math.isfinite(self.precision) and 0 < self.precision < 1):
            raise ValueError(f"precision must be in (0, 1), got {self.precision}")


class CapacitySearch:
    """One (policy, budget)'s search; feed it trial outcomes until :attr:`is_done`."""

    __slots__ = ("_asked", "config", "hi", "lo", "num_trials")

    def __init__(self, config: SearchConfig) -> None:
        self.config = config
        self.lo: float | None = None  # highest QPS that met the SLOs
        self.hi: float | None = None  # lowest QPS that missed them
        self.num_trials = 0
        self._asked: float | None = None

    def next_qps(self) -> float | None:
        """The QPS to try next (the same until recorded), or None when the search is over."""
        if self._asked is None:
            self._asked = self._propose()
        return self._asked

    def next_value(self) -> float | None:
        """:meth:`next_qps`, as a :class:`~stallfree.tune.jobs.Probe` asks."""
        return self.next_qps()

    def record(self, qps: float, passed: bool) -> None:
        if qps != self._asked:
            raise ValueError(f"recorded QPS {qps} was not the one proposed ({self._asked})")
        self._asked = None
        self.num_trials += 1
        if passed:
            self.lo = qps if self.lo is None else max(self.lo, qps)
        else:
            self.hi = qps if self.hi is None else min(self.hi, qps)

    @property
    def is_done(self) -> bool:
        return self.next_qps() is None

    @property
    def capacity_qps(self) -> float:
        """The highest QPS that met the SLOs (0 if none did)."""
        return self.lo or 0.0

    @property
    def hit_qps_max(self) -> bool:
        """The search stopped at ``qps_max`` still passing: capacity is at least that."""
        return self.hi is None and self.lo is not None and self.lo * 2 > self.config.qps_max

    def trials_left_estimate(self) -> int:
        """A guess of the trials still to run (for a progress bar's ETA)."""
        if self.is_done:
            return 0
        if self.lo is None or self.hi is None:
            return 1 + self._bisection_steps(2.0)
        return self._bisection_steps(self.hi / self.lo)

    def _bisection_steps(self, ratio: float) -> int:
        target = math.log1p(self.config.precision)
        return (
            max(0, math.ceil(math.log2(math.log(ratio) / target))) if ratio > 1 + self.config.precision else 0
        )

    def _propose(self) -> float | None:
        # Proposals stay outside [.., lo] and [hi, ..], so a pass is always below every failure.
        c, lo, hi = self.config, self.lo, self.hi
        if lo is None:
            if hi is None:
                return c.qps_start
            return hi / 2 if hi / 2 >= c.qps_min else None
        if hi is None:
            return lo * 2 if lo * 2 <= c.qps_max else None
        return math.sqrt(lo * hi) if hi > lo * (1 + c.precision) else None


class ReplicaSearch:
    """The fewest replicas whose trial meets the SLOs at a fixed traffic rate: from ``start``,
    double while trials fail (halve while they pass) to bracket, then bisect the integers between.
    Assumes a fleet never gets worse with a replica more; gives up past ``max_replicas``."""

    __slots__ = ("_asked", "failed", "max_replicas", "num_trials", "passed", "start")

    def __init__(self, start: int, max_replicas: int) -> None:
        if not 1 <= start <= max_replicas:
            raise ValueError(f"need 1 <= start <= max_replicas, got {start}, {max_replicas}")
        self.start, self.max_replicas = start, max_replicas
        self.failed = 0  # the most replicas that missed the SLOs (0: none tried missed)
        self.passed: int | None = None  # the fewest that met them
        self.num_trials = 0
        self._asked: int | None = None

    def next_value(self) -> float | None:
        if self._asked is None:
            self._asked = self._propose()
        return self._asked

    def record(self, value: float, passed: bool) -> None:
        if value != self._asked:
            raise ValueError(f"recorded {value} replicas, not the {self._asked} proposed")
        self._asked = None
        self.num_trials += 1
        n = int(value)
        if passed:
            self.passed = n if self.passed is None else min(self.passed, n)
        else:
            self.failed = max(self.failed, n)

    @property
    def fewest(self) -> int | None:
        """The fewest replicas that met the SLOs (None: not even ``max_replicas``)."""
        return self.passed

    @property
    def is_done(self) -> bool:
        return self.next_value() is None

    def trials_left_estimate(self) -> int:
        if self.is_done:
            return 0
        span = (self.passed or 2 * max(self.failed, 1)) - self.failed
        return max(1, math.ceil(math.log2(max(span, 2))))

    def _propose(self) -> int | None:
        failed, passed = self.failed, self.passed
        if passed is None:
            if failed == 0:
                return self.start
            return min(2 * failed, self.max_replicas) if failed < self.max_replicas else None
        if failed == 0:
            return passed // 2 if passed > 1 else None
        return (failed + passed) // 2 if passed - failed > 1 else None
