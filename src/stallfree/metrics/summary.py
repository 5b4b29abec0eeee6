"""Serving metrics: the SAME code scores simulated runs and measured ones.

Inputs are per-request :class:`RequestRecord` values plus every inter-token latency (ITL) in an
:class:`ItlAccumulator`, stored as weighted samples ``(value, count)``: a simulated step of 12 ms
that decoded 30 streams is one entry ``(0.012, 30)``, so a 100,000-request run stays in flat
memory. Measured runs (the engine, the HTTP benchmark client) build both from raw token
timestamps with :func:`record_from_token_times`, one count per gap.

:func:`summarize` is pure and its keys follow ``vllm bench serve --save-result``; its
definitions are vLLM's: TTFT = first token - arrival; E2EL = finish - arrival; TPOT = (E2EL -
TTFT) / (output tokens - 1) over requests with more than one output token; ITL = every gap
between consecutive tokens of a request; std is the population std; percentiles use numpy's
default linear interpolation, and weighted ITL statistics equal numpy's on the expanded array.
Latency statistics cover completed requests only (finish reason ``length`` or ``stop``); a
metric with no sample (nothing completed; for TPOT and ITL, no request with two tokens) is None,
where vLLM gives 0, which reads as fast. Goodput counts completed requests meeting every SLO.
Parsing SLO strings and reading/writing records as CSV live in :mod:`stallfree.metrics.io`.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

COMPLETED_REASONS = ("length", "stop")
GOODPUT_METRICS = ("ttft", "tpot", "e2el")
PERCENTILES = (90, 99)

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
Summary = dict[str, float | int | None]


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestRecord:
    """What happened to one request, in seconds on the run's clock.

    ``first_token_s`` is None when no token was produced (rejected, failed); ``max_itl_s`` is the
    longest gap between two of its tokens (0 with fewer than two tokens).
    """

    request_id: str
    arrival_s: float
    first_scheduled_s: float | None = None
    first_token_s: float | None
    finish_s: float
    num_prompt_tokens: int
    num_output_tokens: int
    max_itl_s: float = 0.0
    num_preemptions: int = 0
    finish_reason: str = "length"
    num_cached_tokens: int = 0  # prompt tokens the prefix cache held when it was first scheduled

    def __post_init__(self) -> None:
        if problem := self._problem():
            raise ValueError(f"request {self.request_id}: {problem}")

    def _problem(self) -> str | None:
        """What is wrong with this record (None: nothing); made once per request, kept cheap."""
        if (
            min(self.num_prompt_tokens, self.num_output_tokens, self.num_preemptions, self.num_cached_tokens)
            < 0
        ):
            return "token and preemption counts must be >= 0"
        if not self.max_itl_s >= 0:
            return f"max_itl_s must be >= 0, got {self.max_itl_s}"
        if not self.finish_reason:
            return "finish_reason is empty"
        if self.first_token_s is None:
            if self.num_output_tokens:
                return f"{self.num_output_tokens} output tokens but no first_token_s"
            if self.is_completed:
                return f"completed ({self.finish_reason}) without a token"
        ordered = math.isfinite(last := self.arrival_s)
        for t in (self.first_scheduled_s, self.first_token_s, self.finish_s):
            if t is not None:
                ordered = ordered and last <= t and math.isfinite(t)
                last = t
        if ordered:
            return None
        times = [self.arrival_s, self.first_scheduled_s, self.first_token_s, self.finish_s]
        return f"times must be finite and ordered arrival <= first scheduled <= first token <= finish, got {times}"

    @property
    def is_completed(self) -> bool:
        return self.finish_reason in COMPLETED_REASONS


class ItlAccumulator:
    """Inter-token latencies as weighted samples ``(value_s, count)``, appended cheaply.

    Backed by growing ``array.array`` buffers: one entry costs 16 bytes whatever its count.
    """

    __slots__ = ("_counts", "_values_s")

    def __init__(self) -> None:
        self._values_s = array("d")
        self._counts = array("q")

    def add(self, value_s: float, count: int = 1) -> None:
        """``count`` gaps of ``value_s`` each (an entry with count 0 is kept but weighs nothing)."""
        if not 0 <= value_s < math.inf:
            raise ValueError(f"an inter-token latency must be finite and >= 0 s, got {value_s}")
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        self._values_s.append(value_s)
        self._counts.append(count)

    def add_many(self, values_s: npt.ArrayLike, counts: npt.ArrayLike = 1) -> None:
        """Many entries at once; ``counts`` is broadcast against ``values_s``."""
        values = np.asarray(values_s, dtype=np.float64).ravel()
        weights = np.broadcast_to(np.asarray(counts, dtype=np.int64), values.shape)
        if values.size and not (np.all(values >= 0) and np.all(np.isfinite(values))):
            raise ValueError("inter-token latencies must be finite and >= 0 s")
        if weights.size and weights.min() < 0:
            raise ValueError("counts must be >= 0")
        self._values_s.frombytes(np.ascontiguousarray(values).tobytes())
        self._counts.frombytes(np.ascontiguousarray(weights).tobytes())

    @property
    def values_s(self) -> FloatArray:
        return np.frombuffer(self._values_s, dtype=np.float64).copy()

    @property
    def counts(self) -> IntArray:
        return np.frombuffer(self._counts, dtype=np.int64).copy()

    @property
    def num_entries(self) -> int:
        return len(self._values_s)

    @property
    def num_samples(self) -> int:
        """How many gaps the entries stand for."""
        return int(np.frombuffer(self._counts, dtype=np.int64).sum())

    def stats(self) -> dict[str, float]:
        """:func:`weighted_stats` of the entries (read in place, without a copy)."""
        return weighted_stats(
            np.frombuffer(self._values_s, dtype=np.float64), np.frombuffer(self._counts, dtype=np.int64)
        )


def weighted_stats(values: npt.ArrayLike, counts: npt.ArrayLike) -> dict[str, float]:
    """mean, median, std, p90, p99 and max of ``values`` repeated ``counts`` times, as numpy
    gives them on the expanded array (``np.mean``, ``np.median``, ``np.std``, ``np.percentile``);
    all 0 when there is no sample."""
    x = np.asarray(values, dtype=np.float64).ravel()
    w = np.broadcast_to(np.asarray(counts, dtype=np.int64), x.shape)
    keep = w > 0
    x, w = x[keep], w[keep]
    if not x.size:
        return {"mean": 0.0, "median": 0.0, "std": 0.0, **{f"p{p}": 0.0 for p in PERCENTILES}, "max": 0.0}
    order = np.argsort(x, kind="stable")
    x, w = x[order], w[order]
    ends = np.cumsum(w)  # sorted expanded element k is x[searchsorted(ends, k, "right")]
    n = int(ends[-1])

    def element(k: npt.NDArray[np.int64]) -> FloatArray:
        return x[np.searchsorted(ends, k, side="right")]

    # np.sum, not np.dot: BLAS dot sums in an order that depends on its thread count, so the
    # same run scored in a Ray worker (OMP_NUM_THREADS=1) differed in the last bits.
    mean = float(np.sum(x * w) / n)
    stats = {"mean": mean, "median": 0.0, "std": math.sqrt(float(np.sum(w * (x - mean) ** 2)) / n)}
    middle = element(np.array([(n - 1) // 2, n // 2]))
    stats["median"] = float((middle[0] + middle[1]) / 2)
    # numpy's linear method: virtual index (n - 1) * q, lerp between its two neighbours.
    virtual = (n - 1) * (np.array(PERCENTILES, dtype=np.float64) / 100)
    below = np.floor(virtual).astype(np.int64)
    t = virtual - below
    a, b = element(below), element(np.minimum(below + 1, n - 1))
    lerp = np.where(t >= 0.5, b - (b - a) * (1 - t), a + (b - a) * t)
    stats.update({f"p{p}": float(value) for p, value in zip(PERCENTILES, lerp, strict=True)})
    stats["max"] = float(x[-1])
    return stats


def _unweighted_stats(values: Sequence[float]) -> dict[str, float]:
    """The same statistics with numpy itself, exactly as ``vllm bench serve`` computes them."""
    x = np.asarray(values, dtype=np.float64)
    stats = {"mean": float(np.mean(x)), "median": float(np.median(x)), "std": float(np.std(x))}
    stats.update({f"p{p}": float(np.percentile(x, p)) for p in PERCENTILES})
    return stats


def record_from_token_times(
    *,
    request_id: str,
    arrival_s: float,
    token_times_s: Sequence[float],
    num_prompt_tokens: int,
    itl: ItlAccumulator,
    finish_reason: str = "length",
    num_output_tokens: int | None = None,
    finish_s: float | None = None,
    first_scheduled_s: float | None = None,
    num_preemptions: int = 0,
) -> RequestRecord:
    """One request's record from the times its tokens arrived; adds its gaps to ``itl``.

    ``token_times_s`` holds one time per token, or per streamed chunk when a server bundles
    tokens: then pass the server's ``num_output_tokens`` (vLLM's ITL is per chunk too). Gaps of
    requests that did not complete are left out of ``itl``, as vLLM leaves out failed requests.
    ``finish_s`` defaults to the last token time (arrival when there is none).
    """
    times = np.asarray(token_times_s, dtype=np.float64)
    gaps_s = np.diff(times)
    if gaps_s.size and gaps_s.min() < 0:
        raise ValueError(f"request {request_id}: token times go back in time")
    record = RequestRecord(
        request_id=request_id,
        arrival_s=arrival_s,
        first_scheduled_s=first_scheduled_s,
        first_token_s=float(times[0]) if times.size else None,
        finish_s=finish_s if finish_s is not None else float(times[-1]) if times.size else arrival_s,
        num_prompt_tokens=num_prompt_tokens,
        num_output_tokens=len(times) if num_output_tokens is None else num_output_tokens,
        max_itl_s=float(gaps_s.max()) if gaps_s.size else 0.0,
        num_preemptions=num_preemptions,
        finish_reason=finish_reason,
    )
    if record.is_completed:
        itl.add_many(gaps_s)
    return record


def _rate(count: float, duration_s: float) -> float:
    """Per second; 0 when nothing ran (a zero duration comes only with nothing completed)."""
    return count / duration_s if duration_s > 0 else 0.0


def summarize(
    records: Iterable[RequestRecord],
    itl: ItlAccumulator,
    duration_s: float,
    goodput: Mapping[str, float] | None = None,
) -> Summary:
    """vLLM-style summary of a run that lasted ``duration_s``; ``goodput`` maps metric -> SLO in ms
    (see :func:`parse_goodput`); ``request_goodput`` is None without SLOs, as in vLLM. A latency
    with no sample has None for every statistic (vLLM prints 0, which reads as fast): all of them
    with no completed request, TPOT's and ITL's (``max_itl_ms`` too) when none had two tokens."""
    records = list(records)
    done = [r for r in records if r.is_completed]
    # A run where nothing completed may last no time at all (every request rejected on arrival).
    if not (math.isfinite(duration_s) and (duration_s > 0 or (duration_s == 0 and not done))):
        raise ValueError(f"duration must be a positive number of seconds, got {duration_s}")
    ttfts_s = [r.first_token_s - r.arrival_s for r in done if r.first_token_s is not None]
    e2els_s = [r.finish_s - r.arrival_s for r in done]
    # TPOT is 0 for single-token requests when judging goodput, but left out of the statistics.
    all_tpots_s = [
        (r.finish_s - r.first_token_s) / (r.num_output_tokens - 1)
        if r.num_output_tokens > 1 and r.first_token_s is not None
        else 0.0
        for r in done
    ]
    tpots_s = [tpot for tpot, r in zip(all_tpots_s, done, strict=True) if r.num_output_tokens > 1]
    delays_s = [r.first_scheduled_s - r.arrival_s for r in done if r.first_scheduled_s is not None]
    total_input = sum(r.num_prompt_tokens for r in done)
    total_output = sum(r.num_output_tokens for r in done)
    rejected = sum(r.finish_reason == "rejected" for r in records)

    summary: Summary = {
        "duration": duration_s,
        "completed": len(done),
        "rejected": rejected,
        "failed": len(records) - len(done) - rejected,
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": _rate(len(done), duration_s),
        "request_goodput": None,
        "output_throughput": _rate(total_output, duration_s),
        "total_token_throughput": _rate(total_input + total_output, duration_s),
    }
    if goodput:
        per_metric = {"ttft": ttfts_s, "tpot": all_tpots_s, "e2el": e2els_s}
        unknown = sorted(set(goodput) - set(per_metric))
        if unknown:
            raise ValueError(
                f"unknown goodput metric(s) {', '.join(unknown)}; choose from {', '.join(GOODPUT_METRICS)}"
            )
        # Compared in seconds as vLLM does, so borderline requests are judged the same way.
        checks = [
            [value_s <= slo_ms / 1000 for value_s in per_metric[name]] for name, slo_ms in goodput.items()
        ]
        summary["request_goodput"] = _rate(sum(all(row) for row in zip(*checks, strict=True)), duration_s)
    # No sample, no latency: None (null in JSON), never a 0 that reads as fast.
    itl_stats = itl.stats() if done and itl.num_samples else None
    for name, stats in (
        ("ttft", _unweighted_stats(ttfts_s) if ttfts_s else None),
        ("tpot", _unweighted_stats(tpots_s) if tpots_s else None),
        ("itl", itl_stats),
        ("e2el", _unweighted_stats(e2els_s) if e2els_s else None),
    ):
        for stat in ("mean", "median", "std", *(f"p{p}" for p in PERCENTILES)):
            summary[f"{stat}_{name}_ms"] = stats[stat] * 1000 if stats is not None else None
    summary["max_itl_ms"] = itl_stats["max"] * 1000 if itl_stats is not None else None
    delay_stats = _unweighted_stats(delays_s) if delays_s else None
    for stat in ("mean", "median", "p99"):
        summary[f"{stat}_scheduling_delay_ms"] = delay_stats[stat] * 1000 if delay_stats else None
    summary["num_preemptions"] = sum(r.num_preemptions for r in records)
    return summary
