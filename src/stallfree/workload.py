"""Workloads: an arrival process times a length distribution, sampled into requests.

A :class:`Workload` is a frozen description; :func:`sample` turns it into arrays (arrival times,
prompt lengths, ``max_tokens``) and :func:`generate` / :func:`iter_requests` into
:class:`~stallfree.core.request.Request` objects with ids ``"0"``, ``"1"``, ... Invariants:

- the same (workload, number of requests, seed) gives the same requests, bit for bit;
- arrival times start at 0 s and never decrease;
- arrivals and lengths draw from separate random streams, so changing the QPS of a
  workload keeps its lengths;
- every sampled row becomes a request: ``max_prompt_tokens`` / ``max_total_tokens`` cap lengths,
  they never drop rows (see :func:`cap_lengths`).

Shared by the simulator, the engine and the HTTP benchmark client: stdlib + numpy only.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from stallfree.core.request import Request
from stallfree.traces import TRACE_NAMES, Trace, load_trace, resolve_trace_path
from stallfree.workload_lengths import (
    SAMPLING_MODES,
    FixedLengths,
    Lengths,
    LognormalLengths,
    TraceLengths,
    UniformLengths,
    cap_lengths,
    parse_lengths,
)

__all__ = [
    "ARRIVAL_NAMES",
    "SAMPLING_MODES",
    "TRACE_NAMES",
    "AllAtOnce",
    "Arrivals",
    "FixedLengths",
    "GammaArrivals",
    "Lengths",
    "LognormalLengths",
    "ReplayArrivals",
    "Trace",
    "TraceLengths",
    "UniformLengths",
    "Workload",
    "WorkloadArrays",
    "WorkloadOptions",
    "cap_lengths",
    "gamma",
    "generate",
    "iter_requests",
    "load_trace",
    "parse_lengths",
    "poisson",
    "resolve_trace_path",
    "sample",
    "workload_from_options",
]

ARRIVAL_NAMES = ("poisson", "gamma", "all-at-once", "trace")

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


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


@dataclass(frozen=True, slots=True)
class Workload:
    """Arrivals x lengths, with optional caps on the lengths (applied by :func:`cap_lengths`)."""

    arrivals: Arrivals
    lengths: Lengths
    max_prompt_tokens: int | None = None
    max_total_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.max_prompt_tokens is not None and self.max_prompt_tokens <= 0:
            raise ValueError(f"max_prompt_tokens must be positive, got {self.max_prompt_tokens}")
        if self.max_total_tokens is not None and self.max_total_tokens < 2:
            raise ValueError(
                f"max_total_tokens must be >= 2 (one prompt and one output token), got {self.max_total_tokens}"
            )

    def max_num_requests(self) -> int | None:
        """How many requests the workload can give, when a trace read in order limits it."""
        limits = []
        if isinstance(self.arrivals, ReplayArrivals):
            limits.append(self.arrivals.num_rows())
        if isinstance(self.lengths, TraceLengths) and self.lengths.sampling != "with-replacement":
            limits.append(len(load_trace(self.lengths.trace)))
        return min(limits) if limits else None


@dataclass(frozen=True, slots=True, eq=False)
class WorkloadArrays:
    """A sampled workload as columns; row ``i`` is request ``str(i)``."""

    arrival_time_s: FloatArray
    num_prompt_tokens: IntArray
    max_tokens: IntArray

    def __len__(self) -> int:
        return len(self.arrival_time_s)

    def iter_requests(self, chunk_size: int = 4096) -> Iterator[Request]:
        """Requests one by one; only ``chunk_size`` Python objects exist at a time."""
        for start in range(0, len(self), chunk_size):
            stop = start + chunk_size
            rows = zip(
                self.arrival_time_s[start:stop].tolist(),
                self.num_prompt_tokens[start:stop].tolist(),
                self.max_tokens[start:stop].tolist(),
                strict=True,
            )
            for offset, (arrival_s, num_prompt_tokens, max_tokens) in enumerate(rows):
                yield Request(
                    request_id=str(start + offset),
                    num_prompt_tokens=num_prompt_tokens,
                    max_tokens=max_tokens,
                    arrival_time_s=arrival_s,
                )


def sample(workload: Workload, num_requests: int | None = None, seed: int = 0) -> WorkloadArrays:
    """Draw ``num_requests`` rows (None: every row a trace read in order allows)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a whole number >= 0, got {seed!r}")
    limit = workload.max_num_requests()
    if num_requests is None:
        if limit is None:
            raise ValueError("num_requests is required unless the workload reads a trace in order")
        num_requests = limit
    if num_requests <= 0:
        raise ValueError(f"num_requests must be positive, got {num_requests}")
    if limit is not None and num_requests > limit:
        raise ValueError(f"the workload's trace has {limit} rows; asked for {num_requests} requests")
    arrival_seed, length_seed = np.random.SeedSequence(seed).spawn(2)
    times_s = workload.arrivals.times_s(num_requests, np.random.default_rng(arrival_seed))
    prompts, outputs = workload.lengths.sample(num_requests, np.random.default_rng(length_seed))
    prompts, outputs = cap_lengths(prompts, outputs, workload.max_prompt_tokens, workload.max_total_tokens)
    return WorkloadArrays(arrival_time_s=times_s, num_prompt_tokens=prompts, max_tokens=outputs)


def iter_requests(workload: Workload, num_requests: int | None = None, seed: int = 0) -> Iterator[Request]:
    """Like :func:`generate` without holding every Request at once (the arrays are still built)."""
    return sample(workload, num_requests, seed).iter_requests()


def generate(workload: Workload, num_requests: int | None = None, seed: int = 0) -> list[Request]:
    """The requests of a workload, ordered by arrival; same arguments, same list."""
    return list(iter_requests(workload, num_requests, seed))


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadOptions:
    """What a command line says about a workload (``stallfree simulate``/``bench``/``tune``).

    ``arrival``: one of :data:`ARRIVAL_NAMES`; None means ``trace`` when ``trace`` is given, else
    ``poisson``. ``trace`` replays arrival times (and, unless ``lengths`` or fixed tokens are given,
    the same rows' lengths in order). ``lengths``: a trace path or name, ``fixed:P,O``,
    ``uniform:PMIN-PMAX,OMIN-OMAX`` or ``lognormal:PMEDIAN,OMEDIAN[,SIGMA]``; or instead give both
    ``prompt_tokens`` and ``output_tokens``. ``sampling`` applies to trace lengths only.
    """

    arrival: str | None = None
    qps: float | None = None
    burstiness: float | None = None
    trace: str | None = None
    time_scale: float = 1.0
    lengths: str | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    sampling: str | None = None
    max_prompt_tokens: int | None = None
    max_total_tokens: int | None = None


def workload_from_options(options: WorkloadOptions) -> Workload:
    """Check that the options fit together and build the workload; ValueError says what is wrong."""
    arrival = options.arrival or ("trace" if options.trace is not None else "poisson")
    if arrival not in ARRIVAL_NAMES:
        raise ValueError(f"unknown workload {arrival!r}; choose from {', '.join(ARRIVAL_NAMES)}")
    return Workload(
        arrivals=_arrivals_from_options(arrival, options),
        lengths=_lengths_from_options(arrival, options),
        max_prompt_tokens=options.max_prompt_tokens,
        max_total_tokens=options.max_total_tokens,
    )


def _arrivals_from_options(arrival: str, options: WorkloadOptions) -> Arrivals:
    if options.burstiness not in (None, 1.0) and arrival != "gamma":
        raise ValueError("burstiness applies only to the gamma workload (poisson is burstiness 1)")
    if options.trace is not None and arrival != "trace":
        raise ValueError(
            f"a trace replays arrival times, which the {arrival} workload does not; use lengths=TRACE"
        )
    if options.time_scale != 1.0 and arrival != "trace":
        raise ValueError("time_scale applies only when replaying a trace")
    if arrival in ("poisson", "gamma"):
        if options.qps is None:
            raise ValueError(f"the {arrival} workload needs a qps (or replay a trace's arrivals instead)")
        if arrival == "poisson":
            return poisson(options.qps)
        return gamma(options.qps, 1.0 if options.burstiness is None else options.burstiness)
    if options.qps is not None:
        raise ValueError(f"qps does not apply to the {arrival} workload")
    if arrival == "all-at-once":
        return AllAtOnce()
    if options.trace is None:
        raise ValueError("the trace workload needs a trace (path or one of: " + ", ".join(TRACE_NAMES) + ")")
    resolve_trace_path(options.trace)  # fail early, naming the file
    return ReplayArrivals(trace=options.trace, time_scale=options.time_scale)


def _lengths_from_options(arrival: str, options: WorkloadOptions) -> Lengths:
    fixed = (options.prompt_tokens, options.output_tokens)
    if fixed != (None, None):
        if options.lengths is not None:
            raise ValueError("give either lengths or prompt_tokens/output_tokens, not both")
        if options.prompt_tokens is None or options.output_tokens is None:
            raise ValueError("fixed lengths need both prompt_tokens and output_tokens")
        if options.sampling is not None:
            raise ValueError("sampling applies only to lengths from a trace")
        return FixedLengths(options.prompt_tokens, options.output_tokens)
    if options.lengths is not None:
        return parse_lengths(options.lengths, options.sampling)
    if arrival == "trace" and options.trace is not None:
        return TraceLengths(options.trace, options.sampling or "in-order")
    raise ValueError(
        "say how long requests are: lengths (a trace path or name, fixed:P,O, uniform:PMIN-PMAX,OMIN-OMAX, "
        "lognormal:PMEDIAN,OMEDIAN[,SIGMA]) or prompt_tokens and output_tokens"
    )
