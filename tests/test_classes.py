"""Traffic classes: sampling, per-class metrics in simulate, the priority policy's effect, the CLI."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from stallfree.cli import main
from stallfree.core.serving import ServingConfig
from stallfree.sim import Deployment, simulate
from stallfree.workload import sample
from stallfree.workload.classes import TrafficClasses, parse_class

CHAT = "chat:lengths=fixed:256,64,qps=4,ttft=2000,tpot=100"
BATCH = "batch:lengths=fixed:6000,32,qps=0.5,priority=10"


def _classes(*specs: str) -> TrafficClasses:
    return TrafficClasses(tuple(parse_class(s) for s in specs))


def test_classes_share_requests_by_rate_and_merge_by_arrival() -> None:
    classes = _classes(CHAT, BATCH)
    requests = classes.sample(900, seed=3)
    assert [r.request_id for r in requests] == [str(i) for i in range(len(requests))]
    times = [r.arrival_time_s for r in requests]
    assert times == sorted(times)
    chat = [r for r in requests if r.traffic_class == "chat"]
    batch = [r for r in requests if r.traffic_class == "batch"]
    assert (len(chat), len(batch)) == (800, 100)
    assert {r.priority for r in chat} == {0} and {r.priority for r in batch} == {10}
    assert {r.num_prompt_tokens for r in batch} == {6000}
    # Class i draws from seed + i: the chat class alone gives the same arrivals.
    alone = sample(classes.classes[0].workload, 800, 3)
    assert [r.arrival_time_s for r in chat] == alone.arrival_time_s.tolist()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("chat", "expected NAME:lengths"),
        ("chat:qps=2", "give lengths"),
        ("chat:lengths=sharegpt,qps=2,priority=high", "priority must be an integer"),
        ("chat:lengths=sharegpt,qps=0", "qps must be a positive number"),
        ("chat:lengths=sharegpt,qps=2,colour=red", "unknown key 'colour'"),
        ("2chat:lengths=sharegpt,qps=2", "class name"),
        ("agents:trace=mooncake-conversation,qps=2", "qps is the trace's own"),
        ("chat:lengths=sharegpt,qps=2,think=3", "think applies to sessions: give turns=N too"),
        ("chat:lengths=sharegpt,qps=2,turns=2.5", "turns must be a whole number"),
        ("chat:lengths=sharegpt,qps=2,turns=2,system=-4", "system must be a positive number"),
    ],
)
def test_bad_class_specs_say_what_is_wrong(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_class(spec)


def test_a_trace_class_replays_its_trace_beside_a_rated_one() -> None:
    """``trace=``: the trace's arrivals, rows (lengths and prefix hashes) in order, its own rate;
    scaled by replaying it faster."""
    from stallfree.workload.traces import load_trace

    classes = _classes(CHAT, "agents:trace=mooncake-conversation,priority=5")
    agents = classes.classes[1]
    trace = load_trace("mooncake-conversation")
    assert trace.arrival_time_s is not None
    span_s = float(trace.arrival_time_s[-1] - trace.arrival_time_s[0])
    assert agents.qps == pytest.approx((len(trace.arrival_time_s) - 1) / span_s)
    assert classes.scaled(2.0).classes[1].qps == pytest.approx(2 * agents.qps)
    requests = classes.sample(200, seed=1)
    mine = [r for r in requests if r.traffic_class == "agents"]
    assert len(mine) == classes.counts(200)[1]
    assert [r.num_prompt_tokens for r in mine] == trace.num_prompt_tokens[: len(mine)].tolist()
    assert all(r.prompt_blocks is not None and r.priority == 5 for r in mine)
    start = float(trace.arrival_time_s[0])
    assert [r.arrival_time_s for r in mine] == pytest.approx(
        (trace.arrival_time_s[: len(mine)] - start).tolist()
    )


def test_priority_serves_the_chats_first_and_the_classes_add_up() -> None:
    """Long batch prompts at a low priority beside chats: under fcfs a chat waits behind the batch
    prompts queued before it; under priority it goes first, and the batch waits longer."""
    classes = _classes(CHAT.replace("qps=4", "qps=8"), BATCH.replace("qps=0.5", "qps=1.5"))
    out = {}
    for policy in ("fcfs", "priority"):
        deployment = Deployment(serving=ServingConfig(max_num_batched_tokens=512, scheduling_policy=policy))
        result = simulate(classes, deployment, num_requests=400, seed=1)
        per = result.summary["classes"]
        assert per["chat"]["completed"] + per["batch"]["completed"] == result.summary["completed"]
        assert (
            per["chat"]["total_output_tokens"] + per["batch"]["total_output_tokens"]
            == (result.summary["total_output_tokens"])
        )
        # Every ITL sample belongs to one class: the classes' counts add up to the run's.
        assert sum(acc.num_samples for acc in result.class_itl.values()) == result.itl.num_samples
        slow = simulate(classes, deployment, num_requests=400, seed=1, fast=False)
        assert slow.summary == result.summary  # the fast path keeps classes exact too
        out[policy] = per
    assert out["priority"]["chat"]["p99_ttft_ms"] < 0.75 * out["fcfs"]["chat"]["p99_ttft_ms"]
    assert out["priority"]["batch"]["p99_ttft_ms"] > out["fcfs"]["batch"]["p99_ttft_ms"]


def test_a_fleet_scores_classes_across_replicas() -> None:
    classes = _classes(CHAT, BATCH)
    result = simulate(classes, Deployment(replicas=3, router="least-requests"), num_requests=300, seed=2)
    per = result.summary["classes"]
    assert per["chat"]["completed"] + per["batch"]["completed"] == 300
    assert sum(acc.num_samples for acc in result.class_itl.values()) == result.itl.num_samples


def test_cli_prints_a_row_per_class_and_json_has_them(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--classes", CHAT, BATCH, "--num-requests", "200", "--scheduling-policy", "priority"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "prefix caching on, scheduling priority" in text
    rows = [line.split() for line in text.splitlines() if line.split()[:1] in (["chat"], ["batch"])]
    assert [(r[0], r[1]) for r in rows] == [("chat", "0"), ("batch", "10")]
    assert main([*args, "--json"]) == 0
    per = json.loads(capsys.readouterr().out)["policies"]["chunked"]["classes"]
    assert per["chat"]["slos_ms"] == {"ttft": 2000.0, "tpot": 100.0}
    assert per["chat"]["request_goodput"] is not None and per["batch"]["request_goodput"] is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--classes", "chat:lengths=sharegpt,qps=2", "--qps", "3"], "--qps describes one workload"),
        (["--classes", "chat:lengths=sharegpt,qps=2,priority=1.5"], "priority must be an integer"),
        (["--classes", "chat:lengths=sharegpt,qps=2", "chat:lengths=arxiv,qps=1"], "class names must differ"),
        (["--scheduling-policy", "lifo"], "invalid choice: 'lifo'"),
    ],
)
def test_cli_bad_classes_exit_2_with_one_line(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = main(["simulate", *args])
    except SystemExit as exc:  # argparse's own errors
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and "Traceback" not in err


def test_bench_sends_each_class_with_its_priority_and_scores_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Against a virtual replica that queues by priority: every request goes out with its class's
    priority, the result keeps both per request, and each class's scores add up to the run's."""
    from stallfree.costs import CostChoice
    from stallfree.server.launch import ServerThread, build_virtual_server

    deployment = Deployment(
        costs=CostChoice(kind="full", model="llama-3.1-8b", hardware="h100-sxm"),
        serving=ServingConfig(max_num_batched_tokens=512, max_num_seqs=8, scheduling_policy="priority"),
    )
    out = tmp_path / "classes.json"
    with ServerThread(build_virtual_server(deployment, time_scale=4.0)) as server:
        argv = ["bench", "--base-url", server.base_url, "--scenario", "classes", "--classes", CHAT, BATCH]
        assert main([*argv, "--num-requests", "30", "--no-progress", "--save-result", str(out)]) == 0
    text = capsys.readouterr().out
    assert "per class" in text
    result = json.loads(out.read_text())
    requests = _classes(CHAT, BATCH).sample(30, result["seed"])
    assert result["priorities"] == [r.priority for r in requests]
    assert result["traffic_classes"] == [r.traffic_class for r in requests]
    per = result["classes"]
    assert per["chat"]["completed"] + per["batch"]["completed"] == result["completed"] == 30
    assert (
        per["chat"]["total_output_tokens"] + per["batch"]["total_output_tokens"]
        == result["total_output_tokens"]
    )


def test_tune_finds_each_policys_capacity_for_the_mix() -> None:
    """The search's invariant for each candidate: the capacity's trial met every class's SLOs and
    every trial above it missed one; the best is the highest."""
    from stallfree.tune.classes import ClassesTuneConfig, parse_class_slo, tune_classes
    from stallfree.tune.slo import Slos

    name, slo = parse_class_slo("chat:ttft-p99-ms=1500")
    config = ClassesTuneConfig(
        classes=_classes(CHAT, BATCH),
        base=Deployment(),
        slos={name: Slos((slo,))},
        budgets=(512,),
        num_requests=200,
        precision=0.2,
    )
    out = tune_classes(config)
    assert [c["scheduling_policy"] for c in out["candidates"]] == ["fcfs", "priority"]
    for c in out["candidates"]:
        passed = [t["scale"] for t in c["trials"] if t["passed"]]
        failed = [t["scale"] for t in c["trials"] if not t["passed"]]
        assert c["scale"] == max(passed) and all(f > c["scale"] for f in failed)
        assert c["capacity_qps"] == pytest.approx(c["scale"] * 4.5)
    assert out["best"]["capacity_qps"] == max(c["capacity_qps"] for c in out["candidates"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--class-slo", "chat:ttft-p99-ms=100"], "--class-slo applies with --classes"),
        (["--classes", CHAT, "--class-slo", "bulk:ttft-p99-ms=100"], "unknown class 'bulk'"),
        (["--classes", CHAT, "--class-slo", "chat:ttft=100"], "unknown SLO 'ttft'"),
        (["--classes", CHAT], "give at least one class SLO"),
        (["--classes", CHAT, "--class-slo", "chat:ttft-p99-ms=9", "--scheduling-policies", "lifo"], "lifo"),
    ],
)
def test_tune_bad_class_options_exit_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["tune", *args]) == 2
    assert message in capsys.readouterr().err


def test_the_simulator_sheds_the_batch_class_first_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    """--shed-priority 10: batch requests arriving while 2 or more wait for a first token are
    refused (rejected, with the rule's reason); chats never are. Without the rule nothing is."""
    from stallfree.core.config import ShedRule

    classes = _classes(CHAT.replace("qps=4", "qps=12"), BATCH.replace("qps=0.5", "qps=3"))
    plain = simulate(classes, Deployment(), num_requests=300, seed=4).summary
    shed = simulate(classes, Deployment(shed=ShedRule(10, 2)), num_requests=300, seed=4).summary
    assert plain["rejected"] == 0
    per = shed["classes"]
    assert per["chat"]["rejected"] == 0 and per["batch"]["rejected"] > 0
    assert shed["rejected"] == per["batch"]["rejected"]
    (reason,) = shed["rejected_reasons"]
    assert reason.startswith("shed: priority >= 10 while ") and reason.endswith("wait for a first token")
    assert per["chat"]["p99_ttft_ms"] < plain["classes"]["chat"]["p99_ttft_ms"]
    args = [
        "simulate",
        "--classes",
        CHAT,
        BATCH,
        "--num-requests",
        "100",
        "--shed-priority",
        "10",
        "--shed-waiting",
        "0",
    ]
    assert main(args) == 0
    assert "chunked: rejected " in capsys.readouterr().out


def test_a_deployment_file_keeps_its_shedding_rule(tmp_path: Path) -> None:
    from stallfree.core.config import ShedRule

    deployment = Deployment(replicas=2, shed=ShedRule(5, 3))
    assert Deployment.from_dict(deployment.to_dict()) == deployment
    with pytest.raises(ValueError, match="deployment shed: min_priority must be an integer, got 'high'"):
        Deployment.from_dict({"shed": {"min_priority": "high", "max_waiting": 3}})


def test_the_cdf_figures_draw_a_line_per_class() -> None:
    from stallfree.plots.traffic import traffic_figures

    result = simulate(_classes(CHAT, BATCH), Deployment(), num_requests=120, seed=1)
    assert result.traffic_classes and set(result.traffic_classes.values()) == {"chat", "batch"}
    figures = dict(traffic_figures([result]))
    for name in ("ttft_cdf", "itl_cdf"):
        labels = [line.get_label() for line in figures[name].axes[0].get_lines()]
        assert [label.split(" (")[0] for label in labels] == ["chunked chat", "chunked batch"], name


@pytest.mark.parametrize("seed", [0, 7, 23])
@pytest.mark.parametrize("lengths", ["sharegpt", "fixed:900,40"])
def test_one_class_under_fcfs_is_todays_run(seed: int, lengths: str) -> None:
    """A single class, fcfs: the same requests and the same summary as the plain workload (its
    per-class scores aside, which equal the run's)."""
    (only,) = _classes(f"chat:lengths={lengths},qps=6").classes
    plain = simulate(only.workload, Deployment(), num_requests=150, seed=seed)
    classed = simulate(TrafficClasses((only,)), Deployment(), num_requests=150, seed=seed)
    per = classed.summary.pop("classes")["chat"]
    assert classed.summary == plain.summary
    assert classed.records == plain.records
    for key in ("completed", "median_ttft_ms", "p99_itl_ms", "max_itl_ms", "median_tpot_ms"):
        assert per[key] == plain.summary[key], key


def test_a_fleet_sheds_on_the_whole_fleets_queue() -> None:
    """Round-robin over two replicas: a chat goes to replica 0, then a batch request (priority
    10) to replica 1, whose own queue is empty; the fleet has one request waiting for a first
    token, which is the bound: the gateway refuses the batch request."""
    from stallfree.core import Request
    from stallfree.core.config import ShedRule

    requests = [Request("chat", 200, 8, 0.0), Request("batch", 200, 8, 0.0, priority=10)]
    fleet = Deployment(replicas=2, router="round-robin", shed=ShedRule(10, 1))
    records = {r.request_id: r for r in simulate(requests, fleet).records}
    assert records["chat"].finish_reason == "length"
    assert records["batch"].finish_reason == "rejected"
    alone = Deployment(replicas=1, shed=ShedRule(10, 2))  # one replica: 1 waiting is under its bound
    assert {r.finish_reason for r in simulate(requests, alone).records} == {"length"}


SESSIONS = "chat:lengths=fixed:200,50,qps=1,turns=4,system=300,think=2"


def test_a_sessions_class_sends_whole_conversations_that_share_only_their_own_prefixes() -> None:
    """``turns=``: the class's arrivals start sessions; every turn's prompt repeats the turn before
    (prompt and answer) and the class's system prompt; a second sessions class shares no token
    id with the first; the rate and the share count requests (sessions x turns)."""
    classes = _classes(SESSIONS, "agents:lengths=fixed:500,20,qps=0.5,turns=2,system=300", BATCH)
    assert classes.classes[0].qps == 4.0 and classes.qps == 4.0 + 1.0 + 0.5
    requests = classes.sample(110, seed=5)
    by_class = {
        name: [r for r in requests if r.traffic_class == name] for name in ("chat", "agents", "batch")
    }
    assert [len(by_class[n]) for n in ("chat", "agents", "batch")] == [80, 20, 10]
    chat = by_class["chat"]
    sessions: dict[str | None, list[Any]] = {}
    for r in chat:
        sessions.setdefault(r.session_id, []).append(r)
    assert len(sessions) == 20 and all(s is not None and s.startswith("chat-session-") for s in sessions)
    for turns in sessions.values():
        assert [r.arrival_time_s - turns[0].arrival_time_s for r in turns] == pytest.approx([0, 2, 4, 6])
        for before, after in itertools.pairwise(turns):
            assert before.prompt_blocks is not None and after.prompt_blocks is not None
            history = before.prompt_blocks.ids[: before.num_prompt_tokens + before.max_tokens]
            assert after.prompt_blocks.ids[: len(history)] == history
    chat_ids = {i for r in chat if r.prompt_blocks for i in r.prompt_blocks.ids}
    agent_ids = {i for r in by_class["agents"] if r.prompt_blocks for i in r.prompt_blocks.ids}
    assert chat_ids and agent_ids and not chat_ids & agent_ids
    assert all(r.prompt_blocks is None and r.session_id is None for r in by_class["batch"])


def test_one_sessions_class_is_the_sessions_workload() -> None:
    (only,) = _classes(SESSIONS).classes
    plain = simulate(only.workload, Deployment(), num_requests=120, seed=4)
    classed = simulate(TrafficClasses((only,)), Deployment(), num_requests=120, seed=4)
    classed.summary.pop("classes")
    assert classed.summary == plain.summary and classed.records == plain.records
    assert plain.summary["prefix_cache_hit_tokens"] > 0


def test_classes_run_on_an_autoscaled_fleet_and_on_pools() -> None:
    """Each class scored, every request and every decode gap in exactly one class, on a fleet an
    autoscaler resizes and on prefill/decode pools; priority still puts the chats first there."""
    from stallfree.core.serving import ServingConfig
    from stallfree.sim.deployment import Autoscale
    from stallfree.sim.disagg import Disaggregation, PoolShape

    classes = _classes(CHAT, BATCH).scaled(4)  # a queue that makes the autoscaler add replicas
    priority = ServingConfig(scheduling_policy="priority")
    deployments = {
        "autoscaled": Deployment(
            serving=priority, autoscale=Autoscale("keda:waiting=2", 1, 4, startup_s=5, scrape_s=5)
        ),
        "pools": Deployment(serving=priority, disaggregate=Disaggregation(PoolShape(1, 1))),
    }
    for name, deployment in deployments.items():
        result = simulate(classes, deployment, num_requests=300, seed=1)
        per = result.summary["classes"]
        assert per["chat"]["completed"] + per["batch"]["completed"] == result.summary["completed"] == 300, (
            name
        )
        assert sum(acc.num_samples for acc in result.class_itl.values()) == result.itl.num_samples, name
        assert per["chat"]["median_ttft_ms"] < per["batch"]["median_ttft_ms"], name
        if name == "autoscaled":
            assert result.summary["autoscale"]["num_replicas_started"] > 1


def test_cli_runs_classes_through_an_autoscaler_and_bench_refuses_a_sessions_class(
    capsys: pytest.CaptureFixture[str],
) -> None:
    chat, batch = CHAT.replace("qps=4", "qps=16"), BATCH.replace("qps=0.5", "qps=2")
    args = ["simulate", "--classes", chat, batch, "--num-requests", "200", "--autoscale", "keda:waiting=2"]
    assert main([*args, "--startup-s", "5", "--scrape-s", "5", "--max-replicas", "3", "--json"]) == 0
    chunked = json.loads(capsys.readouterr().out)["policies"]["chunked"]
    assert set(chunked["classes"]) == {"chat", "batch"} and chunked["autoscale"]["events"]
    assert main([*args, "--startup-s", "4000"]) == 2
    assert "longer than the run's" in capsys.readouterr().err
    code = main(["bench", "--scenario", "classes", "--classes", SESSIONS, "--num-requests", "8"])
    err = capsys.readouterr().err
    assert code == 2 and "class chat has turns=" in err and "Traceback" not in err
