"""Sizing a fleet: the replica search's rule, and tune's fewest replicas against the simulations."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stallfree.cli import main
from stallfree.costs.choice import CostChoice
from stallfree.tune.fleet import FleetTuneConfig, fleet_commands, tune_fleet
from stallfree.tune.pools import SerialPool
from stallfree.tune.search import ReplicaSearch
from stallfree.tune.slo import Slos
from stallfree.tune.trial import TrialSpec, run_trial, trace_qps


@given(st.integers(1, 70), st.integers(1, 64), st.integers(1, 64))
def test_replica_search_finds_the_fewest_that_pass(threshold: int, start: int, limit: int) -> None:
    start = min(start, limit)
    search = ReplicaSearch(start, limit)
    tried = []
    while (n := search.next_value()) is not None:
        tried.append(int(n))
        search.record(n, n >= threshold)
    assert search.fewest == (threshold if threshold <= limit else None)
    assert all(1 <= n <= limit for n in tried) and len(tried) == len(set(tried))
    assert len(tried) <= 2 * limit.bit_length() + 2


def test_replica_search_takes_only_what_it_proposed() -> None:
    search = ReplicaSearch(4, 16)
    search.next_value()
    with pytest.raises(ValueError, match="not the 4 proposed"):
        search.record(5, True)


SPEC = TrialSpec.of(
    CostChoice(kind="full", model="mistral-7b", hardware="a100-80gb"),
    lengths="fixed:2000,60",
    num_requests=300,
    qps=40.0,
)


def test_fleet_tune_finds_the_fewest_replicas_the_simulations_say_meet_the_slos() -> None:
    slos = Slos.from_mapping({"ttft_p99_ms": 600.0})
    config = FleetTuneConfig(SPEC, ("round-robin", "least-requests"), (512,), slos, max_replicas=32)
    out, interrupted = tune_fleet(config, SerialPool(run_trial))
    assert not interrupted
    for router, entry in out["routers"].items():
        n = entry["curve"][0]["replicas"]
        assert n is not None and n > 1
        spec = SPEC.with_serving(256, policy="chunked", max_num_batched_tokens=512).with_deployment(
            router=router
        )
        assert slos.is_met(run_trial(spec.at_replicas(n)))
        assert not slos.is_met(run_trial(spec.at_replicas(n - 1)))
    best = out["best"]
    assert best["replicas"] == min(e["curve"][0]["replicas"] for e in out["routers"].values())
    assert best["gpus"] == best["replicas"] * SPEC.costs.tp
    assert "--policy" in best["commands"]["vllm"]["router"] or "has no" in best["commands"]["vllm"]["router"]


def test_fleet_commands_name_each_routers_policy_or_say_it_has_none() -> None:
    spec = SPEC.with_deployment(replicas=3, router="cache-aware")
    commands = fleet_commands(spec)
    assert commands["vllm"]["router"].endswith("--policy cache_aware")
    assert commands["vllm"]["router"].count("http://HOST_") == 3
    assert f"--max-num-batched-tokens {SPEC.token_budget}" in commands["vllm"]["replica"]
    # vllm-router's cache_aware reads each prompt's tokens from vLLM's render route: on only with the flag
    assert "--enable-scale-out" in commands["vllm"]["replica"]
    assert (
        "--enable-scale-out"
        not in fleet_commands(spec.with_deployment(router="round-robin"))["vllm"]["replica"]
    )
    assert commands["sglang"]["router"].startswith("python -m sglang_router.launch_router")
    lone = fleet_commands(spec.with_deployment(router="least-requests"))
    assert "has no least-requests policy" in lone["vllm"]["router"]


def test_a_lone_replicas_trial_key_is_unchanged_by_the_fleet_fields() -> None:
    fleet = SPEC.at_replicas(2)
    assert fleet.key() != SPEC.key()
    assert fleet.at_replicas(1).key() == SPEC.key()


def test_trace_arrivals_replay_at_the_asked_rate() -> None:
    own = trace_qps("mooncake-conversation", 500)
    spec = TrialSpec.of(
        SPEC.costs, lengths="mooncake-conversation", arrival="trace", num_requests=500, qps=2 * own
    ).at_replicas(32)  # enough that no queue outlasts the arrivals
    summary = run_trial(spec)
    assert summary["completed"] + summary["rejected"] == 500  # some prompts exceed the context
    span_s = 499 / own
    assert (
        0.5 * span_s <= summary["duration"] < 0.75 * span_s
    )  # twice the rate: the last arrives at half the span


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--router", "fastest"], "--router: unknown fastest"),
        (["--router", "round-robin"], "give --qps"),
        (["--qps", "3"], "give --router too"),
        (["--router", "round-robin", "--qps", "3", "--plot", "x"], "--plot applies to a one-replica tune"),
        (["--kv-host-gb", "0,256"], "--kv-host-gb goes with a fleet tune: give --router too"),
        (["--kv-shared-gb", "0,8192"], "--kv-shared-gb goes with a fleet tune: give --router too"),
        (["--router", "round-robin", "--qps", "3", "--kv-shared-gb", "0,x"], "--kv-shared-gb takes GB sizes"),
        (["--router", "round-robin", "--qps", "3", "--kv-host-gb", "big"], "--kv-host-gb takes GB sizes"),
        (
            ["--router", "round-robin", "--qps", "3", "--kv-host-gb", "256", "--kv-host-link", "usb"],
            "unknown host link",
        ),
    ],
)
def test_fleet_tune_usage_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", "--no-progress", *argv]) == 2
    assert message in capsys.readouterr().err


def _mooncake_fleet() -> tuple[TrialSpec, Slos]:
    """300 of Mooncake's conversation rows at their own rate on Llama-3.1-8B H100s, P99 TTFT 10 s."""
    spec = TrialSpec.of(
        CostChoice(kind="full", model="llama-3.1-8b", hardware="h100-sxm"),
        lengths="mooncake-conversation",
        arrival="trace",
        num_requests=300,
    )
    return spec, Slos.from_mapping({"ttft_p99_ms": 10000.0})


def test_a_host_kv_tier_is_a_dimension_of_the_fleet_search() -> None:
    """Mooncake's conversations on a cache-aware fleet, without and with a host tier a replica: a
    search for each; the host tier's trials run with it (its hits counted), its trial keys differ,
    and a fleet that needs it launches with vLLM's --kv-offloading-size (GiB) and SGLang's HiCache."""
    spec, slos = _mooncake_fleet()
    config = FleetTuneConfig(spec, ("cache-aware",), (2048,), slos, kv_host_gbs=(0.0, 512.0), max_replicas=16)
    out, interrupted = tune_fleet(config, SerialPool(run_trial))
    assert not interrupted
    curve = out["routers"]["cache-aware"]["curve"]
    assert [p["kv_host_gb"] for p in curve] == [0.0, 512.0]
    tiered = [t for t in out["trials"] if t.get("kv_host_gb")]
    assert tiered and all(t["metrics"]["kv_host_hit_rate"] > 0 for t in tiered)
    one = spec.with_serving(256, policy="chunked", max_num_batched_tokens=2048).with_deployment(
        router="cache-aware", replicas=2
    )
    with_host = one.with_deployment(kv_tiers=config.tiers(512.0))
    assert with_host.key() != one.key()
    commands = fleet_commands(with_host)
    assert "--kv-offloading-size 476.8" in commands["vllm"]["replica"]
    assert "--enable-hierarchical-cache --hicache-size 512" in commands["sglang"]["replica"]


def test_a_shared_kv_store_is_a_dimension_of_the_fleet_search_too() -> None:
    """Round-robin sends a conversation's turns to every replica: a store they share finds the
    earlier turns another replica computed. A search per store size; the store's trials count its
    hits; a fleet that needs it launches with LMCache's remote store (vLLM) or HiCache's Mooncake
    store (SGLang)."""
    spec, slos = _mooncake_fleet()
    config = FleetTuneConfig(
        spec, ("round-robin",), (2048,), slos, kv_shared_gbs=(0.0, 4096.0), max_replicas=16
    )
    out, interrupted = tune_fleet(config, SerialPool(run_trial))
    assert not interrupted
    curve = out["routers"]["round-robin"]["curve"]
    assert [(p["kv_host_gb"], p["kv_shared_gb"]) for p in curve] == [(0.0, 0.0), (0.0, 4096.0)]
    shared = [t for t in out["trials"] if t.get("kv_shared_gb")]
    assert shared and all(t["metrics"]["kv_shared_hit_rate"] > 0 for t in shared)
    one = spec.with_serving(256, policy="chunked", max_num_batched_tokens=2048).with_deployment(
        router="round-robin", replicas=2, kv_tiers=config.tiers(0.0, 4096.0)
    )
    commands = fleet_commands(one)
    assert "LMCACHE_REMOTE_URL=" in commands["vllm"]["replica"]
    assert '"kv_connector":"LMCacheConnectorV1"' in commands["vllm"]["replica"]
    assert "--kv-offloading-size" not in commands["vllm"]["replica"]
    assert "--enable-hierarchical-cache --hicache-storage-backend mooncake" in commands["sglang"]["replica"]


def test_with_prices_the_cheapest_fleet_wins_not_the_fewest_replicas(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A store that saves a replica wins at a cheap store and loses at a dear one; the report
    prints each fleet's dollars an hour."""
    argv = ["tune", "--no-progress", "--model", "llama-3.1-8b", "--hardware", "h100-sxm",
            "--lengths", "mooncake-conversation", "--arrival", "trace", "--num-requests", "800", "--router",
            "round-robin", "--budgets", "2048", "--kv-shared-gb", "0,4096", "--slo-ttft-p99-ms", "10000",
            "--slo-tbt-p99-ms", "200", "--max-replicas", "16", "--json", "--gpu-hour-cost", "2.5"]  # fmt: skip
    picks = {}
    for store_price in ("0.0001", "0.01"):
        assert main([*argv, "--store-gb-hour-cost", store_price]) == 0
        out = json.loads(capsys.readouterr().out)
        curve = out["routers"]["round-robin"]["curve"]
        without, with_store = (p["replicas"] for p in curve)
        assert with_store < without  # the store saves a replica at this rate
        for p in curve:
            price = 2.5 * p["replicas"] + float(store_price) * p["kv_shared_gb"]
            assert p["usd_per_hour"] == pytest.approx(price)
        picks[store_price] = out["best"]["kv_shared_gb"]
    assert picks == {"0.0001": 4096.0, "0.01": 0.0}
    from stallfree.tune.report import format_fleet

    text = format_fleet({**out, "backend": {"name": "local", "workers": 1}, "wall_s": 1.0})
    assert "$/hour" in text and f"{out['best']['usd_per_hour']:,.2f}" in text
