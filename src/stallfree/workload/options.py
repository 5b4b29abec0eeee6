"""What a command line says about a workload, checked and turned into a :class:`Workload`."""

from __future__ import annotations

from dataclasses import dataclass

from stallfree.workload.arrivals import (
    ARRIVAL_NAMES,
    AllAtOnce,
    Arrivals,
    RateProfile,
    ReplayArrivals,
    gamma,
    poisson,
)
from stallfree.workload.lengths import FixedLengths, Lengths, TraceLengths, parse_lengths
from stallfree.workload.requests import Workload
from stallfree.workload.sessions import Sessions
from stallfree.workload.traces import TRACE_NAMES, resolve_trace_path


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadOptions:
    """What a command line says about a workload (``stallfree simulate``/``bench``/``tune``).

    ``arrival``: one of :data:`ARRIVAL_NAMES`; None means ``trace`` when ``trace`` is given, else
    ``poisson``. ``trace`` replays arrival times (and, unless ``lengths`` or fixed tokens are given,
    the same rows' lengths in order). ``lengths``: a trace path or name, ``fixed:P,O``,
    ``uniform:PMIN-PMAX,OMIN-OMAX`` or ``lognormal:PMEDIAN,OMEDIAN[,SIGMA]``; or instead give both
    ``prompt_tokens`` and ``output_tokens``. ``sampling`` applies to trace lengths only. ``turns``
    makes the arrivals start multi-turn sessions (with a shared ``system_prompt_tokens`` and
    ``think_time_s`` between turns) and the lengths each turn's message and answer.
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
    rate_profile: str | None = None
    turns: int | None = None
    system_prompt_tokens: int = 0
    think_time_s: float = 0.0


def workload_from_options(options: WorkloadOptions) -> Workload:
    """Check that the options fit together and build the workload; ValueError says what is wrong."""
    arrival = options.arrival or (
        "trace" if options.trace is not None else "rate-profile" if options.rate_profile else "poisson"
    )
    if arrival not in ARRIVAL_NAMES:
        raise ValueError(f"unknown workload {arrival!r}; choose from {', '.join(ARRIVAL_NAMES)}")
    sessions = None
    if options.turns is not None:
        sessions = Sessions(options.turns, options.system_prompt_tokens, options.think_time_s)
    elif options.system_prompt_tokens or options.think_time_s:
        raise ValueError("a system prompt and think time apply to multi-turn sessions only (give turns)")
    return Workload(
        arrivals=_arrivals_from_options(arrival, options),
        lengths=_lengths_from_options(arrival, options),
        max_prompt_tokens=options.max_prompt_tokens,
        max_total_tokens=options.max_total_tokens,
        sessions=sessions,
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
    if arrival == "rate-profile":
        if options.rate_profile is None:
            raise ValueError("the rate-profile workload needs a profile (a CSV file or diurnal:PEAK,TROUGH)")
        return RateProfile.parse(options.rate_profile)
    if options.rate_profile is not None:
        raise ValueError(f"a rate profile sets the arrivals, which the {arrival} workload does too")
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
