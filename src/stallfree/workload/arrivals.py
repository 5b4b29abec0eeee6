"""Arrival processes: when each request of a workload arrives.

Each process is a frozen value with ``times_s(num_requests, rng)``: non-decreasing arrival
times starting at 0 s (Poisson/gamma as ``vllm bench serve``, all at once, or a trace's own
timestamps replayed).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from stallfree.workload.traces import load_trace

ARRIVAL_NAMES = ("poisson", "gamma", "all-at-once", "trace")

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


Arrivals = GammaArrivals | AllAtOnce | ReplayArrivals
