"""Traffic classes: several kinds of traffic in one run, each with its own lengths, rate, priority
and SLOs (people chatting beside a batch job, say).

A :class:`TrafficClasses` samples each class as its own :class:`~stallfree.workload.Workload` over
the same stretch of time and merges them by arrival: request ids ``"0"``, ``"1"``, ... in arrival
order, each :class:`~stallfree.core.request.Request` carrying its class's ``priority`` (what the
``priority`` scheduling policy orders by) and ``traffic_class`` (what per-class metrics group by).
Class ``i`` draws from seed ``seed + i``, so changing one class's rate keeps the others' requests.

On the command line a class is ``NAME:key=value,...`` (:func:`parse_class`) with keys ``lengths``
(as ``--lengths`` takes it), ``qps``, ``burstiness`` (gamma arrivals; default Poisson), or
``trace`` (a trace's own arrivals, and its lengths and prefix hashes unless ``lengths`` is given:
the class's rate is the trace's), ``priority`` (an integer; lower runs first), SLOs in ms for
its goodput: ``ttft``, ``tpot``, ``e2el``, and multi-turn sessions (:mod:`stallfree.workload.sessions`):
``turns`` (arrivals then start sessions of that many turns, lengths are each turn's new message
and answer), ``system`` (a system prompt of that many tokens, the same in every session of the
class and no other's) and ``think`` (seconds between a session's turns). :func:`class_summaries`
scores a run per class (the simulator's and ``bench``'s).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from stallfree.core.request import PromptBlocks, Request
from stallfree.metrics import ItlAccumulator, RequestRecord, summarize
from stallfree.metrics.summary import GOODPUT_METRICS
from stallfree.workload.arrivals import GammaArrivals, ReplayArrivals, gamma, poisson
from stallfree.workload.lengths import TraceLengths, parse_lengths
from stallfree.workload.requests import Workload, sample
from stallfree.workload.sessions import Sessions, renumbered

SESSION_KEYS = ("turns", "system", "think")
CLASS_KEYS = ("lengths", "qps", "burstiness", "trace", "priority", *GOODPUT_METRICS, *SESSION_KEYS)
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")


@dataclass(frozen=True, slots=True)
class TrafficClass:
    """One kind of traffic: its workload (Poisson or gamma arrivals, or a trace's: a known rate),
    priority and SLOs (metric -> ms, as ``--goodput`` takes them)."""

    name: str
    workload: Workload
    priority: int = 0
    slos: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"class name {self.name!r}: use letters, digits and _ (starting with a letter)")
        if not isinstance(self.workload.arrivals, GammaArrivals | ReplayArrivals):
            raise ValueError(
                f"class {self.name}: arrivals at a rate (Poisson or gamma) or a trace's, not {self.workload.arrivals}"
            )
        unknown = sorted(set(self.slos) - set(GOODPUT_METRICS))
        if unknown:
            raise ValueError(
                f"class {self.name}: unknown SLO {', '.join(unknown)}; choose from {', '.join(GOODPUT_METRICS)}"
            )

    @property
    def turns(self) -> int:
        """Requests a session (1 without sessions)."""
        return 1 if self.workload.sessions is None else self.workload.sessions.turns

    @property
    def qps(self) -> float:
        """The class's mean request rate (requests a second: its arrivals', a trace's over all its
        rows, times its sessions' turns)."""
        arrivals = self.workload.arrivals
        if isinstance(arrivals, ReplayArrivals):
            return arrivals.mean_qps() * self.turns
        assert isinstance(arrivals, GammaArrivals)  # checked when made
        return arrivals.qps * self.turns

    def scaled(self, factor: float) -> TrafficClass:
        """This class at ``factor`` times its rate (a trace replayed ``factor`` times as fast)."""
        arrivals = self.workload.arrivals
        if isinstance(arrivals, ReplayArrivals):
            faster = replace(
                self.workload, arrivals=replace(arrivals, time_scale=arrivals.time_scale / factor)
            )
        else:
            assert isinstance(arrivals, GammaArrivals)  # checked when made
            faster = replace(
                self.workload, arrivals=GammaArrivals(arrivals.qps * factor, arrivals.burstiness)
            )
        return replace(self, workload=faster)


@dataclass(frozen=True, slots=True)
class TrafficClasses:
    """Classes sampled together (see the module docstring)."""

    classes: tuple[TrafficClass, ...]

    def __post_init__(self) -> None:
        if not self.classes:
            raise ValueError("no traffic class given")
        names = [c.name for c in self.classes]
        if len(set(names)) != len(names):
            raise ValueError(f"class names must differ, got {', '.join(names)}")

    @property
    def qps(self) -> float:
        return sum(c.qps for c in self.classes)

    def scaled(self, factor: float) -> TrafficClasses:
        """Every class at ``factor`` times its rate (arrivals of the same shape)."""
        return TrafficClasses(tuple(c.scaled(factor) for c in self.classes))

    def by_name(self, name: str) -> TrafficClass:
        for c in self.classes:
            if c.name == name:
                return c
        raise ValueError(f"unknown class {name!r}; the classes are {', '.join(c.name for c in self.classes)}")

    def counts(self, num_requests: int) -> list[int]:
        """How many of about ``num_requests`` requests each class gets: its share by rate in whole
        sessions, at least one."""
        if num_requests <= 0:
            raise ValueError(f"num_requests must be positive, got {num_requests}")
        return [max(1, round(num_requests * c.qps / self.qps / c.turns)) * c.turns for c in self.classes]

    def sample(self, num_requests: int, seed: int = 0) -> list[Request]:
        """:meth:`counts` requests of each class over the same time, merged by arrival (ties: the
        class given first). Sessions are numbered on from one sessions class to the next, so no
        class's prompt shares another's system prompt or turns, and their ids carry the class's name."""
        rows: list[tuple[float, int, int, int, TrafficClass, PromptBlocks | None, str | None]] = []
        first_session = 0  # sessions numbered on across classes: no two share a token id
        for index, (c, count) in enumerate(zip(self.classes, self.counts(num_requests), strict=True)):
            arrays = sample(c.workload, count, seed + index)
            blocks: Sequence[PromptBlocks | None] = arrays.prompt_blocks or (None,) * len(arrays)
            sessions: Sequence[str | None] = (None,) * len(arrays)
            if arrays.session is not None:
                blocks = [b and renumbered(b, first_session) for b in blocks]
                sessions = [f"{c.name}-session-{n}" for n in arrays.session.tolist()]
                first_session += count // c.turns
            rows += zip(
                arrays.arrival_time_s.tolist(),
                [index] * len(arrays),
                arrays.num_prompt_tokens.tolist(),
                arrays.max_tokens.tolist(),
                [c] * len(arrays),
                blocks,
                sessions,
                strict=True,
            )
        order = sorted(range(len(rows)), key=lambda k: (rows[k][0], rows[k][1]))  # stable: ties keep order
        return [
            Request(
                request_id=str(i),
                num_prompt_tokens=rows[k][2],
                max_tokens=rows[k][3],
                arrival_time_s=rows[k][0],
                prompt_blocks=rows[k][5],
                session_id=rows[k][6],
                priority=rows[k][4].priority,
                traffic_class=rows[k][4].name,
            )
            for i, k in enumerate(order)
        ]


def parse_class(text: str) -> TrafficClass:
    """``chat:lengths=sharegpt,qps=4,priority=0,ttft=500``; ValueError says what is wrong. A
    value may hold commas (``lengths=fixed:512,128``): a piece without ``=`` continues the one
    before."""
    name, sep, rest = text.partition(":")
    if not sep or not rest:
        raise ValueError(f"bad class {text!r}; expected NAME:lengths=...,qps=...[,priority=N]")
    pairs: list[list[str]] = []
    for piece in rest.split(","):
        key, eq, value = piece.partition("=")
        if eq:
            pairs.append([key.strip(), value.strip()])
        elif pairs:
            pairs[-1][1] += "," + piece.strip()
        else:
            raise ValueError(f"class {name}: expected key=value, got {piece!r}")
    values: dict[str, str] = {}
    for key, value in pairs:
        if key not in CLASS_KEYS:
            raise ValueError(f"class {name}: unknown key {key!r}; choose from {', '.join(CLASS_KEYS)}")
        if key in values:
            raise ValueError(f"class {name}: {key} given twice")
        values[key] = value
    trace = values.get("trace")
    if trace is not None:
        for rated in ("qps", "burstiness"):
            if rated in values:
                raise ValueError(
                    f"class {name}: {rated} is the trace's own with trace=; give one or the other"
                )
        return _trace_class(name, trace, values)
    for needed in ("lengths", "qps"):
        if needed not in values:
            raise ValueError(f"class {name}: give {needed}=... (or trace=...)")
    qps = _number(name, "qps", values["qps"])
    burstiness = values.get("burstiness")
    arrivals = poisson(qps) if burstiness is None else gamma(qps, _number(name, "burstiness", burstiness))
    workload = Workload(arrivals, parse_lengths(values["lengths"], None), sessions=_sessions(name, values))
    return TrafficClass(name, workload, *_priority_and_slos(name, values))


def _trace_class(name: str, trace: str, values: Mapping[str, str]) -> TrafficClass:
    """A class replaying ``trace``'s arrivals (and its rows in order for lengths, unless given)."""
    lengths = (
        parse_lengths(values["lengths"], None) if "lengths" in values else TraceLengths(trace, "in-order")
    )
    workload = Workload(ReplayArrivals(trace), lengths, sessions=_sessions(name, values))
    return TrafficClass(name, workload, *_priority_and_slos(name, values))


def _sessions(name: str, values: Mapping[str, str]) -> Sessions | None:
    """The class's multi-turn sessions (None without ``turns``)."""
    if "turns" not in values:
        extra = [key for key in SESSION_KEYS if key in values]
        if extra:
            raise ValueError(f"class {name}: {extra[0]} applies to sessions: give turns=N too")
        return None
    turns = _number(name, "turns", values["turns"])
    if turns != int(turns):
        raise ValueError(f"class {name}: turns must be a whole number, got {values['turns']!r}")
    system = _number(name, "system", values.get("system", "0"), allow_zero=True)
    if system != int(system):
        raise ValueError(f"class {name}: system must be a whole number of tokens, got {values['system']!r}")
    think_s = _number(name, "think", values.get("think", "0"), allow_zero=True)
    return Sessions(int(turns), int(system), think_s)


def _priority_and_slos(name: str, values: Mapping[str, str]) -> tuple[int, dict[str, float]]:
    try:
        priority = int(values.get("priority", "0"))
    except ValueError:
        raise ValueError(f"class {name}: priority must be an integer, got {values['priority']!r}") from None
    return priority, {m: _number(name, m, values[m], allow_zero=True) for m in GOODPUT_METRICS if m in values}


def _number(name: str, key: str, text: str, *, allow_zero: bool = False) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and (value > 0 or (allow_zero and value == 0))):
        raise ValueError(f"class {name}: {key} must be a positive number, got {text!r}")
    return value


class ScoredClass(Protocol):
    """What scoring a class needs of it: a :class:`TrafficClass`, or a :class:`RecordedClass`."""

    @property
    def name(self) -> str: ...
    @property
    def priority(self) -> int: ...
    @property
    def qps(self) -> float: ...
    @property
    def slos(self) -> Mapping[str, float]: ...


@dataclass(frozen=True, slots=True)
class RecordedClass:
    """A class as a run's result recorded it (``bench --save-result``'s ``classes``): enough to
    score it again, not to draw its requests."""

    name: str
    priority: int
    qps: float
    slos: Mapping[str, float]

    @classmethod
    def read(cls, name: str, saved: Mapping[str, Any]) -> RecordedClass:
        """One entry of :func:`class_summaries`' output."""
        return cls(name, int(saved["priority"]), float(saved["qps"]), dict(saved.get("slos_ms") or {}))


def class_summaries(
    classes: Iterable[ScoredClass],
    class_of: Mapping[str, str | None],
    records: Sequence[RequestRecord],
    class_itl: Mapping[str, ItlAccumulator],
    duration_s: float,
) -> dict[str, dict[str, Any]]:
    """Each class's :func:`~stallfree.metrics.summarize` over the whole run's ``duration_s`` (its
    goodput against its own SLOs), with its ``priority`` and offered ``qps``; classes in the order
    given. ``class_of``: each record's request id -> its class (:func:`classes_of`)."""
    out: dict[str, dict[str, Any]] = {}
    for c in classes:
        mine = [r for r in records if class_of.get(r.request_id) == c.name]
        scores = summarize(mine, class_itl.get(c.name, ItlAccumulator()), duration_s, c.slos or None)
        exact_max = max((r.max_itl_s for r in mine), default=0.0) * 1000
        out[c.name] = {
            "priority": c.priority,
            "qps": c.qps,
            "slos_ms": dict(c.slos),
            **scores,
            "max_itl_ms": exact_max if scores["max_itl_ms"] is not None else None,
        }
    return out


def classes_of(requests: Iterable[Request]) -> dict[str, str]:
    """Each request's id -> its traffic class (requests without one left out)."""
    return {r.request_id: r.traffic_class for r in requests if r.traffic_class is not None}
