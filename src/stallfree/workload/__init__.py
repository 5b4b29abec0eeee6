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

Modules: :mod:`.arrivals` (when), :mod:`.lengths` (how long), :mod:`.traces` (the shipped
and user trace files), :mod:`.requests` (sampling), :mod:`.sessions` (multi-turn chat),
:mod:`.agents` and :mod:`.agent_traces` (agent sessions: turns that arrive once the turns they wait
for have finished), :mod:`.options` (the command-line form).
Shared by the simulator, the engine and the HTTP benchmark client: stdlib + numpy only.
"""

from stallfree.workload.arrivals import (
    ARRIVAL_NAMES,
    AllAtOnce,
    Arrivals,
    GammaArrivals,
    ReplayArrivals,
    gamma,
    poisson,
)
from stallfree.workload.lengths import (
    SAMPLING_MODES,
    FixedLengths,
    Lengths,
    LognormalLengths,
    TraceLengths,
    UniformLengths,
    cap_lengths,
    parse_lengths,
)
from stallfree.workload.options import WorkloadOptions, workload_from_options
from stallfree.workload.requests import (
    Workload,
    WorkloadArrays,
    generate,
    iter_requests,
    sample,
    sample_sessions,
)
from stallfree.workload.sessions import Sessions, SessionTurns, session_turns
from stallfree.workload.traces import TRACE_NAMES, Trace, load_trace, resolve_trace_path

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
    "SessionTurns",
    "Sessions",
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
    "sample_sessions",
    "session_turns",
    "workload_from_options",
]
