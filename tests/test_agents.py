"""Agent sessions: turns released as the turns they wait for finish, in the simulator and
against a live (virtual) server; the synthetic agents, the trace readers and their errors."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from stallfree.cli import main
from stallfree.core import Request
from stallfree.core.serving import ServingConfig
from stallfree.costs import CostChoice
from stallfree.metrics import RequestRecord
from stallfree.sim import Deployment, simulate
from stallfree.workload import FixedLengths, poisson
from stallfree.workload.agent_traces import load_agent_trace
from stallfree.workload.agents import Agents, AgentTurn, AgentTurns, agent_turns

DEPLOYMENT = Deployment(costs=CostChoice(kind="full", model="llama-3.1-8b", hardware="h100-sxm"))
AGENTS = Agents(
    6,
    turns=5,
    shared_prefix_tokens=4000,
    lengths=FixedLengths(500, 60),
    tool_wait_s=0.5,
    subagent_probability=0.5,
    subagent_width=2,
    subagent_turns=2,
    arrivals=poisson(1.0),
)


def _records(turns: AgentTurns, deployment: Deployment = DEPLOYMENT) -> dict[str, RequestRecord]:
    records = {r.request_id: r for r in simulate(turns, deployment).records}
    assert len(records) == len(turns)
    return records


def _check_order(turns: AgentTurns, records: dict[str, RequestRecord]) -> None:
    """Every turn arrives its delay after the last turn it waits for finished, never before, and
    is scheduled no earlier than it arrives."""
    for turn in turns.turns:
        rec = records[turn.request.request_id]
        assert rec.first_scheduled_s is not None and rec.first_scheduled_s >= rec.arrival_s
        if turn.wait_for:
            ready_s = max(records[w].finish_s for w in turn.wait_for) + turn.delay_s
            assert rec.arrival_s == pytest.approx(ready_s, abs=1e-9)
        else:
            assert rec.arrival_s == turn.request.arrival_time_s


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_turn_starts_only_after_what_it_waits_for_finished_and_its_tool_wait(replicas: int) -> None:
    turns = agent_turns(AGENTS, seed=4)
    joins = [t for t in turns.turns if len(t.wait_for) > 1]
    assert joins, "the seed should fan out sub-agents"
    deployment = Deployment(costs=DEPLOYMENT.costs, replicas=replicas, router="cache-aware")
    records = _records(turns, deployment)
    _check_order(turns, records)
    for join in joins:  # the main agent's next turn waits for every sub-agent's last turn
        rec = records[join.request.request_id]
        assert all(rec.arrival_s >= records[w].finish_s + join.delay_s - 1e-9 for w in join.wait_for)


def test_the_shared_prefix_and_each_agents_history_are_prefix_cache_hits() -> None:
    turns = agent_turns(AGENTS, seed=4)
    records = _records(turns)
    first = records["0.0"]
    block = 16
    for turn in turns.turns:
        rec = records[turn.request.request_id]
        if turn.extends is not None:  # the session so far: the previous prompt at least
            before = turns.by_id[turn.extends].request
            assert rec.num_cached_tokens >= before.num_prompt_tokens // block * block
        elif rec.arrival_s > first.finish_s:  # a fresh context: the prefix another agent computed
            assert rec.num_cached_tokens >= AGENTS.shared_prefix_tokens // block * block
    no_prefix = agent_turns(replace(AGENTS, shared_prefix_tokens=0), seed=4)
    starts = [
        r
        for r in _records(no_prefix).values()
        if r.request_id.count(".") == 1 and r.request_id.endswith(".0")
    ]
    assert len(starts) == AGENTS.num_agents and all(r.num_cached_tokens == 0 for r in starts)


def test_the_same_seed_draws_the_same_agents_and_the_rate_changes_only_the_starts() -> None:
    a, b = agent_turns(AGENTS, seed=9), agent_turns(AGENTS, seed=9)
    assert [t.request for t in a.turns] == [t.request for t in b.turns]
    assert [t.wait_for for t in a.turns] == [t.wait_for for t in b.turns]
    slower = agent_turns(replace(AGENTS, arrivals=poisson(0.1)), seed=9)
    assert [(t.request.num_prompt_tokens, t.wait_for, t.delay_s) for t in a.turns] == [
        (t.request.num_prompt_tokens, t.wait_for, t.delay_s) for t in slower.turns
    ]
    starts = [
        t.request.arrival_time_s for t in a.turns if not t.wait_for and t.request.request_id.count(".") == 1
    ]
    assert starts != [
        t.request.arrival_time_s
        for t in slower.turns
        if not t.wait_for and t.request.request_id.count(".") == 1
    ]


def _turn(rid: str, *waits: str) -> AgentTurn:
    return AgentTurn(Request(rid, 100, 5), waits)


@pytest.mark.parametrize(
    ("turns", "message"),
    [
        ([_turn("a"), _turn("b", "c"), _turn("c", "b")], "cycle: b -> c -> b"),
        ([_turn("a", "a")], "cycle: a -> a"),
        ([_turn("a"), _turn("b", "zz")], "waits for unknown request 'zz'"),
        ([_turn("a"), _turn("a")], "'a' appears twice"),
    ],
)
def test_bad_dependencies_are_refused_in_one_line(turns: list[AgentTurn], message: str) -> None:
    with pytest.raises(ValueError, match=message) as error:
        AgentTurns(tuple(turns), "test")
    assert "\n" not in str(error.value)


def _write(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


AGENTIC: list[dict[str, object]] = [
    {"request_id": "r1", "session_id": "s1", "timestamp": 1000, "input_length": 2000, "output_length": 50,
     "hash_ids": [1, 2, 3, 4]},
    {"request_id": "r2", "session_id": "s1", "wait_for": ["r1"], "tool_wait_ms": 500, "input_length": 2600,
     "output_length": 40, "hash_ids": [1, 2, 3, 4, 5, 6], "tool_events": [], "branches": []},
    {"request_id": "sub", "session_id": "s2", "wait_for": ["r1"], "input_tokens": 1200, "output_tokens": 30,
     "hash_ids": [1, 2, 9]},
    {"request_id": "r3", "session_id": "s1", "wait_for": ["r2", "sub"], "delay": 100, "tool_wait_ms": 200,
     "input_length": 3000, "output_length": 30, "hash_ids": [1, 2, 3, 4, 5, 6]},
]  # fmt: skip


def test_an_agentic_mooncake_trace_runs_each_row_after_its_waits(tmp_path: Path) -> None:
    turns = load_agent_trace(_write(tmp_path / "a.jsonl", AGENTIC), "agentic_mooncake")
    by_id = turns.by_id
    assert by_id["r1"].request.arrival_time_s == 0.0  # shifted: the first start at 0 s
    assert by_id["r3"].wait_for == ("r2", "sub") and by_id["r3"].delay_s == pytest.approx(0.3)
    assert (by_id["r2"].extends, by_id["sub"].extends, by_id["r3"].extends) == ("r1", None, "r2")
    records = _records(turns)
    _check_order(turns, records)
    # The sub-agent shares r1's first two 512-token blocks.
    assert records["sub"].num_cached_tokens >= 1024 - 16


def test_mooncake_session_rows_wait_for_the_previous_turn_of_their_session(tmp_path: Path) -> None:
    rows: list[dict[str, object]] = [
        {"session_id": "a", "timestamp": 0, "input_length": 1000, "output_length": 50, "hash_ids": [1, 2]},
        {"session_id": "a", "delay": 2000, "input_length": 1500, "output_length": 50, "hash_ids": [1, 2, 3]},
        {"session_id": "b", "timestamp": 300, "input_length": 700, "output_length": 20},
        {"timestamp": 500, "input_length": 700, "output_length": 20},
        {"session_id": "b", "timestamp": 5300, "input_length": 900, "output_length": 20},
    ]
    turns = load_agent_trace(_write(tmp_path / "m.jsonl", rows), "mooncake")
    assert [(t.wait_for, t.delay_s) for t in turns.turns] == [
        ((), 0.0),
        (("0",), 2.0),
        ((), 0.0),
        ((), 0.0),
        (("2",), 5.0),  # b's delay: the timestamps' gap
    ]
    assert turns.num_sessions == 3
    _check_order(turns, _records(turns))


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([{"request_id": "a", "timestamp": 0, "input_length": 10}], "missing output_length"),
        ([{"request_id": "a", "input_length": 10, "output_length": 2}], "no timestamp"),
        ([{"request_id": "a", "timestamp": 0, "input_length": 0, "output_length": 2}], "input_length"),
        ([{"request_id": "a", "timestamp": 0, "input_length": 9, "output_length": 2, "tool_wait_ms": -1}], "tool_wait_ms"),
        ([{"request_id": "a", "timestamp": 0, "input_length": 9, "output_length": 2, "wait_for": "b"}], "wait_for"),
        ([{"timestamp": 0, "input_length": 9, "output_length": 2}], "request_id"),
    ],
)  # fmt: skip
def test_bad_rows_are_refused_in_one_line_naming_the_line(
    tmp_path: Path, rows: list[dict[str, object]], message: str
) -> None:
    path = _write(tmp_path / "bad.jsonl", rows)
    with pytest.raises(ValueError, match=message) as error:
        load_agent_trace(path, "agentic_mooncake")
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([*AGENTIC[:3], {**AGENTIC[3], "wait_for": ["r2", "nope"]}], "waits for unknown request 'nope'"),
        ([{**AGENTIC[0], "wait_for": ["r2"]}, AGENTIC[1]], "cycle: r1 -> r2 -> r1"),
    ],
)
def test_a_bad_trace_is_one_line_and_exit_2(
    tmp_path: Path, rows: list[dict[str, object]], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path / "t.jsonl", rows)
    assert main(["simulate", "--trace", str(path), "--trace-format", "agentic_mooncake"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--agents", "2", "--tool-wait-s", "-1"], "--tool-wait-s must be >= 0"),
        (["--agents", "2", "--subagent-probability", "2"], "--subagent-probability must be in [0, 1]"),
        (["--agents", "2", "--sessions", "3"], "not with --sessions"),
        (["--agent-turns", "3"], "applies to agent sessions"),
        (["--trace-format", "mooncake"], "give --trace"),
        (["--agents", "2", "--policy", "chunked,disagg:1P1D"], "not with disaggregation"),
    ],
)
def test_simulate_agent_options_fail_with_one_line(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", "--model", "llama-3.1-8b", *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_simulate_agents_prints_true_counts(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--agents", "3", "--agent-turns", "3", "--agent-prefix-tokens", "1000"]
    argv += ["--lengths", "fixed:200,20", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--json"]
    assert main(argv) == 0
    body = json.loads(capsys.readouterr().out)
    turns = agent_turns(Agents(3, turns=3, shared_prefix_tokens=1000, lengths=FixedLengths(200, 20)), seed=0)
    assert body["scenario"]["num_requests"] == len(turns)
    assert body["policies"]["chunked"]["completed"] == len(turns)
    assert f"{len(turns)} turns in {turns.num_sessions} conversations" in body["scenario"]["workload"]


def test_a_rejected_turn_stops_its_agent() -> None:
    """A turn the replica refuses (longer than the context) never finishes: its agent's later
    turns never arrive, and the run still ends."""
    turns = AgentTurns((_turn("a"), AgentTurn(Request("big", 9000, 5), ("a",)), _turn("c", "big")), "t")
    small = Deployment(costs=CostChoice(kind="full", model="llama-3-8b", hardware="h100-sxm"))
    records = {r.request_id: r for r in simulate(turns, small).records}
    assert records["big"].finish_reason == "rejected" and "c" not in records


@pytest.mark.parametrize(
    "extra",
    [
        ["--scenario", "agents"],
        ["--scenario", "poisson", "--agents", "2"],
        ["--scenario", "agents", "--agents", "2", "--sessions", "2"],
        ["--scenario", "agents", "--trace-format", "mooncake"],
        ["--scenario", "agents", "--agents", "2", "--max-tokens", "5"],
        ["--scenario", "long-prompt", "--tool-wait-s", "1"],
    ],
)
def test_bench_agent_options_fail_with_one_line(extra: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--base-url", "http://127.0.0.1:9", *extra]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_bench_sends_the_session_so_far_after_each_tool_wait(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Against a virtual replica: every turn is sent, each after what it waits for came back and
    its tool wait; each continuing prompt holds the previous one and its answer, so the server's
    prefix cache finds the shared prefix and the history."""
    from stallfree.server.launch import ServerThread, build_virtual_server

    deployment = Deployment(
        costs=DEPLOYMENT.costs, serving=ServingConfig(max_num_batched_tokens=512, max_num_seqs=16)
    )
    out = tmp_path / "agents.json"
    argv = [
        "--agents",
        "3",
        "--agent-turns",
        "3",
        "--agent-prefix-tokens",
        "800",
        "--lengths",
        "fixed:120,16",
    ]
    argv += [
        "--tool-wait-s",
        "0.05",
        "--subagent-probability",
        "1",
        "--subagents",
        "2",
        "--subagent-turns",
        "2",
    ]
    with ServerThread(build_virtual_server(deployment, time_scale=4.0)) as server:
        state = server.app.state.engine_thread.engine.scheduler.state
        bench = ["bench", "--base-url", server.base_url, "--scenario", "agents", "--seed", "5", *argv]
        assert main([*bench, "--no-progress", "--save-result", str(out)]) == 0
        hits, queried = state.num_prefix_hit_tokens, state.num_prefix_queried_tokens
    capsys.readouterr()
    result = json.loads(out.read_text())
    turns = agent_turns(
        Agents(3, turns=3, shared_prefix_tokens=800, lengths=FixedLengths(120, 16), tool_wait_s=0.05,
               subagent_probability=1, subagent_width=2, subagent_turns=2), seed=5,
    )  # fmt: skip
    assert result["completed"] == len(turns) and result["agents"]["sent"] == len(turns)
    sent = {rid: i for i, rid in enumerate(result["turn_ids"])}
    arrival = result["arrival_times"]
    ttft = result["ttfts"]
    for turn in turns.turns:
        i = sent[turn.request.request_id]
        for w in turn.wait_for:  # sent after the turn it waits for came back (its last token)
            j = sent[w]
            assert arrival[i] >= arrival[j] + ttft[j]
        if turn.extends is not None:  # the previous prompt and its answer, then the new text
            j = sent[turn.extends]
            assert result["input_lens"][i] >= result["input_lens"][j] + result["output_lens"][j] // 2
    assert hits > 0.5 * queried
