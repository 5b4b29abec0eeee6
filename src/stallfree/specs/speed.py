"""How a machine's speed varies, in one place: what a profile records of it, how a finished
profile is corrected for it, and the factors a simulation varies its steps by.

A shared host can slow every step by tens of percent with no process on it to show for it. A
profile therefore times the same reference steps (a decode batch, bound by memory; a prompt,
bound by compute) before, now and then during, and after its points (:class:`MeasuringLog`):

- :func:`drift` and :func:`reference_spread` say how far those timings moved;
- :func:`correct_drift` is a pass over the finished profile: where a reference step drifted by
  more than :data:`DRIFT_WARNING`, each point's times are scaled to that step's median speed, by
  its time interpolated at the point (:func:`drift_scales`), the two references blended by how
  compute-bound the point is (:func:`compute_share`, :func:`point_scales`);
- :func:`noise_factors` is how the profiled machine's steps varied (repeats of each point,
  reference timings over minutes): the simulator's ``step_noise`` draws each step's factor from
  it (:class:`stallfree.costs.measured.VariedSteps`), and ``validate`` prints its percentiles.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import numpy as np

from stallfree.specs.step_profile import (
    REFERENCES,
    LinearPoint,
    OverheadPoint,
    SamplingPoint,
    StepPoint,
    StepProfile,
)

DRIFT_WARNING = 0.15  # a reference step's slowest / fastest - 1 past which a profile warns and corrects
RIDGE_TOKENS = 64  # tokens a step at which a CPU's matmuls turn compute-bound (measured: 16-64)

_Point = TypeVar("_Point", StepPoint, SamplingPoint, LinearPoint, OverheadPoint)


def drift(times: Sequence[float]) -> float:
    """A reference step's slowest timing over its fastest, less 1: how far the machine's speed moved."""
    return max(times) / min(times) - 1


def reference_spread(settings: Mapping[str, Any]) -> str:
    """How far the profile's reference steps' timings spread: ``"43.0-101.2 ms (decode, +135%,
    9 timings), ..."``; empty for a profile without them."""
    parts = []
    for key, label in REFERENCES.items():
        times = settings.get(key)
        if times:
            parts.append(
                f"{min(times) * 1e3:.1f}-{max(times) * 1e3:.1f} ms ({label}, +{drift(times):.0%}, "
                f"{len(times)} timings)"
            )
    return ", ".join(parts)


def compute_share(num_tokens: int) -> float:
    """How much of a ``num_tokens``-token step's time follows the compute-bound reference step
    rather than the memory-bound one: ``n / (n + RIDGE_TOKENS)`` (half at a CPU's ridge point)."""
    return num_tokens / (num_tokens + RIDGE_TOKENS)


def drift_scales(
    point_at: Sequence[float], probe_at: Sequence[float], probe_s: Sequence[float]
) -> list[float]:
    """Per point measured at time ``point_at[i]``: the factor that brings it to the machine's median
    speed, ``median(probe_s)`` over the reference step's time interpolated at the point (linearly
    between the probes around it; the nearest probe's outside them)."""
    if len(probe_at) != len(probe_s) or not probe_s or sorted(probe_at) != list(probe_at):
        raise ValueError("probe_at must be ascending and as long as probe_s, which must not be empty")
    median = statistics.median(probe_s)
    return [float(median / t) for t in np.interp(point_at, probe_at, probe_s)]


def point_scales(
    point_at: Sequence[float],
    point_tokens: Sequence[int],
    probe_at: Sequence[float],
    reference: Mapping[str, Sequence[float]],
) -> list[float]:
    """Per point (measured at ``point_at[i]``, running ``point_tokens[i]`` tokens): the factor that
    brings it to the machine's median speeds. The ``decode`` and ``prompt`` reference steps'
    :func:`drift_scales` (1 for one that drifted less than ``DRIFT_WARNING``), blended
    geometrically by the point's :func:`compute_share`."""
    ones = [1.0] * len(point_at)
    decode, prompt = (
        drift_scales(point_at, probe_at, times) if drift(times) > DRIFT_WARNING else ones
        for times in (reference["decode"], reference["prompt"])
    )
    shares = [compute_share(n) for n in point_tokens]
    return [d ** (1 - w) * p**w for d, p, w in zip(decode, prompt, shares, strict=True)]


@dataclass(slots=True)
class MeasuringLog:
    """When a profile measured what: each point's midpoint and tokens, in measuring order (steps,
    sampling, linear, overhead), and each timing of the reference steps (``reference[kind][i]``
    taken at ``probe_at[i]``)."""

    reference: dict[str, list[float]]
    probe_at: list[float] = field(default_factory=list)
    point_at: list[float] = field(default_factory=list)
    point_tokens: list[int] = field(default_factory=list)

    def drifts(self) -> dict[str, float]:
        return {kind: drift(times) for kind, times in self.reference.items()}


def correct_drift(profile: StepProfile, timeline: MeasuringLog) -> StepProfile:
    """``profile`` with every point's times brought to the machine's median speeds
    (:func:`point_scales`; factors of 1 on a steady machine), and its settings saying how far the
    references drifted and the range of factors applied (``drift_scale_range``, [1, 1]: none)."""
    scales = point_scales(timeline.point_at, timeline.point_tokens, timeline.probe_at, timeline.reference)
    num_points = len(profile.steps) + len(profile.sampling) + len(profile.linear) + len(profile.overhead)
    if num_points != len(scales):
        raise ValueError(f"the timeline has {len(scales)} points, the profile {num_points}")
    factor = iter(scales)  # in measuring order
    steps = tuple(_scaled(x, next(factor)) for x in profile.steps)
    sampling = tuple(_scaled(x, next(factor)) for x in profile.sampling)
    linear = tuple(_scaled(x, next(factor)) for x in profile.linear)
    overhead = tuple(_scaled(x, next(factor)) for x in profile.overhead)
    drifts = timeline.drifts()
    settings = {
        **profile.settings,
        **{key: timeline.reference[kind] for key, kind in REFERENCES.items()},
        "reference_drift": drifts["decode"],
        "reference_prompt_drift": drifts["prompt"],
        # each point's times were multiplied by a factor in this range (1 = not corrected)
        "drift_scale_range": [min(scales, default=1.0), max(scales, default=1.0)],
    }
    return replace(
        profile,
        settings=settings,
        steps=steps,
        sampling=sampling,
        linear=linear,
        overhead=overhead,
    )


def _scaled(point: _Point, factor: float) -> _Point:
    return replace(point, stats=replace(point.stats, times_s=tuple(t * factor for t in point.stats.times_s)))


def noise_factors(points: Sequence[StepPoint], settings: Mapping[str, Any]) -> np.ndarray:
    """How a machine's step times varied while it was profiled, as factors on a priced step:
    every repeat of each point over its point's median (back-to-back runs of one step), times
    every reference-step timing over its steps' median (the machine's speed over the profile's
    minutes; 1 in a profile without them). Median ~1; on a shared 2-vCPU VM p1 0.56-0.61 and p99
    1.81-1.97 (a steadier machine's profile gives narrower factors)."""
    short = [t / p.stats.median_s for p in points if len(p.stats.times_s) > 1 for t in p.stats.times_s]
    slow = [t / np.median(ts) for key in REFERENCES if (ts := settings.get(key)) for t in ts]
    return np.outer(short or [1.0], slow or [1.0]).ravel()
