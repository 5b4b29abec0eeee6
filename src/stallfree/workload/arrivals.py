"""Arrival processes: when each request of a workload arrives.

Each process is a frozen value with ``times_s(num_requests, rng)``: non-decreasing arrival
times starting at 0 s (Poisson/gamma as ``vllm bench serve``, all at once, or a trace's own
timestamps replayed).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from stallfree.workload.traces import load_trace

ARRIVAL_NAMES = ("poisson", "gamma", "all-at-once", "trace", "rate-profile")

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class GammaArrivals:
    """Gaps drawn from a gamma distribution with mean ``1/qps``, as ``vllm bench serve``.

    ``burstiness`` is the shape (scale ``1/(qps*burstiness)``): 1 is a Poisson process, below 1
    burstier, above 1 more regular. The first request arrives at 0 s.
    """

    qps: float
    burstiness: float = 1.0

    def __post_init__(self) -> None:
        if not (np.isfinite(self.qps) and self.qps > 0):
            raise ValueError(f"qps must be a positive number, got {self.qps}")
        if not (np.isfinite(self.burstiness) and self.burstiness > 0):
            raise ValueError(f"burstiness must be a positive number, got {self.burstiness}")

    def times_s(self, num_requests: int, rng: np.random.Generator) -> FloatArray:
        gaps_s = rng.gamma(self.burstiness, 1.0 / (self.qps * self.burstiness), size=num_requests)
        times_s = np.zeros(num_requests, dtype=np.float64)
        np.cumsum(gaps_s[:-1], out=times_s[1:])
        return times_s


def poisson(qps: float) -> GammaArrivals:
    """Poisson arrivals at ``qps`` requests per second (exponential gaps)."""
    return GammaArrivals(qps=qps, burstiness=1.0)


def gamma(qps: float, burstiness: float) -> GammaArrivals:
    """Gamma-distributed gaps at ``qps``; ``burstiness`` as ``vllm bench serve --burstiness``."""
    return GammaArrivals(qps=qps, burstiness=burstiness)


@dataclass(frozen=True, slots=True)
class AllAtOnce:
    """Every request arrives at 0 s (an offline batch)."""

    def times_s(self, num_requests: int, rng: np.random.Generator) -> FloatArray:
        del rng  # nothing random here
        return np.zeros(num_requests, dtype=np.float64)


@dataclass(frozen=True, slots=True)
class ReplayArrivals:
    """The first rows' ``arrived_at`` of a trace, shifted to start at 0 s, times ``time_scale``.

    ``time_scale`` 0.5 replays twice as fast (double the rate), 2 half as fast.
    """

    trace: str  # a path, or one of TRACE_NAMES
    time_scale: float = 1.0

    def __post_init__(self) -> None:
        if not (np.isfinite(self.time_scale) and self.time_scale > 0):
            raise ValueError(f"time_scale must be a positive number, got {self.time_scale}")

    def num_rows(self) -> int:
        return len(self._arrivals_s())

    def mean_qps(self) -> float:
        """The trace's mean arrival rate over all its rows, at this time scale."""
        arrivals_s = self._arrivals_s()
        span_s = float(arrivals_s[-1] - arrivals_s[0]) * self.time_scale
        return (len(arrivals_s) - 1) / span_s if span_s > 0 else float("inf")

    def times_s(self, num_requests: int, rng: np.random.Generator) -> FloatArray:
        del rng  # replay is deterministic
        arrivals_s = self._arrivals_s()
        if num_requests > len(arrivals_s):
            raise ValueError(
                f"trace {self.trace} has {len(arrivals_s)} rows; asked for {num_requests} requests"
            )
        head_s = arrivals_s[:num_requests]
        times_s: FloatArray = (head_s - head_s[0]) * self.time_scale
        return times_s

    def _arrivals_s(self) -> FloatArray:
        trace = load_trace(self.trace)
        if trace.arrival_time_s is None:
            raise ValueError(
                f"trace {self.trace} has no arrived_at column to replay; use it for lengths with an arrival process"
            )
        return trace.arrival_time_s


DAY_S = 86_400.0


@dataclass(frozen=True, slots=True)
class RateProfile:
    """Poisson arrivals at a rate that changes through the day: ``qps[i]`` requests a second at
    ``at_s[i]`` (from 0 s, increasing), linear in between; past the last point the profile starts
    again (a day's profile repeats, its period the last point's time).

    ``parse``: a CSV file of ``time_s,qps`` rows (a header line allowed), or
    ``diurnal:PEAK,TROUGH[,HOURS]``: a cosine day from ``TROUGH`` at 0 h to ``PEAK`` at half the
    period (24 h by default), in 5-minute points."""

    at_s: tuple[float, ...]
    qps: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.at_s) != len(self.qps) or len(self.at_s) < 2:
            raise ValueError("a rate profile needs at least two (time, rate) points")
        if self.at_s[0] != 0:
            raise ValueError(f"a rate profile starts at 0 s, not {self.at_s[0]:g} s")
        for before, after in itertools.pairwise(self.at_s):
            if not after > before or not np.isfinite(after):
                raise ValueError(f"a rate profile's times must increase: {after:g} s after {before:g} s")
        for rate in self.qps:
            if not (np.isfinite(rate) and rate >= 0):
                raise ValueError(f"a rate must be a number >= 0 requests/s, got {rate}")
        if self.expected_requests() <= 0:
            raise ValueError("a rate profile of zero requests a second brings no request")

    @classmethod
    def parse(cls, spec: str) -> RateProfile:
        if spec.startswith("diurnal:"):
            return cls.diurnal(*_numbers(spec.removeprefix("diurnal:"), spec, 2, 3))
        try:
            lines = [line.strip() for line in Path(spec).read_text().splitlines() if line.strip()]
        except OSError as exc:
            raise ValueError(f"rate profile {spec}: {exc.strerror or exc}") from None
        if lines and not lines[0][0].isdigit():
            lines = lines[1:]  # a header
        rows = [_numbers(line, f"rate profile {spec}", 2, 2) for line in lines]
        return cls(tuple(t for t, _ in rows), tuple(q for _, q in rows))

    @classmethod
    def diurnal(cls, peak_qps: float, trough_qps: float, hours: float = 24.0) -> RateProfile:
        if not 0 <= trough_qps <= peak_qps or not hours > 0:
            raise ValueError(
                f"diurnal: give 0 <= TROUGH <= PEAK requests/s and positive hours, got peak {peak_qps:g}, trough {trough_qps:g}, {hours:g} h"
            )
        at = np.linspace(0.0, hours * 3600, max(2, round(hours * 12)) + 1)
        qps = trough_qps + (peak_qps - trough_qps) * (1 - np.cos(2 * np.pi * at / at[-1])) / 2
        return cls(tuple(float(t) for t in at), tuple(float(q) for q in qps))

    @property
    def period_s(self) -> float:
        return self.at_s[-1]

    def _cumulative(self) -> FloatArray:
        at, qps = np.asarray(self.at_s), np.asarray(self.qps)
        return np.concatenate(([0.0], np.cumsum(np.diff(at) * (qps[:-1] + qps[1:]) / 2)))

    def expected_requests(self) -> float:
        """The requests one period brings on average."""
        return float(self._cumulative()[-1])

    def rate_at(self, time_s: float) -> float:
        return float(np.interp(time_s % self.period_s, self.at_s, self.qps))

    def times_s(self, num_requests: int, rng: np.random.Generator) -> FloatArray:
        """The arrival times of a Poisson process at this rate: unit-rate arrivals mapped through
        the inverse of the profile's cumulative rate (within a segment the rate is linear, so the
        cumulative rate is quadratic and solved exactly)."""
        cumulative = self._cumulative()
        per_period = cumulative[-1]
        units = np.cumsum(rng.exponential(1.0, size=num_requests))
        periods, within = np.divmod(units, per_period)
        at, qps = np.asarray(self.at_s), np.asarray(self.qps)
        seg = np.clip(np.searchsorted(cumulative, within, side="right") - 1, 0, len(at) - 2)
        left, width = at[seg], at[seg + 1] - at[seg]
        a, slope = qps[seg], (qps[seg + 1] - qps[seg]) / width
        need = within - cumulative[seg]
        with np.errstate(divide="ignore", invalid="ignore"):
            quadratic = (np.sqrt(np.maximum(a * a + 2 * slope * need, 0.0)) - a) / slope
            offset = np.where(np.abs(slope) > 1e-12, quadratic, need / np.where(a > 0, a, 1.0))
        times_s: FloatArray = periods * self.period_s + left + np.clip(offset, 0.0, width)
        return times_s


def _numbers(text: str, where: str, least: int, most: int) -> list[float]:
    try:
        values = [float(part) for part in text.split(",")]
    except ValueError:
        values = []
    if not least <= len(values) <= most:
        raise ValueError(
            f"{where}: expected {least}{f'-{most}' if most > least else ''} comma-separated numbers, got {text!r}"
        )
    return values


Arrivals = GammaArrivals | AllAtOnce | ReplayArrivals | RateProfile
