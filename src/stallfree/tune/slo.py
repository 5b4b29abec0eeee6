"""Latency SLOs a capacity search must meet, judged on a trial's vLLM-keyed summary.

An :class:`Slo` bounds one summary key from above (``p99_itl_ms <= 100``); :class:`Slos` is the
set every trial must meet. :data:`SLO_FLAGS` is the one table that maps the command line's
names (``tbt_p99_ms`` -> ``--slo-tbt-p99-ms``) to summary keys and units, so the CLI, the YAML
sweep grid and the JSON echo all speak the same names. TBT (time between tokens, Sarathi-Serve's
word) is vLLM's ITL. Invariant: a metric that is missing, or None with nothing completed, fails;
None beside completed requests (TPOT and TBT when no request had two tokens: no gap) is met.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

Metrics = Mapping[str, float | int | None]
STRICT_TBT_MULTIPLE = 5  # Sarathi-Serve's strict P99 TBT SLO: 5 x a decode step without prefill
STRICT_TBT_BATCH, STRICT_TBT_CONTEXT = 32, 4096


@dataclass(frozen=True, slots=True)
class SloFlag:
    """One user-facing SLO name: which summary key it bounds and the unit the user writes."""

    metric: str  # a key of stallfree.metrics.summarize's output, in ms
    label: str
    unit: str  # "ms" or "s"; the summary key is always in ms


SLO_FLAGS: dict[str, SloFlag] = {
    "tbt_p50_ms": SloFlag("median_itl_ms", "P50 TBT", "ms"),
    "tbt_p99_ms": SloFlag("p99_itl_ms", "P99 TBT", "ms"),
    "ttft_p50_ms": SloFlag("median_ttft_ms", "P50 TTFT", "ms"),
    "ttft_p99_ms": SloFlag("p99_ttft_ms", "P99 TTFT", "ms"),
    "tpot_p50_ms": SloFlag("median_tpot_ms", "P50 TPOT", "ms"),
    "tpot_p99_ms": SloFlag("p99_tpot_ms", "P99 TPOT", "ms"),
    "e2el_p99_ms": SloFlag("p99_e2el_ms", "P99 E2E latency", "ms"),
    "e2el_p99_s": SloFlag("p99_e2el_ms", "P99 E2E latency", "s"),
    "sched_delay_p50_s": SloFlag("median_scheduling_delay_ms", "P50 scheduling delay", "s"),
    "sched_delay_p99_s": SloFlag("p99_scheduling_delay_ms", "P99 scheduling delay", "s"),
}


@dataclass(frozen=True, slots=True)
class Slo:
    """``name`` (a key of :data:`SLO_FLAGS`) must stay at or below ``limit`` (in its unit)."""

    name: str
    limit: float

    def __post_init__(self) -> None:
        if self.name not in SLO_FLAGS:
            raise ValueError(f"unknown SLO {self.name!r}; choose from {', '.join(SLO_FLAGS)}")
        if not (math.isfinite(self.limit) and self.limit > 0):
            raise ValueError(f"SLO {self.name} must be a positive number, got {self.limit}")

    @property
    def flag(self) -> SloFlag:
        return SLO_FLAGS[self.name]

    @property
    def limit_ms(self) -> float:
        return self.limit * 1000 if self.flag.unit == "s" else self.limit

    def ratio(self, metrics: Metrics) -> float:
        """Measured / limit: <= 1 meets the SLO; inf when the metric is missing or nothing
        completed; 0 when requests completed without a sample of it (no gap to miss)."""
        value = metrics.get(self.flag.metric)
        if value is None:
            return 0.0 if self.flag.metric in metrics and metrics.get("completed") else math.inf
        return float(value) / self.limit_ms

    def describe(self, metrics: Metrics) -> str:
        """``P99 TBT 131.2 ms (SLO 100 ms)``, in the unit the user gave."""
        value = metrics.get(self.flag.metric)
        scale = 1000.0 if self.flag.unit == "s" else 1.0
        shown = "n/a" if value is None else f"{float(value) / scale:,.4g} {self.flag.unit}"
        return f"{self.flag.label} {shown} (SLO {self.limit:g} {self.flag.unit})"


@dataclass(frozen=True, slots=True)
class Slos:
    """Every SLO a trial must meet (at least one)."""

    slos: tuple[Slo, ...]

    def __post_init__(self) -> None:
        if not self.slos:
            raise ValueError("give at least one SLO")
        names = [s.name for s in self.slos]
        if len(set(names)) != len(names):
            raise ValueError(f"an SLO is given twice: {', '.join(names)}")

    @classmethod
    def from_mapping(cls, limits: Mapping[str, float]) -> Slos:
        return cls(tuple(Slo(name, float(limit)) for name, limit in limits.items()))

    def as_dict(self) -> dict[str, float]:
        return {s.name: s.limit for s in self.slos}

    def violations(self, metrics: Metrics) -> tuple[str, ...]:
        """The names of the SLOs ``metrics`` misses (empty: all met)."""
        return tuple(s.name for s in self.slos if not s.ratio(metrics) <= 1.0)

    def is_met(self, metrics: Metrics) -> bool:
        return not self.violations(metrics)

    def worst_ratio(self, metrics: Metrics) -> float:
        """How far the worst SLO is from its limit (measured / limit): ranks near misses."""
        return max(s.ratio(metrics) for s in self.slos)
