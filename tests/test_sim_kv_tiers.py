"""KV tiers on the simulated clock: loads priced on each replica's links, first come first served,
requests waiting for them while others run; hits by tier in the summary; bad input in one line."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from stallfree.cli import main
from stallfree.core import CacheConfig, Request, Scheduler, SchedulerConfig, make_policy
from stallfree.core.block_manager import block_keys
from stallfree.core.kv_tiers import KvTier, KvTiers
from stallfree.core.request import PromptBlocks
from stallfree.core.serving import ServingConfig
from stallfree.costs.choice import CostChoice
from stallfree.costs.kv_transfer import KvLink, kv_transfer_bytes, tier_link
from stallfree.sim import Deployment, simulate
from stallfree.sim.kv_tiers import KvTierConfig, TierLoads
from stallfree.specs import load_model_spec
from stallfree.workload import ReplayArrivals, TraceLengths, Workload

TRACE = "mooncake-conversation"
MOONCAKE = Workload(ReplayArrivals(TRACE), TraceLengths(TRACE, "in-order"))
COSTS = CostChoice(kind="full", model="llama-3.1-8b", hardware="h100-sxm")
SERVING = ServingConfig(max_num_batched_tokens=2048)


def _run(tiers: KvTierConfig | None, **kw: Any) -> Any:
    """Mooncake's slice through replicas whose GPU caches are small (evictions, so the tiers
    have something to give back)."""
    serving = replace(SERVING, num_blocks=kw.pop("num_blocks", 3000))
    deployment = Deployment(
        costs=COSTS,
        serving=serving,
        replicas=kw.pop("replicas", 1),
        router=kw.pop("router", "cache-aware"),
        kv_tiers=tiers,
    )
    return simulate(MOONCAKE, deployment, num_requests=kw.pop("num_requests", 150), **kw)


def _same_but_tiers(with_tiers: dict[str, Any], without: dict[str, Any]) -> None:
    tier_keys = {
        "kv_tiers",
        "kv_gpu_hit_rate",
        "kv_host_hit_rate",
        "kv_shared_hit_rate",
        "mean_kv_load_wait_ms",
    }
    assert {k: v for k, v in with_tiers.items() if k not in tier_keys | {"replicas"}} == {
        k: v for k, v in without.items() if k != "replicas"
    }


@pytest.mark.parametrize("replicas", [1, 3])
def test_tiers_that_hold_nothing_past_the_gpu_leave_the_run_as_it_was(replicas: int) -> None:
    """A GPU cache that never evicts holds every block its tiers do: nothing loads, and the run
    (through the tiers' replica wrapper) is the run without tiers, request by request. (In a fleet
    the shared store also holds the other replicas' blocks: host tiers only there.)"""
    tiers = KvTierConfig(host_gb=64, shared_gb=256 if replicas == 1 else None)
    on = _run(tiers, replicas=replicas, num_blocks=1 << 20)
    off = _run(None, replicas=replicas, num_blocks=1 << 20)
    assert on.summary["kv_tiers"]["num_loads"] == 0
    assert on.records == off.records
    _same_but_tiers(on.summary, off.summary)


def test_the_tiers_give_back_what_the_gpu_evicted_and_the_fast_path_equals_the_slow_one() -> None:
    tiers = KvTierConfig(host_gb=200, shared_gb=400)
    fast = _run(tiers, num_requests=400)
    slow = _run(tiers, num_requests=400, fast=False)
    assert fast.records == slow.records
    off = _run(None, num_requests=400)
    s, t = fast.summary, fast.summary["kv_tiers"]
    host, shared = t["host"]["hit_tokens"], t["shared"]["hit_tokens"]
    assert host > 0 and t["num_loads"] > 0
    queried = s["prefix_cache_queried_tokens"]
    assert t["gpu"]["hit_tokens"] + host + shared == s["prefix_cache_hit_tokens"]  # by source
    assert t["gpu"]["hit_tokens"] >= 0 and s["kv_host_hit_rate"] == pytest.approx(host / queried)
    # the tiers find what the GPU lost: hits the same GPU cache alone did not have
    assert s["prefix_cache_hit_rate"] > off.summary["prefix_cache_hit_rate"] + 0.04
    per_token = kv_transfer_bytes(load_model_spec(COSTS.model), 1, 2)
    for tier in ("host", "shared"):  # a hit was loaded and landed; what was loaded was paid for
        assert t[tier]["hit_tokens"] <= t[tier]["loaded_tokens"]
        assert t[tier]["bytes_loaded"] == per_token * t[tier]["loaded_tokens"]
    assert t["host"]["stored_blocks"] == t["host"]["evicted_blocks"] + _units_held(t["host"])
    link = tier_link("pcie5", host=True)
    assert t["mean_load_wait_ms"] >= 1000 * link.latency_s
    assert s["mean_ttft_ms"] < off.summary["mean_ttft_ms"]


def test_a_fleet_with_a_route_delay_loads_and_its_fast_path_equals_the_slow_one() -> None:
    """Loads that land while other replicas step, requests that reach their replica late: a
    replica's steady runs are cut where a load lands, as where a request arrives."""
    tiers = KvTierConfig(host_gb=50, shared_gb=400)
    deployment = Deployment(
        costs=COSTS,
        serving=replace(SERVING, num_blocks=3000),
        replicas=3,
        router="cache-aware",
        route_delay_ms=2.0,
        kv_tiers=tiers,
    )
    fast = simulate(MOONCAKE, deployment, num_requests=300)
    slow = simulate(MOONCAKE, deployment, num_requests=300, fast=False)
    assert fast.records == slow.records
    t = fast.summary["kv_tiers"]
    assert t["num_loads"] > 0 and t["host"]["hit_tokens"] > 0 and t["shared"]["hit_tokens"] > 0


def _units_held(tier: dict[str, Any]) -> int:
    """The blocks a tier holds at the end: written and not evicted (its capacity at most)."""
    held = tier["stored_blocks"] - tier["evicted_blocks"]
    assert 0 <= held <= tier["capacity_blocks"]
    return held


def test_a_shared_store_gives_one_replica_what_another_computed() -> None:
    """Round-robin spreads a conversation's turns over the replicas: only the shared store lets a
    turn find the earlier turns' blocks computed elsewhere."""
    kw: dict[str, Any] = {"replicas": 3, "router": "round-robin", "num_blocks": 1 << 20, "num_requests": 400}
    alone = _run(None, **kw).summary
    shared = _run(KvTierConfig(shared_gb=1000), **kw)
    t = shared.summary["kv_tiers"]
    assert "host" not in t and t["shared"]["hit_tokens"] > 0
    assert t["shared"]["capacity_blocks"] == int(
        1000e9 // kv_transfer_bytes(load_model_spec(COSTS.model), 16, 2)
    )
    assert shared.summary["prefix_cache_hit_rate"] > alone["prefix_cache_hit_rate"] + 0.04
    assert t["gpu"]["hit_tokens"] == pytest.approx(alone["prefix_cache_hit_tokens"], rel=0.1)


def test_loads_on_one_link_queue_first_come_first_served() -> None:
    """Two requests whose prompts the host tier holds, arriving together: the second load starts
    when the first has landed; each is the link's latency plus its bytes over its bandwidth."""
    scheduler = Scheduler(
        SchedulerConfig(),
        CacheConfig(block_size=16, num_blocks=1000, enable_prefix_caching=True),
        make_policy("chunked"),
    )
    host = KvTier("host", 1000)
    link = KvLink("test", 1e9, 1e-3)
    loads = TierLoads(scheduler, KvTiers(host), (link, link), lambda n: (1000 * n, 1000.0 * n))
    requests = []
    for rid, ids in (("a", (1, 2, 3)), ("b", (4, 5))):
        content = PromptBlocks(ids, 64)  # 4 blocks an id
        keys = block_keys(content, 64 * len(ids), 16)
        for j in range(len(ids)):
            host.store(keys.unit(j), 4)
        requests.append(Request(rid, 64 * len(ids) + 10, 8, 0.0, prompt_blocks=content))
    first = loads.load(requests[0], 2.0)
    second = loads.load(requests[1], 2.0)
    assert first is not None and second is not None
    assert first[0] == pytest.approx(2.0 + 1e-3 + 1000 * 192 / 1e9) and first[2] == (0, 12, 12)
    assert second[0] == pytest.approx(first[0] + 1e-3 + 1000 * 128 / 1e9) and second[2] == (0, 8, 8)
    assert loads.loaded_tokens == [320, 0] and loads.bytes_loaded == [320_000, 0]
    assert loads.waits_s == [pytest.approx(first[0] - 2.0), pytest.approx(second[0] - 2.0)]
    assert loads.load(Request("c", 100, 8, 3.0, prompt_blocks=PromptBlocks((9,), 64)), 3.0) is None


def test_a_deployment_keeps_its_tiers_through_a_file_and_refuses_them_where_they_do_not_run() -> None:
    d = Deployment(costs=COSTS, replicas=4, kv_tiers=KvTierConfig(512, "pcie4", 8192, "roce-200"))
    assert Deployment.from_dict(d.to_dict()) == d
    with pytest.raises(ValueError, match="unknown host link 'pcie9'"):
        KvTierConfig(host_gb=1, host_link="pcie9")
    with pytest.raises(ValueError, match="unknown shared store link 'nvlink'"):
        KvTierConfig(shared_gb=1, shared_link="nvlink")
    with pytest.raises(ValueError, match="host tier's GB, a shared store's GB or both"):
        KvTierConfig()


def test_the_table_shows_hits_by_tier(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--trace", TRACE, "--num-requests", "200", "--cost-model", "full"]
    assert main([*argv, "--model", "llama-3.1-8b", "--num-blocks", "1500", "--kv-host-gb", "100"]) == 0
    out = capsys.readouterr().out
    assert "KV tiers: a host tier of 100 GB a replica (pcie5); every block a GPU caches written" in out
    assert "from the GPU" in out and "from the host tier" in out and "KV load wait mean (ms)" in out
    assert "from the shared store" not in out


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--kv-host-gb", "0.001"], "the host tier's 0.001 GB is less than one KV block of this model"),
        (["--kv-shared-gb", "1", "--kv-shared-link", "carrier-pigeon"], "unknown shared store link"),
        (["--kv-host-link", "pcie4"], "--kv-host-link applies with --kv-host-gb"),
        (["--kv-host-gb", "0"], "argument --kv-host-gb"),
        (["--kv-host-gb", "10", "--no-enable-prefix-caching"], "KV tiers keep the prefix cache's blocks"),
        (["--kv-shared-gb", "10", "--disaggregate", "1P1D"], "KV tiers run on one replica or a fleet"),
    ],
)
def test_bad_tiers_are_one_line_and_exit_2(
    flags: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["simulate", "--num-requests", "5", "--cost-model", "full", *flags]
    try:
        code = main(argv)
    except SystemExit as exit_info:  # argparse's own checks
        code = int(str(exit_info.code))
    err = capsys.readouterr().err.strip()
    assert code == 2 and expected in err and len(err.splitlines()) == 1


def test_simulate_writes_its_tiers_to_a_deployment_file_and_runs_it_again(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "deployment.yaml"
    argv = ["simulate", "--trace", TRACE, "--num-requests", "20", "--cost-model", "full", "--json"]
    tiers = ["--kv-host-gb", "100", "--kv-shared-gb", "300", "--kv-shared-link", "roce-200"]
    assert main([*argv, *tiers, "--deployment-out", str(path)]) == 0
    first = capsys.readouterr().out
    assert main([*argv, "--deployment", str(path)]) == 0
    again = capsys.readouterr().out
    scenario = json.loads(again)["scenario"]
    assert (scenario["kv_host_gb"], scenario["kv_shared_gb"], scenario["kv_shared_link"]) == (
        100,
        300,
        "roce-200",
    )
    assert _summary(first) == _summary(again)


def _summary(text: str) -> dict[str, Any]:
    """A simulate --json run's summary, but its wall time."""
    summary: dict[str, Any] = json.loads(text)["policies"]["chunked"]
    summary.pop("sim_wall_s")
    return summary
