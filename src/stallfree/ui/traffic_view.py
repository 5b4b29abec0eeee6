"""The traffic view's data: one policy through :func:`stallfree.sim.simulate`, reduced for drawing.

The page asks once per policy (the same workload, seed and request count, so every policy
serves the same requests, as ``stallfree simulate --policy a,b`` does), which gives it progress
between policies and lets it cancel. ``summary`` is the simulator's own; the rest only
thins what it measured to what a chart can show: ITL and TTFT CDFs (at most ~:data:`CDF_POINTS`
points, the top 1 % tail kept), every step of a :data:`WINDOW_S`-second window, and the peak KV
usage per time bin. ``num_requests`` is capped so a run stays within a second or two.
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
}

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def traffic_view(query: dict[str, list[str]]) -> dict[str, Any]:
    """``GET /api/simulate``: one policy's run of the page's workload."""
    from stallfree.core import POLICIES
    from stallfree.sim import Deployment, simulate
    from stallfree.specs import HARDWARE_PRESETS, MODEL_PRESETS
    from stallfree.workload import TRACE_NAMES, WorkloadOptions, workload_from_options

    check_known(query, PARAMS)
    policy = choice(query, "policy", DEFAULTS["policy"], tuple(POLICIES))
    qps = number(query, "qps", DEFAULTS["qps"], minimum=0.01, maximum=1000)
    burstiness = number(query, "burstiness", DEFAULTS["burstiness"], minimum=0.05, maximum=100)
    workload = workload_from_options(
        WorkloadOptions(
            arrival="poisson" if burstiness == 1 else "gamma",
            qps=qps,
            burstiness=None if burstiness == 1 else burstiness,
            lengths=choice(query, "lengths", DEFAULTS["lengths"], TRACE_NAMES),
        )
    )
    budget = whole(query, "token_budget", DEFAULTS["token_budget"], minimum=1, maximum=65536)
    deployment = Deployment(
        costs=CostChoice(
            model=choice(query, "model", DEFAULTS["model"], tuple(MODEL_PRESETS)),
            hardware=choice(query, "hardware", DEFAULTS["hardware"], tuple(HARDWARE_PRESETS)),
            tp=whole(query, "tp", DEFAULTS["tp"], minimum=1, maximum=64),
            kind=cast("CostModelKind", choice(query, "cost_model", "full", COST_MODEL_KINDS)),
        ),
        serving=ServingConfig(policy=policy, max_num_batched_tokens=budget),
    )
    result = simulate(
        workload,
        deployment,
        num_requests=whole(query, "num_requests", DEFAULTS["num_requests"], minimum=1, maximum=MAX_REQUESTS),
        seed=whole(query, "seed", DEFAULTS["seed"], minimum=0, maximum=2**31 - 1),
        keep_steps=True,
    )
    steps = result.steps
    assert steps is not None  # keep_steps=True
    starts = np.frombuffer(steps.start_s, dtype=np.float64)
    ends = np.frombuffer(steps.end_s, dtype=np.float64)
    end_s = float(ends[-1])
    window_start = _window_start(query, end_s)
    return {
        "policy": policy,
        "summary": {key: result.summary.get(key) for key in SUMMARY_KEYS},
        "rejected_reasons": result.summary["rejected_reasons"],
        "itl_cdf_ms": _itl_cdf(result.itl.values_s, result.itl.counts),
        "ttft_cdf_ms": _ttft_cdf(result.records),
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
