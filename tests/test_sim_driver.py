"""The one driver reproduces, bit for bit, what the three loops it replaced produced.

``tests/data/driver_golden.json`` holds digests of simulate() runs (records, ITL samples, summary,
step trace) and of explain's scenarios, written by the code before the driver existed (commit
bacf5ca, ``python -m tests.test_sim_driver --write`` there): several workloads (Poisson,
Mooncake's trace with prefix-block hashes, multi-turn sessions, all at once), policies, prefix
caching on and off, a step-time budget, a KV cache small enough to preempt, both roofline cost
models, the fast path on and off. The two ``poisson-measured`` digests (Vidur's A100 tables) were
written by the code of commit 4ed46e3 (ab7b3aa gives the same), before short steady runs were
priced step by step and a steady run's ends kept as lists. Floats are hashed at 9 significant
digits (numpy's vectorised sums may differ in the last bit between CPUs). A change that moves any
output changes a digest.
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import pytest

from stallfree.core.serving import ServingConfig
from stallfree.workload import WorkloadOptions, workload_from_options

GOLDEN = Path(__file__).parent / "data" / "driver_golden.json"


@dataclass(frozen=True)
class Case:
    name: str
    workload: WorkloadOptions
    num_requests: int
    serving: ServingConfig
    kind: str = "full"
    fast: bool = True
    model: str | None = None


POISSON = WorkloadOptions(qps=6.0, lengths="lognormal:600,120")
MOONCAKE = WorkloadOptions(trace="mooncake-conversation", time_scale=0.05)
SESSIONS = WorkloadOptions(qps=2.0, lengths="uniform:50-400,20-80", turns=3, system_prompt_tokens=300)
AT_ONCE = WorkloadOptions(arrival="all-at-once", lengths="fixed:900,40")

CASES = [
    Case("poisson-chunked", POISSON, 300, ServingConfig()),
    Case("poisson-chunked-slow", POISSON, 120, ServingConfig(), fast=False),
    Case("poisson-prefill-first", POISSON, 200, ServingConfig(policy="prefill-first")),
    Case("poisson-decode-first", POISSON, 150, ServingConfig(policy="decode-first")),
    Case(
        "poisson-weights-only", POISSON, 150, ServingConfig(max_num_batched_tokens=256), kind="weights-only"
    ),
    Case("poisson-step-budget", POISSON, 200, ServingConfig(step_budget_ms=25.0)),
    Case("poisson-preempt", POISSON, 150, ServingConfig(num_blocks=120, max_num_seqs=32)),
    Case("mooncake-cache", MOONCAKE, 150, ServingConfig(), model="llama-3.1-8b"),
    Case(
        "mooncake-no-cache", MOONCAKE, 150, ServingConfig(enable_prefix_caching=False), model="llama-3.1-8b"
    ),
    Case("mooncake-cache-slow", MOONCAKE, 60, ServingConfig(), fast=False, model="llama-3.1-8b"),
    Case("sessions-cache", SESSIONS, 60, ServingConfig(max_num_batched_tokens=128)),
    Case("sessions-budget-preempt", SESSIONS, 60, ServingConfig(step_budget_ms=20.0, num_blocks=200)),
    Case("at-once-chunked", AT_ONCE, 64, ServingConfig(max_num_seqs=16)),
    Case("at-once-prefill-first", AT_ONCE, 64, ServingConfig(policy="prefill-first", max_num_seqs=16)),
    # Vidur's tables (the default hardware: an A100)
    Case("poisson-measured", POISSON, 300, ServingConfig(), kind="measured", model="llama-3-8b"),
    Case(
        "poisson-measured-slow",
        POISSON,
        120,
        ServingConfig(),
        kind="measured",
        fast=False,
        model="llama-3-8b",
    ),
]

EXPLAIN = {
    "explain-default": {},
    "explain-cached-prefix": {"cached_prefix_tokens": 4096},
    "explain-step-budget": {"step_budget_ms": 40.0},
    "explain-full": {"cost_model": "full", "streams": 8},
}


def _rounded(value: Any) -> Any:
    """Floats to 9 significant digits: a last-bit difference between numpy's builds for AVX2 and
    AVX-512 (vectorised sums) is not a change of output."""
    if isinstance(value, float):
        return float(f"{value:.9g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_rounded(v) for v in value]
    return value


def _digest(value: Any) -> str:
    text = json.dumps(_rounded(value), sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def simulate_digest(case: Case) -> str:
    from stallfree.costs import CostChoice
    from stallfree.sim import Deployment, simulate

    result = simulate(
        workload_from_options(case.workload),
        Deployment(costs=CostChoice(kind=case.kind, model=case.model), serving=case.serving),
        num_requests=case.num_requests,
        keep_steps=True,
        fast=case.fast,
    )
    steps = result.steps
    assert steps is not None
    columns = {f.name: list(getattr(steps, f.name)) for f in fields(steps)}
    return _digest(
        {
            "records": [asdict(r) for r in result.records],
            "itl": [result.itl.values_s.tolist(), result.itl.counts.tolist()],
            "summary": result.summary,
            "steps": columns,
        }
    )


def _deployed() -> dict[str, tuple[WorkloadOptions, int, Any]]:
    """Runs of a deployment's optional parts (fleets, pools, drafts): (workload, requests, deployment)."""
    from stallfree.costs import CostChoice
    from stallfree.costs.kv_transfer import PoolShape
    from stallfree.sim import Deployment, ReplicaGroup, Speculation
    from stallfree.sim.disagg import Disaggregation
    from stallfree.sim.speculative import Acceptance

    full = CostChoice(kind="full")
    shared = Disaggregation(PoolShape.parse("2P1D", 2, 2), "roce-200", 1024, "shared-storage")
    return {
        "fleet-cache-aware": (
            MOONCAKE,
            150,
            Deployment(costs=CostChoice(kind="full", model="llama-3.1-8b"), replicas=4, router="cache-aware"),
        ),
        "fleet-route-delay": (
            POISSON,
            150,
            Deployment(replicas=3, router="least-requests", route_delay_ms=5.0),
        ),
        "fleet-mixed": (
            SESSIONS,
            81,
            Deployment(
                fleet=(ReplicaGroup(2, "h100-sxm", 2), ReplicaGroup(2, "a100-80gb")), router="power-of-two"
            ),
        ),
        "disagg-1P2D": (
            POISSON,
            150,
            Deployment(disaggregate=Disaggregation(PoolShape.parse("1P2D"), "ib-400")),
        ),
        "disagg-shared-storage": (
            POISSON,
            100,
            Deployment(costs=CostChoice(kind="full", tp=2), router="least-requests", disaggregate=shared),
        ),
        "spec-vllm": (
            POISSON,
            150,
            Deployment(
                serving=ServingConfig(num_speculative_tokens=3),
                speculation=Speculation(Acceptance.per_token(0.7, 3)),
            ),
        ),
        "spec-sglang-eagle": (
            POISSON,
            120,
            Deployment(
                costs=full,
                serving=ServingConfig(num_speculative_tokens=2, speculative_rule="sglang"),
                speculation=Speculation(Acceptance((0.8, 0.5), 0.9), "eagle"),
            ),
        ),
        "spec-fleet": (
            POISSON,
            120,
            Deployment(
                serving=ServingConfig(num_speculative_tokens=2),
                replicas=2,
                speculation=Speculation(Acceptance.per_token(0.6, 2)),
            ),
        ),
    }


def deployed_digest(name: str) -> str:
    from stallfree.sim import simulate

    options, num_requests, deployment = _deployed()[name]
    seed = 3 if name == "spec-sglang-eagle" else 0
    result = simulate(workload_from_options(options), deployment, num_requests=num_requests, seed=seed)
    return _digest(
        {
            "records": [asdict(r) for r in result.records],
            "itl": [result.itl.values_s.tolist(), result.itl.counts.tolist()],
            "summary": result.summary,
            "policy": result.policy,
            "partial": result.partial,
            "kv": asdict(result.kv),
        }
    )


def explain_digest(overrides: dict[str, Any]) -> str:
    from stallfree.explain.backends import run_explain
    from stallfree.explain.options import ExplainOptions

    explanation = run_explain(ExplainOptions(**overrides))
    fields = asdict(explanation)
    for name in ("speculation", "disaggregated"):  # not asked for: the explanation as it was before
        if fields[name] is None:
            del fields[name]
    return _digest(fields)


def _all() -> dict[str, str]:
    out = {case.name: simulate_digest(case) for case in CASES}
    out.update({name: explain_digest(kw) for name, kw in EXPLAIN.items()})
    out.update({name: deployed_digest(name) for name in _deployed()})
    return out


def test_two_replicas_each_run_as_if_alone() -> None:
    """Routed apart, two replicas on one clock give each request what a replica of its own gave:
    a steady run is cut by the arrivals routed to its replica, and the other's change nothing."""
    from stallfree.core import Request
    from stallfree.sim.driver import SimClock, drive
    from stallfree.sim.traffic import TrafficReplica, run_traffic
    from tests.factories import OneSecondCosts, make_scheduler

    requests = [Request(str(i), 30 + 7 * i, 5 + 3 * i, arrival_time_s=0.7 * i) for i in range(12)]
    replicas = [
        TrafficReplica(make_scheduler(max_num_seqs=4), OneSecondCosts(), cuttable=True) for _ in range(2)
    ]
    assert not drive(SimClock(), requests, replicas, route=lambda r: int(r.request_id) % 2)
    for k, replica in enumerate(replicas):
        alone = run_traffic(make_scheduler(max_num_seqs=4), OneSecondCosts(), requests[k::2])
        fleet = replica.result(0.0, False)
        assert [r.request_id for r in fleet.records] == [str(i) for i in range(k, 12, 2)]
        assert fleet.records == alone.records
        assert fleet.num_steps == alone.num_steps


def test_a_step_in_flight_ends_before_a_later_arrival_is_seen() -> None:
    """A replica's step is applied at its end: an arrival during it waits for the next step."""
    from stallfree.core import Request
    from stallfree.sim.driver import SimClock, drive
    from stallfree.sim.timeline import Timeline, TimelineReplica
    from tests.factories import make_scheduler, one_second

    tl = Timeline()
    replica = TimelineReplica(make_scheduler(), one_second, tl)
    drive(SimClock(), [Request("a", 8, 2), Request("b", 8, 1, arrival_time_s=0.5)], [replica])
    assert [s.start_s for s in tl.steps] == [0.0, 1.0]
    assert tl.token_times_s == {"a": [1.0, 2.0], "b": [2.0]}


def test_wall_clock_sleeps_until_and_never_goes_back() -> None:
    from stallfree.sim.driver import WallClock

    clock = WallClock()
    clock.wait_until(0.02)
    after = clock.now()
    assert after >= 0.02
    clock.wait_until(0.0)
    assert clock.now() >= after


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_simulate_unchanged(case: Case) -> None:
    assert simulate_digest(case) == json.loads(GOLDEN.read_text())[case.name]


@pytest.mark.parametrize("name", sorted(_deployed()))
def test_deployments_unchanged(name: str) -> None:
    """Fleets, pools and drafts as simulate() ran them before they were parts of one Deployment
    (digests written by commit 8a4c512's keyword arguments; fleet-cache-aware's since its tie
    between equal matches goes to the last tenant, as vllm-router's)."""
    assert deployed_digest(name) == json.loads(GOLDEN.read_text())[name]


@pytest.mark.parametrize("name", sorted(EXPLAIN))
def test_explain_unchanged(name: str) -> None:
    assert explain_digest(EXPLAIN[name]) == json.loads(GOLDEN.read_text())[name]


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    GOLDEN.write_text(json.dumps(_all(), indent=1) + "\n")
