"""Drive many probes (capacity searches, fixed-QPS trials) over one pool.

A :class:`Job` pairs a base :class:`TrialSpec` with a probe that proposes QPS values. The runner
keeps one trial per unfinished job in flight, so independent searches fill the workers while
each search stays sequential. Trials whose key is in ``done`` (a resumed sweep) are answered
from there without running. Invariant: the records returned are sorted by (job, trial order),
and depend on the specs and the trial function only, never on the pool or timing.
"""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from stallfree.metrics import Summary
from stallfree.tune.pools import TrialPool
from stallfree.tune.slo import Slos
from stallfree.tune.trial import TrialSpec

Origin = Literal["run", "resumed", "repeat"]


class Probe(Protocol):
    """Proposes values of its job's axis (a QPS, or a replica count) and is told the outcomes."""

    def next_value(self) -> float | None: ...
    def record(self, value: float, passed: bool) -> None: ...
    def trials_left_estimate(self) -> int: ...


class FixedQps:
    """A probe that runs one given QPS once."""

    def __init__(self, qps: float) -> None:
        self.qps = qps
        self._done = False

    def next_value(self) -> float | None:
        return None if self._done else self.qps

    def record(self, value: float, passed: bool) -> None:
        self._done = True

    def trials_left_estimate(self) -> int:
        return 0 if self._done else 1


@dataclass(slots=True)
class Job:
    """``base`` with its ``axis`` (its QPS, or its replica count) set to each value ``probe`` asks."""

    base: TrialSpec
    probe: Probe
    axis: Literal["qps", "replicas"] = "qps"

    def spec_at(self, value: float) -> TrialSpec:
        return self.base.at_qps(value) if self.axis == "qps" else self.base.at_replicas(int(value))

    def value_of(self, spec: TrialSpec) -> float:
        return spec.qps if self.axis == "qps" else spec.deployment.replicas


@dataclass(frozen=True, slots=True)
class TrialRecord:
    """One finished trial. ``passed`` is None when no SLOs were given. ``origin``: ``run`` (simulated
    now), ``resumed`` (read from ``done``) or ``repeat`` (the same spec as another job's trial)."""

    job: int
    index: int
    spec: TrialSpec
    metrics: Summary
    passed: bool | None
    violations: tuple[str, ...]
    origin: Origin = "run"

    def to_json(self) -> dict[str, Any]:
        d, pools = self.spec.deployment, self.spec.pools
        return {
            "policy": self.spec.serving.policy,
            "token_budget": self.spec.token_budget,
            "step_budget_ms": self.spec.serving.step_budget_ms,
            "max_num_seqs": self.spec.serving.num_seqs_limit,
            "qps": self.spec.qps,
            **({"replicas": d.replicas, "router": d.router} if d.replicas > 1 else {}),
            **(
                {"kv_host_gb": d.kv_tiers.host_gb, "kv_shared_gb": d.kv_tiers.shared_gb}
                if d.kv_tiers is not None
                else {}
            ),
            **(
                {
                    "tp": self.spec.costs.tp,
                    "disaggregate": f"{pools.num_prefill}P{pools.num_decode}D",
                    "decode_tp": pools.tp_decode,
                    "prefill_token_budget": d.disaggregate.prefill_token_budget,
                }
                if d.disaggregate is not None and pools is not None
                else {}
            ),
            "passed": self.passed,
            "violations": list(self.violations),
            "key": self.spec.key(),
            "metrics": dict(self.metrics),
        }


class JobsInterrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`run_jobs`; ``records`` are the trials finished before it (sorted)."""

    def __init__(self, records: list[TrialRecord]) -> None:
        super().__init__()
        self.records = records


def run_jobs(
    jobs: Sequence[Job],
    pool: TrialPool,
    slos: Slos | None,
    *,
    done: Mapping[str, Summary] | None = None,
    on_trial: Callable[[TrialRecord], None] | None = None,
    progress: bool = False,
    desc: str = "trials",
) -> list[TrialRecord]:
    """Run every job's probe to the end; ``on_trial`` sees each newly simulated trial.

    ``done`` maps trial keys to summaries already known (a resumed sweep): those never run.
    A Ctrl-C raises :class:`JobsInterrupted` carrying the trials finished so far.
    """
    from tqdm import tqdm

    known = dict(done or {})  # grows with this run's results: a repeated spec runs once
    resumed_keys = set(known)
    records: list[TrialRecord] = []
    counts = [0] * len(jobs)
    in_flight: dict[int, tuple[TrialSpec, list[int]]] = {}  # ticket -> (spec, jobs waiting on it)
    ticket_of: dict[str, int] = {}  # key -> ticket of a trial in flight
    tickets = itertools.count()
    bar = tqdm(total=0, unit="trial", desc=desc, disable=not progress, file=sys.stderr, dynamic_ncols=True)

    def finish(j: int, spec: TrialSpec, metrics: Summary, origin: Origin) -> None:
        violations = slos.violations(metrics) if slos is not None else ()
        passed = None if slos is None else not violations
        jobs[j].probe.record(jobs[j].value_of(spec), bool(passed))
        record = TrialRecord(j, counts[j], spec, metrics, passed, violations, origin)
        counts[j] += 1
        records.append(record)
        known[spec.key()] = metrics
        if on_trial is not None and origin == "run":
            on_trial(record)
        bar.total = bar.n + 1 + sum(job.probe.trials_left_estimate() for job in jobs)
        bar.update(1)  # after the total: tqdm's ETA uses both

    def advance(j: int) -> None:
        while (value := jobs[j].probe.next_value()) is not None:
            spec = jobs[j].spec_at(value)
            key = spec.key()
            if key in ticket_of:
                in_flight[ticket_of[key]][1].append(j)
                return
            cached = known.get(key)
            if cached is None:
                ticket = ticket_of[key] = next(tickets)
                in_flight[ticket] = (spec, [j])
                pool.submit(ticket, spec)
                return
            finish(j, spec, cached, "resumed" if key in resumed_keys else "repeat")

    try:
        for j in range(len(jobs)):
            advance(j)
        bar.total = bar.n + sum(job.probe.trials_left_estimate() for job in jobs)
        bar.refresh()
        while in_flight:
            ticket, metrics = pool.next_result()
            spec, waiting = in_flight.pop(ticket)
            del ticket_of[spec.key()]
            for position, j in enumerate(waiting):
                finish(j, spec, metrics, "repeat" if position else "run")
            for j in waiting:
                advance(j)
    except KeyboardInterrupt:
        raise JobsInterrupted(sorted(records, key=lambda r: (r.job, r.index))) from None
    finally:
        bar.close()
    return sorted(records, key=lambda r: (r.job, r.index))


def searched(
    make_jobs: Callable[[], list[Job]],
    pool: TrialPool,
    slos: Slos,
    to_json: Callable[[list[Job], list[TrialRecord]], dict[str, Any]],
    *,
    progress: bool,
    desc: str,
) -> tuple[dict[str, Any], bool]:
    """Make the jobs and run them (:func:`run_jobs`); ``to_json`` of them and their trials, with
    ``wall_s`` and, when a Ctrl-C cut the run short (the second value), ``partial: true``."""
    started = time.perf_counter()
    jobs = make_jobs()
    interrupted = False
    try:
        trials = run_jobs(jobs, pool, slos, progress=progress, desc=desc)
    except JobsInterrupted as error:
        trials, interrupted = error.records, True
    out = to_json(jobs, trials)
    if interrupted:
        out["partial"] = True
    out["wall_s"] = time.perf_counter() - started
    return out, interrupted
