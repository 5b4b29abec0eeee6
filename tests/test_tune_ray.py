"""The Ray backend on a local Ray (127.0.0.1, 2 CPUs): the same results as the serial backend."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from stallfree.costs.choice import CostChoice
from stallfree.metrics import Summary
from stallfree.tune.jobs import FixedQps, Job, TrialRecord, run_jobs
from stallfree.tune.pools import RayPool, SerialPool
from stallfree.tune.search import CapacitySearch, SearchConfig
from stallfree.tune.slo import Slos
from stallfree.tune.trial import TrialSpec, run_trial

MISTRAL = CostChoice(kind="full", model="mistral-7b", hardware="a100-80gb")

ray = pytest.importorskip("ray")

SLOS = Slos.from_mapping({"tbt_p99_ms": 100})


def fake_trial(spec: TrialSpec) -> Summary:
    return {"p99_itl_ms": spec.qps * spec.token_budget / 100}


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    # Ray workers cannot import this test module: ship its functions by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    yield
    ray.shutdown()


def jobs() -> list[Job]:
    base = TrialSpec.of(MISTRAL)
    return [
        Job(base.with_serving(256, max_num_batched_tokens=b), CapacitySearch(SearchConfig(qps_start=1.0)))
        for b in (256, 512, 2048)
    ]


def outcome(records: list[TrialRecord]) -> list[tuple[int, float, bool | None, Summary]]:
    return [(r.job, r.spec.qps, r.passed, r.metrics) for r in records]


@pytest.mark.slow
def test_ray_backend_gives_the_serial_results(local_ray: None) -> None:
    with RayPool(fake_trial) as backend:
        on_ray = run_jobs(jobs(), backend, SLOS)
        assert backend.workers == 2
    assert outcome(on_ray) == outcome(run_jobs(jobs(), SerialPool(fake_trial), SLOS))
    assert ray.is_initialized()  # a Ray it did not start is left running

    # Real simulations as Ray tasks (one BLAS thread there) equal the same simulations here, to
    # the last bit: big enough that a BLAS dot would have summed the ITLs in another order.
    real = TrialSpec.of(MISTRAL, num_requests=300).with_serving(
        256, policy="prefill-first", max_num_batched_tokens=256
    )
    with RayPool(run_trial) as backend:
        on_ray = run_jobs([Job(real, FixedQps(q)) for q in (1.0, 1.962940791930829)], backend, SLOS)
    here = run_jobs([Job(real, FixedQps(q)) for q in (1.0, 1.962940791930829)], SerialPool(run_trial), SLOS)
    assert outcome(on_ray) == outcome(here)


def test_unreachable_ray_address_fails_fast_with_one_line() -> None:
    with pytest.raises(ValueError, match=r"no Ray cluster answers at 127\.0\.0\.1:1 "):
        RayPool(fake_trial, address="127.0.0.1:1", connect_timeout_s=1.0)
    with pytest.raises(ValueError, match="bad Ray address"):
        RayPool(fake_trial, address="localhost")
