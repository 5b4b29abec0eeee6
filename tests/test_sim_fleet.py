"""simulate() with a fleet: replicas that differ, the summary per replica, the CLI's --fleet."""

from __future__ import annotations

import json

import pytest

from stallfree.cli import main
from stallfree.costs.choice import CostChoice
from stallfree.sim import Deployment, ReplicaGroup, simulate
from stallfree.workload import Workload, parse_lengths, poisson

WORKLOAD = Workload(arrivals=poisson(12.0), lengths=parse_lengths("fixed:1500,80"))
H100 = CostChoice(kind="full", model="llama-3.1-8b", hardware="h100-sxm")
A100 = CostChoice(kind="full", model="llama-3.1-8b", hardware="a100-40gb")


def test_a_fleet_of_one_group_is_the_same_fleet_as_replicas() -> None:
    listed = simulate(
        WORKLOAD,
        Deployment(costs=H100, fleet=(ReplicaGroup(2, "h100-sxm"),), router="least-requests"),
        num_requests=200,
    )
    counted = simulate(
        WORKLOAD, Deployment(costs=H100, replicas=2, router="least-requests"), num_requests=200
    )
    assert listed.records == counted.records
    assert listed.summary == counted.summary


def test_replicas_that_differ_each_have_their_own_speed_and_cache() -> None:
    fleet = (ReplicaGroup(1, "h100-sxm"), ReplicaGroup(1, "a100-40gb"))
    result = simulate(
        WORKLOAD, Deployment(costs=H100, fleet=fleet, router="least-requests"), num_requests=300
    )
    fast, slow = result.summary["replicas"]
    assert (fast["hardware"], slow["hardware"]) == ("h100-sxm", "a100-40gb")
    assert fast["num_kv_blocks"] != slow["num_kv_blocks"]
    assert result.summary["num_kv_blocks"] == fast["num_kv_blocks"] + slow["num_kv_blocks"]
    # least-requests sends more to the faster replica, which frees its slots sooner
    assert fast["completed"] > slow["completed"]
    assert fast["completed"] + slow["completed"] == result.summary["completed"] == 300


def test_a_fleet_is_replica_groups_or_replicas_not_both() -> None:
    with pytest.raises(ValueError, match="replicas or a fleet"):
        Deployment(costs=H100, fleet=(ReplicaGroup(1, "h100-sxm"),), replicas=3)
    with pytest.raises(ValueError, match="fleet 2xnope: unknown hardware"):
        simulate(WORKLOAD, Deployment(costs=H100, fleet=(ReplicaGroup(2, "nope"),)), num_requests=10)


def test_cli_fleet_mix(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "simulate",
        "--model",
        "llama-3.1-8b",
        "--cost-model",
        "full",
        "--qps",
        "8",
        "--num-requests",
        "60",
    ]
    assert main([*argv, "--fleet", "1xh100-sxm:tp2,2xa100-80gb", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["scenario"]["replicas"] == 3 and out["scenario"]["gpus"] == 4
    each = out["policies"]["chunked"]["replicas"]
    assert [(r["hardware"], r["tp"]) for r in each] == [("h100-sxm", 2), ("a100-80gb", 1), ("a100-80gb", 1)]
    assert main([*argv, "--fleet", "2xh100-sxm", "--replicas", "2"]) == 2
    assert "not both" in capsys.readouterr().err
    assert main([*argv, "--fleet", "two h100s"]) == 2
    assert "is not NxHARDWARE" in capsys.readouterr().err
