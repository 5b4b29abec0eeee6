"""A fleet through the day: the HPA's rule on hand-built scrapes, replicas that start, serve and
drain on the one clock with nothing lost or counted twice, rates that change, and the command."""

from __future__ import annotations

import itertools
import json
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stallfree.cli import main
from stallfree.core import Request
from stallfree.core.autoscale import HpaAutoscaler, HpaRule, ReplicaMetrics
from stallfree.core.request import PromptBlocks
from stallfree.core.router import make_router
from stallfree.core.serving import ServingConfig
from stallfree.costs import CostChoice
from stallfree.sim import Deployment, simulate
from stallfree.sim.autoscaled import run_autoscaled
from stallfree.sim.deployment import Autoscale
from stallfree.sim.fleet import run_fleet
from stallfree.sim.traffic import TrafficReplica
from stallfree.workload.arrivals import RateProfile
from tests.factories import OneSecondCosts, make_scheduler


def waiting(*counts: int) -> list[ReplicaMetrics]:
    return [ReplicaMetrics(num_running=4, num_waiting=n, kv_usage=0.5) for n in counts]


def test_hpa_wants_the_sum_over_the_target_outside_its_tolerance() -> None:
    hpa = HpaAutoscaler(HpaRule("waiting", 8), 1, 20)
    assert hpa.desired(0, 2, waiting(8, 9)) == 2  # ratio 17/16: within 10%
    assert hpa.desired(15, 2, waiting(20, 21)) == 6  # ceil(41 / 8)
    assert hpa.desired(30, 3, waiting(40, 40, 40)) == 7  # 15 wanted; at most 3 + max(3, 4) a decision
    assert hpa.desired(45, 20, waiting(*[100] * 20)) == 20  # the ceiling


def test_hpa_scales_down_to_the_highest_recommendation_of_its_window() -> None:
    hpa = HpaAutoscaler(HpaRule("waiting", 4), 2, 20)
    assert hpa.desired(0, 10, waiting(*[4] * 10)) == 10
    assert hpa.desired(100, 10, waiting(*[0] * 10)) == 10  # 0 wanted, but 10 recommended 100 s ago
    assert hpa.desired(301, 10, waiting(*[1] * 10)) == 3  # the window forgot t=0: max(ceil(10/4), 0) = 3
    assert hpa.desired(700, 3, waiting(0, 0, 0)) == 2  # the floor


def test_hpa_on_kv_usage_and_a_lone_starting_fleet() -> None:
    hpa = HpaAutoscaler(HpaRule("kv", 0.5), 1, 8)
    assert hpa.desired(0, 2, [ReplicaMetrics(3, 0, 0.9), ReplicaMetrics(3, 0, 0.8)]) == 4  # ceil(1.7 / 0.5)
    assert hpa.desired(15, 4, []) == 4  # nothing ready to scrape: hold


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ("hpa:queue=3", "unknown autoscaling metric"),
        ("keda:waiting", "METRIC=TARGET"),
        ("hpa:kv=2", "share"),
        ("knative:waiting=3", "unknown autoscaler"),
    ],
)
def test_bad_rules_say_what_is_wrong(rule: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Autoscale(rule)


class RandomScaler:
    """An autoscaler that wants a random size each scrape (the fleet's accounting must not care)."""

    def __init__(self, seed: int, low: int, high: int) -> None:
        self.min_replicas, self.max_replicas = low, high
        self._rng = random.Random(seed)

    def desired(self, now_s: float, current: int, ready: list[ReplicaMetrics], num_arrivals: int) -> int:
        return self._rng.randint(self.min_replicas, self.max_replicas)


def _requests(seed: int, n: int) -> list[Request]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(n):
        t += rng.expovariate(3.0)
        session = rng.randrange(5)
        ids = (session, *(rng.randrange(3) for _ in range(rng.randrange(1, 4))))
        out.append(Request(str(i), 16 * len(ids), rng.randint(1, 6), t, prompt_blocks=PromptBlocks(ids, 16)))
    return out


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    router=st.sampled_from(
        ["round-robin", "least-requests", "power-of-two", "consistent-hash", "cache-aware"]
    ),
    startup_s=st.sampled_from([0.0, 0.5, 3.0]),
    num_blocks=st.sampled_from([12, 200]),
    delay_s=st.sampled_from([0.0, 0.2]),
)
def test_nothing_is_lost_or_counted_twice_as_replicas_come_and_go(
    seed: int, router: str, startup_s: float, num_blocks: int, delay_s: float
) -> None:
    requests = _requests(seed, 60)
    routed: Counter[str] = Counter()
    made: list[TrafficReplica] = []

    def make() -> TrafficReplica:
        made.append(
            TrafficReplica(
                make_scheduler(max_num_seqs=4, num_blocks=num_blocks), OneSecondCosts(), cuttable=True
            )
        )
        return made[-1]

    scaler = RandomScaler(seed, 1, 4)
    run = run_autoscaled(
        make,
        make_router(router, 8, seed),
        scaler,
        requests,
        initial=2,
        startup_s=startup_s,
        scrape_s=0.7,
        route_delay_s=delay_s,
    )
    ids = [r.request_id for r in run.records]
    assert sorted(ids, key=int) == [r.request_id for r in requests]  # each exactly once, in arrival order
    for replica in made:
        routed.update(r.request_id for r in replica.records)
    assert max(routed.values()) == 1 and len(routed) == len(requests)
    for life in run.lifetimes:
        assert life.on_s <= life.off_s and (
            life.ready_s is None or life.ready_s == life.on_s + startup_s or life.on_s == 0
        )
    by_slot: dict[int, list[tuple[float, float]]] = {}
    for life in run.lifetimes:
        by_slot.setdefault(life.slot, []).append((life.on_s, life.off_s))
    for spans in by_slot.values():  # a slot holds one replica at a time
        spans.sort()
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(spans))
    assert sum(r.busy_s for r in run.runs) <= run.replica_seconds() + 1e-9  # busy only while on GPUs


def test_a_fleet_that_never_scales_is_the_fixed_fleet_byte_for_byte() -> None:
    requests = _requests(7, 80)

    def make() -> TrafficReplica:
        return TrafficReplica(make_scheduler(max_num_seqs=4, num_blocks=64), OneSecondCosts(), cuttable=True)

    for router, delay_s in (
        ("round-robin", 0.0),
        ("least-requests", 0.0),
        ("cache-aware", 0.0),
        ("least-requests", 0.3),
    ):
        scaled = run_autoscaled(
            make,
            make_router(router, 3),
            HpaAutoscaler(HpaRule("waiting", 2), 3, 3),
            requests,
            initial=3,
            startup_s=5,
            scrape_s=1.0,
            route_delay_s=delay_s,
        )
        fixed = run_fleet(
            [make().scheduler for _ in range(3)],
            [OneSecondCosts()] * 3,
            make_router(router, 3),
            requests,
            route_delay_s=delay_s,
        )
        assert scaled.records == fixed.records and not scaled.events


def test_simulate_autoscales_up_to_meet_a_burst_and_pays_gpu_hours() -> None:
    costs = CostChoice(kind="full", model="llama-3.1-8b", hardware="h100-sxm")
    scale = Autoscale("keda:waiting=4", 1, 6, startup_s=30, scrape_s=10)
    burst = [Request(str(i), 2000, 300, i / 40) for i in range(6000)]  # 40 QPS for 150 s
    result = simulate(
        burst, Deployment(costs=costs, serving=ServingConfig(), router="least-requests", autoscale=scale)
    )
    a = result.summary["autoscale"]
    assert result.summary["completed"] == 6000 and result.summary["num_replicas_max"] == 6
    assert a["events"][0] == {"time_s": 10.0, "current": 1, "desired": 5}
    first_ready = min(life["ready_s"] for life in a["lifetimes"] if life["ready_s"] is not None)
    assert first_ready == 0 and sorted({life["ready_s"] for life in a["lifetimes"]})[1] == 40.0  # 10 s + 30 s
    assert a["gpu_hours"] == pytest.approx(sum(x["off_s"] - x["on_s"] for x in a["lifetimes"]) / 3600)


def test_a_rate_profile_brings_its_rate() -> None:
    triangle = RateProfile((0.0, 100.0, 200.0), (0.0, 10.0, 0.0))
    assert triangle.expected_requests() == 1000
    times = triangle.times_s(20_000, np.random.default_rng(1))
    quarters = np.histogram(times % 200, bins=4, range=(0, 200))[0] / len(times)
    assert quarters == pytest.approx([1 / 8, 3 / 8, 3 / 8, 1 / 8], abs=0.01)
    assert times[-1] == pytest.approx(20 * 200, rel=0.02)  # the profile repeats
    day = RateProfile.parse("diurnal:6,2")
    assert day.period_s == 86_400 and day.rate_at(0) == 2 and day.rate_at(43_200) == 6
    assert day.expected_requests() == pytest.approx(4 * 86_400)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("time_s,qps\n0,1\n60,2\n60,3\n", "must increase"),
        ("0,1\n60,-2\n", ">= 0"),
        ("0,0\n60,0\n", "no request"),
        ("10,1\n60,2\n", "starts at 0"),
        ("0,1\n", "two"),
        ("0;1\n", "comma-separated"),
    ],
)
def test_a_bad_profile_is_one_line(
    text: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "day.csv"
    path.write_text(text)
    assert main(["simulate", "--rate-profile", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--autoscale", "keda:waiting=4", "--min-replicas", "5", "--max-replicas", "2"], "min replicas"),
        (["--autoscale", "keda:waiting=4", "--startup-s", "100000"], "longer than the run"),
        (["--min-replicas", "2"], "applies with --autoscale"),
        (["--autoscale", "keda:waiting=4", "--replicas", "9"], "outside its bounds"),
        (["--autoscale", "keda:waiting=4", "--disaggregate", "1P1D"], "pools"),
    ],
)
def test_bad_autoscaling_flags_are_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", "--num-requests", "50", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


def test_the_day_command_prints_windows_and_writes_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["simulate", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--cost-model", "full"]
    argv += [
        "--rate-profile",
        "diurnal:30,5,0.5",
        "--lengths",
        "fixed:1500,200",
        "--router",
        "least-requests",
    ]
    argv += ["--autoscale", "keda:waiting=4", "--max-replicas", "6", "--startup-s", "60", "--window-s", "600"]
    argv += ["--goodput", "ttft:1000", "--gpu-hour-cost", "3"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "autoscaled by keda:waiting=4 between 1 and 6 replicas" in out and "GPU-hours ($" in out
    assert main([*argv, "--json", "--plot", str(tmp_path)]) == 0
    body = json.loads(capsys.readouterr().out)
    assert str(tmp_path / "autoscale.png") in body["outputs"] and (tmp_path / "autoscale.png").stat().st_size
    assert (tmp_path / "itl_cdf.png").exists()  # beside the figures every run draws
    scale = body["policies"]["chunked"]["autoscale"]
    assert scale["window_s"] == 600
    windows = scale["windows"]
    assert [w["start_s"] for w in windows] == [0, 600, 1200, 1800][: len(windows)]
    assert sum(w["arrivals"] for w in windows) == pytest.approx(17.5 * 1800, rel=0.05)
    assert max(w["replicas_max"] or 0 for w in windows) > 1 and scale["gpu_hour_cost"] == 3


def test_tune_for_a_day_finds_the_rule_that_meets_the_slos_at_the_fewest_gpu_hours(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["tune", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--cost-model", "full", "--json"]
    argv += ["--lengths", "fixed:1500,150", "--rate-profile", "diurnal:60,10,0.1", "--max-replicas", "4"]
    argv += ["--autoscale", "keda:running=64,keda:kv=0.5", "--min-replicas", "1,2", "--startup-s", "20"]
    argv += ["--slo-ttft-p99-ms", "3000", "--workers", "1", "--deployment-out", str(tmp_path / "best.yaml")]
    assert main(argv) in (0, 1)
    out = json.loads(capsys.readouterr().out)
    rows = out["candidates"]
    assert [(r["rule"], r["min_replicas"]) for r in rows] == [
        ("keda:running=64", 1),
        ("keda:running=64", 2),
        ("keda:kv=0.5", 1),
        ("keda:kv=0.5", 2),
    ]
    met = [r for r in rows if r["met"]]
    if out["best"] is not None:
        assert out["best"]["gpu_hours"] == min(r["gpu_hours"] for r in met)
        assert f'threshold: "{out["best"]["rule"].split("=")[1]}"' in out["scaled_object"]
        best = Deployment.from_dict(__import__("yaml").safe_load((tmp_path / "best.yaml").read_text()))
        assert best.autoscale is not None and best.autoscale.rule == out["best"]["rule"]
    fixed = out["fixed"]
    assert fixed is not None and 1 <= fixed["replicas"] <= 4
    assert all(r["met"] == (not r["binds"]) for r in rows)


def test_the_scale_down_window_is_a_deployment_setting() -> None:
    assert Autoscale("keda:waiting=4").make().rule.scale_down_window_s == 300.0
    short = Autoscale("keda:running=2", 1, 4, scale_down_window_s=30)
    hpa = short.make()
    assert hpa.rule.scale_down_window_s == 30.0
    busy = [ReplicaMetrics(8, 0, 0.0)]
    assert hpa.desired(0.0, 1, busy) == 4
    idle = [ReplicaMetrics(0, 0, 0.0)] * 4
    assert hpa.desired(15.0, 4, idle) == 4  # the 0 s recommendation of 4 is in the window
    assert hpa.desired(31.0, 4, idle) == 1
    with pytest.raises(ValueError, match="scale_down_window_s"):
        Autoscale("keda:waiting=4", scale_down_window_s=-1)


def test_the_sla_rule_forecasts_the_rate_over_its_window_and_divides_by_a_replicas_capacity() -> None:
    from stallfree.core.autoscale import SlaAutoscaler, SlaRule

    sla = SlaAutoscaler(SlaRule.parse("qps=2,interval=60,window=2"), 1, 10)
    assert sla.desired(0.0, 3, [], 0) == 3  # no interval seen yet: hold
    assert sla.desired(30.0, 3, [], 200) == 3  # between plans: hold
    assert sla.desired(60.0, 3, [], 600) == 5  # 10 requests/s / 2 a replica
    assert sla.desired(120.0, 5, [], 1800) == 8  # (10 + 20) / 2 = 15 requests/s
    assert sla.desired(180.0, 8, [], 1800) == 5  # (20 + 0) / 2
    assert sla.desired(240.0, 5, [], 1800) == 1  # (0 + 0): the floor
    for bad in ("qps=0", "interval=60", "qps=2,lag=3"):
        with pytest.raises(ValueError):
            Autoscale(f"sla:{bad}")


def test_simulate_with_the_sla_rule_sizes_the_fleet_to_the_rate() -> None:
    costs = CostChoice(kind="full", model="llama-3.1-8b", hardware="h100-sxm")
    scale = Autoscale("sla:qps=4,interval=30,window=1", 1, 8, startup_s=10, scrape_s=10)
    rising = [Request(str(i), 500, 50, i / 16) for i in range(16 * 120)]  # 16 requests/s for two minutes
    result = simulate(rising, Deployment(costs=costs, router="least-requests", autoscale=scale))
    assert result.summary["completed"] == len(rising)
    # first scraped at 10 s, planned 30 s later: 16 requests/s over 4 a replica
    assert result.summary["autoscale"]["events"][0] == {"time_s": 40.0, "current": 1, "desired": 4}
