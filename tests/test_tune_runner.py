"""Running many searches over a backend: serial == local pool, resume, duplicates run once."""

from __future__ import annotations

import pytest

from stallfree.costs.choice import CostChoice
from stallfree.metrics import Summary
from stallfree.tune.jobs import FixedQps, Job, TrialRecord, run_jobs
from stallfree.tune.pools import ProcessPool, SerialPool, make_pool
from stallfree.tune.search import CapacitySearch, SearchConfig
from stallfree.tune.slo import Slos
from stallfree.tune.trial import TrialSpec, run_trial

SLOS = Slos.from_mapping({"tbt_p99_ms": 100})
BASE = TrialSpec.of(CostChoice(model="fake", hardware="fake"))


def fake_trial(spec: TrialSpec) -> Summary:
    """A system whose P99 TBT grows with QPS and with the budget: capacity = 1000 / budget * 10."""
    return {"p99_itl_ms": spec.qps * spec.token_budget / 100, "completed": spec.num_requests}


def capacity_jobs(budgets: tuple[int, ...] = (128, 256, 512, 1024)) -> list[Job]:
    return [
        Job(
            BASE.with_serving(256, max_num_batched_tokens=b),
            CapacitySearch(SearchConfig(qps_start=1.0, precision=0.02)),
        )
        for b in budgets
    ]


def outcome(records: list[TrialRecord]) -> list[tuple[int, int, float, bool | None, Summary]]:
    return [(r.job, r.spec.token_budget, r.spec.qps, r.passed, r.metrics) for r in records]


def test_searches_find_each_budgets_capacity() -> None:
    jobs = capacity_jobs()
    records = run_jobs(jobs, SerialPool(fake_trial), SLOS)
    for job in jobs:
        search = job.probe
        assert isinstance(search, CapacitySearch)
        true_capacity = 100 * 100 / job.base.token_budget
        assert search.capacity_qps <= true_capacity < search.capacity_qps * 1.02
    assert [r.job for r in records] == sorted(r.job for r in records)
    assert all(r.passed == (r.metrics["p99_itl_ms"] <= 100) for r in records)  # type: ignore[operator]


def test_local_pool_gives_the_serial_results() -> None:
    serial = run_jobs(capacity_jobs(), SerialPool(fake_trial), SLOS)
    with ProcessPool(fake_trial, workers=2) as pool:
        pooled = run_jobs(capacity_jobs(), pool, SLOS)
    assert outcome(pooled) == outcome(serial)


def test_real_simulations_in_a_pool_equal_those_run_here() -> None:
    real = TrialSpec.of(CostChoice(kind="full", model="mistral-7b"), lengths="sharegpt", num_requests=30)
    policies = ("chunked", "prefill-first")

    def jobs() -> list[Job]:
        return [Job(real.with_serving(256, policy=p), FixedQps(q)) for p in policies for q in (0.5, 4.0)]

    with ProcessPool(run_trial, workers=2) as pool:
        pooled = run_jobs(jobs(), pool, SLOS)
    assert outcome(pooled) == outcome(run_jobs(jobs(), SerialPool(run_trial), SLOS))
    assert all(r.metrics["completed"] == 30 for r in pooled)


def test_done_trials_are_not_run_again() -> None:
    first = run_jobs(capacity_jobs(), SerialPool(fake_trial), SLOS)
    done = {r.spec.key(): r.metrics for r in first[: len(first) // 2]}
    ran: list[TrialSpec] = []

    def counting(spec: TrialSpec) -> Summary:
        ran.append(spec)
        return fake_trial(spec)

    written: list[TrialRecord] = []
    again = run_jobs(capacity_jobs(), SerialPool(counting), SLOS, done=done, on_trial=written.append)
    assert outcome(again) == outcome(first)
    assert len(ran) == len(first) - len(done)
    assert {s.key() for s in ran}.isdisjoint(done)
    assert sorted(r.spec.key() for r in written) == sorted(r.spec.key() for r in again if r.origin == "run")


def test_a_repeated_trial_runs_once_and_fixed_qps_has_no_verdict_without_slos() -> None:
    ran: list[TrialSpec] = []

    def counting(spec: TrialSpec) -> Summary:
        ran.append(spec)
        return fake_trial(spec)

    jobs = [Job(BASE, FixedQps(2.0)), Job(BASE, FixedQps(2.0)), Job(BASE, FixedQps(3.0))]
    records = run_jobs(jobs, SerialPool(counting), None)
    assert [s.qps for s in ran] == [2.0, 3.0]
    assert [r.passed for r in records] == [None, None, None]
    assert records[0].metrics == records[1].metrics


def test_make_backend_choices() -> None:
    assert isinstance(make_pool("local", fake_trial, workers=1), SerialPool)
    with pytest.raises(ValueError, match="unknown backend"):
        make_pool("dask", fake_trial, workers=1)
    with pytest.raises(ValueError, match="ray backend only"):
        make_pool("local", fake_trial, workers=1, address="127.0.0.1:6379")
