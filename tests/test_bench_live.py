"""``stallfree bench`` against a real ``stallfree`` server, and its bad-input errors."""

from __future__ import annotations

import itertools
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from stallfree.cli import main
from stallfree.server.launch import ServerThread, build_server

MODEL = "random:tiny"
VLLM_KEYS = [
    "completed",
    "duration",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    *(
        f"{s}_{m}_ms"
        for m in ("ttft", "tpot", "itl", "e2el")
        for s in ("mean", "median", "std", "p90", "p99")
    ),
    "max_itl_ms",
]


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    app = build_server(MODEL, dtype="float32", device="cpu", token_budget=64, num_blocks=2048)
    with ServerThread(app) as running:
        yield running


def test_long_prompt_scenario(server: ServerThread, tmp_path: Path) -> None:
    out = tmp_path / "long.json"
    argv = ["bench", "--base-url", server.base_url, "--scenario", "long-prompt", "--streams", "4"]
    argv += ["--prompt-tokens", "600", "--stream-max-tokens", "400", "--save-result", str(out)]
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert all(key in result for key in VLLM_KEYS)
    assert result["completed"] == 5 and result["failed"] == 0
    # Sized on the calibration line, then trimmed on the server's count: at most what was asked.
    assert 540 <= result["long_prompt_tokens"] <= 600
    assert result["streams_max_itl_ms"] >= result["streams_median_itl_ms"] > 0
    assert result["long_prompt_ttft_ms"] > 0 and result["long_prompt_alone_ttft_ms"] > 0
    assert result["streams_not_decoding_to_the_end"] == 0
    assert _blocks_freed(server)  # the streams the client hung up on were aborted


def test_a_long_prompt_past_the_context_is_capped_to_fit(
    server: ServerThread, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "capped-long.json"
    argv = ["bench", "--base-url", server.base_url, "--scenario", "long-prompt", "--streams", "2"]
    argv += ["--prompt-tokens", "5000", "--stream-max-tokens", "400", "--save-result", str(out)]
    assert main(argv) == 0
    result = json.loads(out.read_text())
    context = 1024  # random:tiny's
    assert result["failed"] == 0 and result["long_prompt_cap"] == context - 8  # 8 output tokens
    assert context * 0.9 <= result["long_prompt_tokens"] <= context - 8
    assert f"capped at {context - 8} tokens" in capsys.readouterr().err


def _blocks_freed(server: ServerThread) -> bool:
    scheduler = server.app.state.engine_thread.engine.scheduler
    deadline_s = time.monotonic() + 10
    while scheduler.block_manager.num_used_blocks and time.monotonic() < deadline_s:
        time.sleep(0.02)
    return scheduler.block_manager.num_used_blocks == 0


def test_poisson_scenario_with_trace_lengths(server: ServerThread, tmp_path: Path) -> None:
    out = tmp_path / "poisson.json"
    argv = ["bench", "--base-url", server.base_url, "--scenario", "poisson", "--qps", "50"]
    argv += ["--lengths", "sharegpt", "--num-requests", "12", "--max-total-tokens", "300"]
    argv += ["--no-progress", "--save-result", str(out)]
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert result["completed"] == 12
    assert all(key in result for key in VLLM_KEYS)
    # ignore_eos: every request generated exactly what was asked, as the server's usage says.
    assert result["total_output_tokens"] == sum(result["output_lens"])
    assert all(n + p <= 300 + 30 for n, p in zip(result["output_lens"], result["input_lens"], strict=True))
    assert len(result["itls"]) == 12


def test_lengths_are_capped_to_the_listed_context(server: ServerThread, tmp_path: Path) -> None:
    out = tmp_path / "capped.json"
    argv = [
        "bench",
        "--base-url",
        server.base_url,
        "--scenario",
        "gamma",
        "--qps",
        "100",
        "--burstiness",
        "0.5",
    ]
    argv += ["--lengths", "fixed:5000,20", "--num-requests", "3", "--no-progress", "--save-result", str(out)]
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert (result["completed"], result["rejected"]) == (3, 0)
    assert all(p + o <= 1024 for p, o in zip(result["input_lens"], result["output_lens"], strict=True))


def test_multi_turn_sessions_send_the_conversation_back(
    server: ServerThread, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Closed loop: each turn's prompt is the last prompt, the server's answer and a new message,
    so the server's prefix cache finds the conversation; a replay of the result rebuilds the
    sharing and the simulator finds it too."""
    out = tmp_path / "sessions.json"
    argv = ["bench", "--base-url", server.base_url, "--scenario", "multi-turn", "--sessions", "4"]
    argv += ["--turns", "3", "--system-prompt-tokens", "200", "--lengths", "fixed:40,20"]
    argv += ["--no-progress", "--save-result", str(out)]
    hits_before = server.app.state.engine_thread.engine.scheduler.state.num_prefix_hit_tokens
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert result["completed"] == 12
    assert sorted(zip(result["session_ids"], result["turn_ids"], strict=True)) == [
        (s, t) for s in range(4) for t in range(3)
    ]
    turns: dict[int, list[tuple[int, int, int]]] = {}
    for s, t, n, o in zip(
        result["session_ids"], result["turn_ids"], result["input_lens"], result["output_lens"], strict=True
    ):
        turns.setdefault(s, []).append((t, n, o))
    for rows in turns.values():
        rows.sort()
        for (_, n0, o0), (_, n1, _) in itertools.pairwise(rows):
            # the last prompt, the answer and a ~40-token message; the answer's text, read back by
            # the tokenizer, may come out a few tokens shorter or longer than it was generated
            assert n0 + o0 // 2 + 30 <= n1 <= n0 + 2 * o0 + 50
    # Every turn after a session's first reuses at least its system prompt's full blocks.
    hits = server.app.state.engine_thread.engine.scheduler.state.num_prefix_hit_tokens - hits_before
    assert hits >= 11 * (200 // 16) * 16 * 0.9
    capsys.readouterr()
    assert main(["simulate", "--replay", str(out), "--model", "llama-3-8b", "--json"]) == 0
    simulated = json.loads(capsys.readouterr().out)["policies"]["chunked"]
    assert simulated["prefix_cache_hit_tokens"] >= hits * 0.9


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--scenario", "poisson", "--qps", "0", "--num-requests", "5", "--lengths", "fixed:10,5"], "qps"),
        (["--scenario", "poisson", "--qps", "-2", "--num-requests", "5", "--lengths", "fixed:10,5"], "qps"),
        (["--scenario", "poisson", "--qps", "1", "--lengths", "fixed:10,5"], "--num-requests"),
        (["--scenario", "trace"], "--trace"),
        (["--scenario", "trace", "--trace", "/no/such/trace.csv"], "trace.csv"),
        (
            ["--scenario", "poisson", "--qps", "1", "--num-requests", "3", "--lengths", "/no/such.csv"],
            "such.csv",
        ),
        (["--scenario", "long-prompt", "--stream-max-tokens", "10"], "stream_max_tokens"),
        (["--scenario", "poisson", "--qps", "1", "--num-requests", "3", "--streams", "4"], "--streams"),
        (
            ["--scenario", "poisson", "--qps", "1", "--num-requests", "3", "--prompts-file", "x.jsonl"],
            "--output-tokens",
        ),
        (
            [
                "--scenario",
                "poisson",
                "--qps",
                "1",
                "--num-requests",
                "3",
                "--prompts-file",
                "/no/such.jsonl",
                "--output-tokens",
                "4",
            ],
            "/no/such.jsonl",
        ),
        (["--scenario", "long-prompt", "--prompts-file", "x.jsonl"], "poisson and gamma"),
    ],
)
def test_bad_options_fail_with_one_line(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "--base-url", f"http://127.0.0.1:{_closed_port()}", *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_unreachable_server_fails_fast(capsys: pytest.CaptureFixture[str]) -> None:
    start_s = time.monotonic()
    code = main(["bench", "--base-url", f"http://127.0.0.1:{_closed_port()}", "--scenario", "long-prompt"])
    assert code == 2
    assert time.monotonic() - start_s < 10
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot reach" in err


def test_a_speculating_servers_counters_are_recorded(tmp_path: Path) -> None:
    app = build_server(
        MODEL,
        dtype="float32",
        device="cpu",
        token_budget=64,
        num_blocks=2048,
        num_speculative_tokens=3,
        prompt_lookup_min=1,
        prompt_lookup_max=2,
        adaptive_drafts=False,  # every draft a lookup finds, whatever this machine's load
    )
    out = tmp_path / "spec.json"
    prompts = tmp_path / "prompts.jsonl"  # text that repeats: lookup finds drafts in it
    prompts.write_text("".join(json.dumps({"prompt": "a b c d e " * n}) + "\n" for n in (4, 8, 12)))
    with ServerThread(app) as running:
        argv = ["bench", "--base-url", running.base_url, "--scenario", "poisson", "--qps", "50"]
        argv += ["--prompts-file", str(prompts), "--output-tokens", "40", "--num-requests", "6"]
        argv += ["--no-progress", "--save-result", str(out)]
        assert main(argv) == 0
        metrics = httpx.get(f"{running.base_url}/metrics").text
    result = json.loads(out.read_text())
    assert result["completed"] == 6 and result["total_output_tokens"] == 6 * 40
    # request i sent line i % 3, counted by the server: 4, 8, 12 repeats of five tokens, and again
    lens = result["input_lens"]
    assert lens[:3] == lens[3:] and lens[0] < lens[1] < lens[2] and lens[2] - lens[1] == lens[1] - lens[0]
    drafts = result["spec_decode"]
    assert drafts["num_drafts"] > 0 and drafts["num_draft_tokens"] >= drafts["num_drafts"]
    assert 1 <= drafts["mean_acceptance_length"] <= 4
    assert (
        f'stallfree:spec_decode_num_drafts_total{{model_name="{MODEL}"}} {float(drafts["num_drafts"])}'
        in metrics
    )
    # positions decline: a draft counts only after every one before it was accepted
    rates = drafts["acceptance_per_position"]
    assert all(a >= b for a, b in itertools.pairwise(rates))
    assert sum(rates) * drafts["num_drafts"] == pytest.approx(drafts["num_accepted_tokens"])
