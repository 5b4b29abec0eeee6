"""The traffic view's data: one policy through :func:`stallfree.sim.simulate`, reduced for drawing.

The page asks once per policy (the same workload, seed and request count, so every policy
serves the same requests, as ``stallfree simulate --policy a,b`` does), which gives it progress
between policies and lets it cancel. ``summary`` is the simulator's own; the rest only
thins what it measured to what a chart can show: ITL and TTFT CDFs (at most ~:data:`CDF_POINTS`
points, the top 1 % tail kept), every step of a :data:`WINDOW_S`-second window, and the peak KV
usage per time bin. ``num_requests`` is capped so a run stays within a second or two.

A day: ``rate_profile`` (``diurnal:PEAK,TROUGH[,HOURS]``, in place of ``qps``) brings a changing
rate, and ``autoscale`` (a rule as ``simulate --autoscale`` takes, with ``min_replicas``,
``max_replicas``, ``startup_s``) resizes the fleet; such a run keeps no steps, so in place of the
batch and KV charts it answers ``day``: the fleet's steps, the decisions, and the windows of
``window_s`` (arrivals, the share meeting ``goodput``'s SLOs), as ``simulate --autoscale`` prints.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import numpy as np
import numpy.typing as npt

from stallfree.core.serving import ServingConfig
from stallfree.costs import COST_MODEL_KINDS
from stallfree.costs.choice import DEFAULT_HARDWARE, DEFAULT_MODEL, CostChoice
from stallfree.ui.errors import ApiError, check_known, choice, number, one_value, whole

if TYPE_CHECKING:
    from stallfree.costs import CostModelKind
    from stallfree.metrics import RequestRecord
    from stallfree.sim import SimulationResult
    from stallfree.sim.deployment import Autoscale
    from stallfree.workload import Workload

MAX_REQUESTS = 5000
CDF_POINTS = 300
WINDOW_S = 3.0
MAX_WINDOW_STEPS = 3000
KV_BINS = 200
SUMMARY_KEYS = (
    "completed",
    "rejected",
    "duration",
    "request_throughput",
    "output_throughput",
    "mean_ttft_ms",
    "p99_ttft_ms",
    "median_itl_ms",
    "p99_itl_ms",
    "max_itl_ms",
    "p99_tpot_ms",
    "num_preemptions",
    "num_kv_blocks",
)
DAY_PARAMS = ("min_replicas", "max_replicas", "startup_s", "window_s", "goodput")  # with autoscale
PARAMS = (
    "model",
    "hardware",
    "tp",
    "cost_model",
    "policy",
    "lengths",
    "qps",
    "burstiness",
    "num_requests",
    "token_budget",
    "seed",
    "window_start_s",
    "rate_profile",
    "autoscale",
    *DAY_PARAMS,
)
DEFAULTS: dict[str, Any] = {
    "model": DEFAULT_MODEL,
    "hardware": DEFAULT_HARDWARE,
    "tp": 1,
    "cost_model": "full",
    "policy": "chunked",
    "lengths": "arxiv",
    "qps": 2.0,
    "burstiness": 1.0,
    "num_requests": 500,
    "token_budget": 512,
    "seed": 0,
    "min_replicas": 1,
    "max_replicas": 4,
    "startup_s": 30.0,
    "window_s": 30.0,
    "goodput": "",  # none: the day's windows are not judged
}

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def traffic_view(query: dict[str, list[str]]) -> dict[str, Any]:
    """``GET /api/simulate``: one policy's run of the page's workload."""
    from stallfree.core import POLICIES
    from stallfree.sim import Deployment, simulate
    from stallfree.specs import HARDWARE_PRESETS, MODEL_PRESETS
    from stallfree.workload import sample

    check_known(query, PARAMS)
    policy = choice(query, "policy", DEFAULTS["policy"], tuple(POLICIES))
    workload = _workload(query)
    budget = whole(query, "token_budget", DEFAULTS["token_budget"], minimum=1, maximum=65536)
    autoscale = _autoscale(query)
    deployment = Deployment(
        costs=CostChoice(
            model=choice(query, "model", DEFAULTS["model"], tuple(MODEL_PRESETS)),
            hardware=choice(query, "hardware", DEFAULTS["hardware"], tuple(HARDWARE_PRESETS)),
            tp=whole(query, "tp", DEFAULTS["tp"], minimum=1, maximum=64),
            kind=cast("CostModelKind", choice(query, "cost_model", "full", COST_MODEL_KINDS)),
        ),
        serving=ServingConfig(policy=policy, max_num_batched_tokens=budget),
        replicas=1 if autoscale is None else autoscale.min_replicas,  # a day starts at the floor
        autoscale=autoscale,
    )
    requests = sample(
        workload,
        whole(query, "num_requests", DEFAULTS["num_requests"], minimum=1, maximum=MAX_REQUESTS),
        whole(query, "seed", DEFAULTS["seed"], minimum=0, maximum=2**31 - 1),
    )
    span_s = float(requests.arrival_time_s[-1] - requests.arrival_time_s[0])
    if autoscale is not None and autoscale.startup_s >= span_s:
        raise ApiError(
            f"startup_s {autoscale.startup_s:g} is longer than the run's {span_s:,.0f} s of arrivals: no "
            "replica the autoscaler adds would serve (more requests, or a shorter start-up)",
            param="startup_s",
        )
    day = None  # an autoscaled run's SLOs and windows, checked before it runs
    if autoscale is not None:
        day = (_goodput(query), number(query, "window_s", DEFAULTS["window_s"], minimum=1, maximum=86_400))
    result = simulate(requests, deployment, keep_steps=True)
    view = {
        "policy": policy,
        "summary": {key: result.summary.get(key) for key in SUMMARY_KEYS},
        "rejected_reasons": result.summary["rejected_reasons"],
        "itl_cdf_ms": _itl_cdf(result.itl.values_s, result.itl.counts),
        "ttft_cdf_ms": _ttft_cdf(result.records),
    }
    if day is not None:  # an autoscaled fleet keeps no steps: its day in their place
        return {**view, "day": _day(result, *day), "end_s": result.summary["duration"]}
    steps = result.steps
    assert steps is not None  # keep_steps=True, one replica
    starts = np.frombuffer(steps.start_s, dtype=np.float64)
    ends = np.frombuffer(steps.end_s, dtype=np.float64)
    end_s = float(ends[-1])
    window_start = _window_start(query, end_s)
    return {
        **view,
        "batch": _window(
            starts,
            ends,
            np.frombuffer(steps.num_decode_tokens, dtype=np.int64),
            np.frombuffer(steps.num_prefill_tokens, dtype=np.int64),
            window_start,
        ),
        "kv": _kv_usage(ends, np.frombuffer(steps.kv_blocks_used, dtype=np.int64), result.kv.num_blocks),
        "end_s": end_s,
    }


def _workload(query: dict[str, list[str]]) -> Workload:
    """Poisson (or gamma, ``burstiness``) at ``qps``, or a ``rate_profile`` in its place."""
    from stallfree.workload import TRACE_NAMES, WorkloadOptions, workload_from_options

    lengths = choice(query, "lengths", DEFAULTS["lengths"], TRACE_NAMES)
    profile = one_value(query, "rate_profile")
    if profile:
        for name in ("qps", "burstiness"):
            if one_value(query, name) not in (None, ""):
                raise ApiError(f"{name} does not apply with rate_profile (it sets the rate)", param=name)
        if not profile.startswith("diurnal:"):  # a file path is the command line's, not the page's
            raise ApiError(
                f"rate_profile: expected diurnal:PEAK,TROUGH[,HOURS], got {profile!r}", param="rate_profile"
            )
        try:
            return workload_from_options(WorkloadOptions(rate_profile=profile, lengths=lengths))
        except ValueError as exc:
            raise ApiError(f"rate_profile: {exc}", param="rate_profile") from None
    qps = number(query, "qps", DEFAULTS["qps"], minimum=0.01, maximum=1000)
    burstiness = number(query, "burstiness", DEFAULTS["burstiness"], minimum=0.05, maximum=100)
    return workload_from_options(
        WorkloadOptions(
            arrival="poisson" if burstiness == 1 else "gamma",
            qps=qps,
            burstiness=None if burstiness == 1 else burstiness,
            lengths=lengths,
        )
    )


def _autoscale(query: dict[str, list[str]]) -> Autoscale | None:
    """``autoscale`` and its bounds (None without it; its other parameters then refused)."""
    from stallfree.sim.deployment import Autoscale

    rule = one_value(query, "autoscale")
    if not rule:
        for name in DAY_PARAMS:
            if one_value(query, name) not in (None, ""):
                raise ApiError(f"{name} applies with autoscale", param=name)
        return None
    if one_value(query, "window_start_s") not in (None, ""):
        raise ApiError("window_start_s: an autoscaled fleet keeps no steps to show", param="window_start_s")
    low = whole(query, "min_replicas", DEFAULTS["min_replicas"], minimum=1, maximum=64)
    high = whole(query, "max_replicas", DEFAULTS["max_replicas"], minimum=1, maximum=64)
    startup_s = number(query, "startup_s", DEFAULTS["startup_s"], minimum=0, maximum=86_400)
    try:
        return Autoscale(rule, low, high, startup_s)
    except ValueError as exc:
        raise ApiError(f"autoscale: {exc}", param="autoscale") from None


def _goodput(query: dict[str, list[str]]) -> dict[str, float] | None:
    from stallfree.metrics.io import parse_goodput

    text = one_value(query, "goodput")
    try:
        return parse_goodput(text) if text else None
    except ValueError as exc:
        raise ApiError(f"goodput: {exc}", param="goodput") from None


def _day(result: SimulationResult, goodput: dict[str, float] | None, window_s: float) -> dict[str, Any]:
    """The day chart's data: the fleet as steps ``[time_s, ready, on_gpus]``, the decisions
    ``[time_s, current, desired]``, and each window's ``[start_s, arrivals, share meeting the SLOs]``
    (None without SLOs or completed requests), as ``simulate --autoscale`` prints them."""
    from stallfree.sim.day_report import day_windows, fleet_steps

    a = result.summary["autoscale"]
    windows = day_windows(result.records, a, window_s, goodput)
    return {
        "rule": a["rule"],
        "window_s": window_s,
        "gpu_hours": a["gpu_hours"],
        "fleet": [list(point) for point in fleet_steps(a, result.summary["duration"])],
        "events": [[e["time_s"], e["current"], e["desired"]] for e in a["events"]],
        "windows": [[w["start_s"], w["arrivals"], w["slo_attainment"]] for w in windows],
    }


def _window_start(query: dict[str, list[str]], end_s: float) -> float:
    if one_value(query, "window_start_s") in (None, ""):
        return max(0.0, end_s / 2 - WINDOW_S / 2)
    start = number(query, "window_start_s", 0.0, minimum=0, maximum=1e9)
    if start >= end_s:
        raise ApiError(
            f"window_start_s {start:g} is past the end of the run ({end_s:,.1f} s)", param="window_start_s"
        )
    return start


def _thin(x: FloatArray, y: FloatArray) -> list[list[float]]:
    """At most ~CDF_POINTS points: evenly spread, plus the top 1 % tail, plus the last point."""
    if x.size > CDF_POINTS:
        spread = np.linspace(0, x.size - 1, CDF_POINTS).astype(np.int64)
        tail = np.flatnonzero(y >= 0.99)[-CDF_POINTS:]
        keep = np.unique(np.concatenate([spread, tail, [x.size - 1]]))
        x, y = x[keep], y[keep]
    return [[float(a), float(b)] for a, b in zip(x, y, strict=True)]


def _itl_cdf(values_s: FloatArray, counts: IntArray) -> list[list[float]]:
    keep = counts > 0
    if not keep.any():
        return []
    order = np.argsort(values_s[keep], kind="stable")
    weights = counts[keep][order]
    return _thin(values_s[keep][order] * 1e3, np.cumsum(weights) / weights.sum())


def _ttft_cdf(records: list[RequestRecord]) -> list[list[float]]:
    ttfts = np.sort(
        [
            (r.first_token_s - r.arrival_s) * 1e3
            for r in records
            if r.is_completed and r.first_token_s is not None
        ]
    )
    return _thin(ttfts, np.arange(1, ttfts.size + 1) / ttfts.size) if ttfts.size else []


def _window(
    starts: FloatArray, ends: FloatArray, decode: IntArray, prompt: IntArray, start_s: float
) -> dict[str, Any]:
    """Every step row overlapping [start_s, start_s + WINDOW_S]: [start_s, end_s, decode, prompt]."""
    shown = np.flatnonzero((ends > start_s) & (starts < start_s + WINDOW_S))[:MAX_WINDOW_STEPS]
    return {
        "start_s": start_s,
        "end_s": start_s + WINDOW_S,
        "steps": [[float(starts[i]), float(ends[i]), int(decode[i]), int(prompt[i])] for i in shown],
    }


def _kv_usage(ends: FloatArray, used: IntArray, num_blocks: int) -> dict[str, Any]:
    """The peak share of KV blocks in use in each of KV_BINS time bins."""
    edges = np.linspace(0.0, float(ends[-1]), KV_BINS + 1)
    which = np.clip(np.searchsorted(edges, ends, side="left") - 1, 0, KV_BINS - 1)
    peak = np.zeros(KV_BINS)
    np.maximum.at(peak, which, used / num_blocks)
    mids = (edges[:-1] + edges[1:]) / 2
    return {
        "num_blocks": num_blocks,
        "points": [[float(t), float(p) * 100] for t, p in zip(mids, peak, strict=True)],
    }
