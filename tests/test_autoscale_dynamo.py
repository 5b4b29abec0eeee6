"""Dynamo Planner's load-based rule (ai-dynamo 1.4.2, aggregated): one step up when a replica's KV
load passes the up threshold, one down when every replica is under the down one, a hold while a
replica starts, its tick and its clamps; what the fleet hands it; the command through a burst."""

from __future__ import annotations

import itertools
import json
import subprocess
from pathlib import Path

import pytest

from stallfree.cli import main
from stallfree.core import Request
from stallfree.core.autoscale import DynamoLoadAutoscaler, ReplicaMetrics
from stallfree.core.router import make_router
from stallfree.sim.autoscaled import run_autoscaled
from stallfree.sim.deployment import Autoscale
from stallfree.sim.traffic import TrafficReplica
from stallfree.tune.day import format_day_tune, real_config, split_rules
from tests.factories import OneSecondCosts, make_scheduler

KV = 10_000  # each replica's KV capacity in tokens
DYNOSIM_VENV = Path("/tmp/dynosim-venv")  # ai-dynamo 1.4.2 (the DynoSim benchmark makes it)


def loads(*shares: float) -> list[ReplicaMetrics]:
    """Ready replicas at these KV loads, split between decoding KV and waiting prompts."""
    return [
        ReplicaMetrics(4, 1, 0.5, round(s * KV / 2), round(s * KV) - round(s * KV / 2), KV) for s in shares
    ]


def planner(rule: str, low: int = 1, high: int = 8) -> DynamoLoadAutoscaler:
    scaler = Autoscale(f"dynamo-load:{rule}", low, high).make()
    assert isinstance(scaler, DynamoLoadAutoscaler)
    return scaler


def test_one_replica_over_the_threshold_adds_one_and_all_under_removes_one() -> None:
    p = planner("latency")  # up above 40% of the KV, down below 10%
    assert p.desired(0.0, 3, loads(0.05, 0.41, 0.0)) == 4  # one is enough, and one step only
    assert p.desired(5.0, 4, loads(0.4, 0.39, 0.2, 0.1)) == 4  # exactly 40%: not above; 10%: not below
    assert p.desired(10.0, 4, loads(0.09, 0.0, 0.05, 0.099)) == 3  # every one below 10%
    assert p.desired(15.0, 3, loads(0.0, 0.0, 0.11)) == 3  # one at 11%: hold
    assert p.desired(20.0, 1, loads(0.0)) == 1  # never below one replica


def test_the_throughput_target_and_the_load_targets_inclusive_thresholds() -> None:
    t = planner("")  # Dynamo's default target: throughput, up above 100%, down below 60%
    assert t.desired(0.0, 2, loads(1.0, 0.9)) == 2
    assert t.desired(5.0, 2, loads(1.01, 0.0)) == 3  # prompts queued past the cache
    assert t.desired(10.0, 3, loads(0.59, 0.5, 0.0)) == 2
    user = planner("up=80,down=30")  # the load target: at or above 80%, at or below 30%
    assert user.desired(0.0, 2, loads(0.8, 0.1)) == 3
    assert user.desired(5.0, 3, loads(0.3, 0.3, 0.0)) == 2
    assert user.desired(10.0, 2, loads(0.31, 0.0)) == 2


def test_it_holds_while_a_replica_starts_and_without_a_known_capacity() -> None:
    p = planner("latency")
    assert p.desired(0.0, 3, loads(0.9, 0.9)) == 3  # 3 wanted, 2 ready: the planner's "scaling in progress"
    assert p.desired(5.0, 3, loads(0.0, 0.0)) == 3  # not down either
    assert p.desired(10.0, 2, []) == 2
    blind = [ReplicaMetrics(8, 30, 0.99)]  # vLLM's gauges only (a scraped /metrics): no capacity known
    assert p.desired(15.0, 1, blind) == 1
    assert p.desired(20.0, 2, loads(0.9, 0.9)) == 3  # ready again: it acts


def test_it_decides_once_an_interval_and_holds_between() -> None:
    p = planner("latency,interval=10")
    assert p.desired(0.0, 1, loads(0.9)) == 2
    assert p.desired(4.0, 2, loads(0.9, 0.9)) == 2  # 4 s after its tick: hold, however loaded
    assert p.desired(8.0, 2, loads(0.9, 0.9)) == 2
    assert p.desired(10.0, 2, loads(0.9, 0.9)) == 3  # its next tick
    five = planner("latency")  # 5 s by default: load_adjustment_interval_seconds
    assert five.desired(0.0, 1, loads(0.9)) == 2
    assert five.desired(3.0, 2, loads(0.9, 0.9)) == 2
    assert five.desired(5.0, 2, loads(0.9, 0.9)) == 3


def test_its_answer_is_clamped_to_the_bounds() -> None:
    p = planner("latency", low=2, high=4)
    assert (
        p.desired(0.0, 4, loads(0.9, 0.9, 0.9, 0.9)) == 4
    )  # the ceiling: max_gpu_budget over a replica's GPUs
    assert p.desired(5.0, 2, loads(0.0, 0.0)) == 2  # the floor: min_endpoint
    assert p.desired(10.0, 1, loads(0.0)) == 2  # below the floor (a hold) comes up to it


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ("dynamo-load:sla", "regressions"),
        ("dynamo-load:fast", "unknown Dynamo target"),
        ("dynamo-load:latency,up=80,down=30", "fixed thresholds"),
        ("dynamo-load:up=80", "needs up=PERCENT and down=PERCENT"),
        ("dynamo-load:up=30,down=30", "down < up"),
        ("dynamo-load:up=130,down=30", "down < up"),
        ("dynamo-load:latency,interval=2.5", "whole seconds"),
        ("dynamo-load:latency,lag=3", "give the Dynamo rule as"),
        ("dynamo-load:latency,throughput", "give the Dynamo rule as"),
    ],
)
def test_bad_dynamo_rules_say_what_is_wrong(rule: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Autoscale(rule)


def test_the_fleet_hands_it_decoding_kv_waiting_prompts_and_the_capacity() -> None:
    seen: list[tuple[ReplicaMetrics, int]] = []

    class Recorder:
        min_replicas = max_replicas = 1

        def desired(self, now_s: float, current: int, ready: list[ReplicaMetrics], num_arrivals: int) -> int:
            seen.extend((m, replicas[0].scheduler.num_preemptions) for m in ready)
            return 1

    replicas: list[TrafficReplica] = []

    def make() -> TrafficReplica:
        replicas.append(
            TrafficReplica(make_scheduler(max_num_seqs=3, num_blocks=12), OneSecondCosts(), cuttable=True)
        )
        return replicas[-1]

    requests = [Request(str(i), 32, 40, i * 0.25) for i in range(8)]  # outgrow 12 blocks: preemptions
    run_autoscaled(
        make, make_router("round-robin", 2), Recorder(), requests, initial=1, startup_s=0, scrape_s=0.5
    )
    assert seen and all(m.max_kv_tokens == 12 * 16 for m, _ in seen)
    for m, _ in seen:
        assert (
            m.num_decode_kv_tokens <= m.num_running * (32 + 40)
            and m.num_queued_prompt_tokens <= 32 * m.num_waiting
        )
    assert any(m.num_decode_kv_tokens > 32 * m.num_running > 0 for m, _ in seen)  # decoding past the prompt
    assert any(m.num_queued_prompt_tokens == 32 * m.num_waiting > 0 for m, _ in seen)
    # a preempted request waits again holding no KV, and counts none (vLLM V1 resets it)
    assert any(m.num_queued_prompt_tokens < 32 * m.num_waiting for m, preempted in seen if preempted)


def test_simulate_with_dynamo_load_scales_up_through_a_burst_and_back_down(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    profile = tmp_path / "burst.csv"
    profile.write_text("time_s,qps\n0,30\n120,30\n121,1\n480,1\n")
    argv = ["simulate", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--cost-model", "full"]
    argv += ["--rate-profile", str(profile), "--num-requests", "3800", "--lengths", "fixed:2000,300"]
    argv += ["--router", "least-requests", "--autoscale", "dynamo-load:latency", "--max-replicas", "6"]
    argv += ["--startup-s", "20", "--scrape-s", "5", "--json"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)["policies"]["chunked"]
    scale = summary["autoscale"]
    events = [(e["time_s"], e["current"], e["desired"]) for e in scale["events"]]
    assert summary["completed"] == 3800 and scale["rule"] == "dynamo-load:latency"
    assert all(abs(desired - current) == 1 for _, current, desired in events)  # one replica a decision
    peak = max(desired for _, _, desired in events)
    assert (
        peak >= 3 and max(t for t, current, desired in events if desired > current) < 140
    )  # up in the burst
    assert events[-1][2] < peak and events[-1][0] > 121  # and down after it
    ups = [t for t, current, desired in events if desired > current]
    assert all(b - a >= 20 for a, b in itertools.pairwise(ups))  # waits for each start-up


def test_tune_splits_rules_and_prints_the_planners_config() -> None:
    assert split_rules("keda:waiting=4,dynamo-load:up=80,down=30,interval=10,dynamo-load,sla:qps=2") == (
        "keda:waiting=4",
        "dynamo-load:up=80,down=30,interval=10",
        "dynamo-load",
        "sla:qps=2",
    )
    best = {
        "rule": "dynamo-load:up=80,down=30,interval=10",
        "min_replicas": 2,
        "max_replicas": 6,
        "gpu_hours": 1.5,
        "deployment": {"autoscale": {"min_replicas": 2, "max_replicas": 6, "scrape_s": 5.0}},
    }
    config = real_config(best, "llama-3.1-70b", 2)
    assert config["scaled_object"] is None and config["planner_config"] is not None
    lines = config["planner_config"].splitlines()
    for line in (
        "mode: agg",
        "optimization_target: load",
        "decode_scale_up_kv_rate: 80",
        "decode_scale_down_kv_rate: 30",
        "load_adjustment_interval_seconds: 10",
        "min_endpoint: 2",
        "decode_engine_num_gpu: 2",
    ):
        assert line in lines
    assert any(line.startswith("max_gpu_budget: 12 ") for line in lines)  # 6 replicas of 2 GPUs
    out = {
        "num_requests": 10,
        "hours": 1.0,
        "slos": {},
        "candidates": [{**best, "peak_replicas": 4, "replicas_started": 5, "met": True, "binds": []}],
        "fixed": None,
        "saved": None,
        "best": best,
        **config,
    }
    assert "Dynamo Planner, ai-dynamo 1.4.2" in format_day_tune(out)
    sla = real_config({**best, "rule": "sla:qps=2"}, "m", 1)
    assert sla == {"scaled_object": None, "planner_config": None}


@pytest.mark.skipif(
    not (DYNOSIM_VENV / "bin" / "python").exists(), reason="DynoSim's venv (the benchmark makes it)"
)
def test_live_the_rule_decides_as_dynamo_planner_does() -> None:
    """Dynamo Planner 1.4.2's own PlannerScalingState and this rule, tick by tick (the planner's
    code runs in its venv: tests/dynamo_planner_check.py)."""
    script = Path(__file__).resolve().parent / "dynamo_planner_check.py"
    done = subprocess.run(
        [str(DYNOSIM_VENV / "bin" / "python"), str(script), "4000"],
        check=True,
        capture_output=True,
        text=True,
    )
    out = json.loads(done.stdout)
    assert out["num_differ"] == 0, out["differ"]
    assert min(out["moves"].values()) > 0  # up, hold and down all exercised


def test_a_replicas_figures_come_from_its_scheduler_as_dynamo_counts_them() -> None:
    """Decoding requests' KV tokens, waiting prompts' tokens, the capacity: what the simulated
    fleet hands the rule and what `serve`'s /metrics shows a live controller."""
    from stallfree.core import Request
    from stallfree.core.step import run_step
    from tests.factories import make_scheduler, one_second

    scheduler = make_scheduler("chunked", num_blocks=64, max_num_seqs=1, token_budget=64)
    scheduler.add_request(Request("a", 40, 8))
    scheduler.add_request(Request("b", 30, 8))
    assert ReplicaMetrics.of(scheduler) == ReplicaMetrics(0, 2, 0.0, 0, 70, 64 * 16)
    run_step(scheduler, one_second)  # a's prompt, its first token; b waits (one sequence at a time)
    run_step(scheduler, one_second)  # a decodes
    got = ReplicaMetrics.of(scheduler)
    assert (got.num_running, got.num_waiting) == (1, 1)
    assert (got.num_decode_kv_tokens, got.num_queued_prompt_tokens, got.max_kv_tokens) == (41, 30, 1024)


def test_the_server_shows_the_figures_on_its_metrics() -> None:
    from stallfree.server.prometheus import ServerMetrics

    metrics = ServerMetrics("m")
    metrics.update_engine(
        num_running=1,
        num_waiting=1,
        num_used_blocks=3,
        num_blocks=64,
        new_preemptions=0,
        load_tokens=(41, 30, 1024),
    )
    text = metrics.render().decode()
    for line in ('stallfree:decode_kv_tokens{model_name="m"} 41.0', 'stallfree:queued_prompt_tokens{model_name="m"} 30.0',
                 'stallfree:kv_capacity_tokens{model_name="m"} 1024.0'):  # fmt: skip
        assert line in text
