"""Ctrl-C on the real ``stallfree bench --scenario long-prompt``: whatever phase it lands in, the
table prints what was measured by then (the alone TTFT, the streams' gaps so far, the prompt's
TTFT if it had one), --save-result holds it, and the exit is 130 within seconds, no traceback.

The server is a small fake in this process whose long prompts take a second to their first
token, so each phase lasts long enough to be interrupted on purpose."""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from tests.fake_http import LocalHttpServer
from tests.interrupts import interrupt

LONG_PROMPT_WORDS = 100  # prompts at least this long are the long prompt (and its run alone)
PREFILL_S = 1.0  # a long prompt's time to its first token
TOKEN_S = 0.03  # between chunks: the streams' 8-chunk warm-up ~0.24 s, their 16-chunk tail ~0.48 s
STREAMS = 4


class SlowPrefillServer(LocalHttpServer):
    """An OpenAI-compatible /v1/completions stream (one chunk per token) that counts what it saw."""

    def __init__(self) -> None:
        self.long_prompts = 0  # received
        self.long_first_tokens = 0  # first chunks sent for long prompts
        self.streams = 0  # short prompts received
        self.run = 0  # counts only requests of this run, not a hung-up one still finishing
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                card = {"id": "fake", "object": "model", "max_model_len": 65536}
                self._send(200, "application/json", json.dumps({"object": "list", "data": [card]}))

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                num_words = len(body["prompt"].split())
                if self.path == "/tokenize":  # a word a token, as the calibration assumes
                    self._send(200, "application/json", json.dumps({"count": num_words}))
                    return
                is_long = num_words >= LONG_PROMPT_WORDS
                with outer.lock:
                    run = outer.run
                    if is_long:
                        outer.long_prompts += 1
                    else:
                        outer.streams += 1
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                usage = {"prompt_tokens": num_words, "completion_tokens": body["max_tokens"]}
                try:
                    time.sleep(PREFILL_S if is_long else TOKEN_S)
                    for i in range(body["max_tokens"]):
                        if i:
                            time.sleep(TOKEN_S)
                        reason = "length" if i == body["max_tokens"] - 1 else None
                        self._event({"choices": [{"text": " x", "index": 0, "finish_reason": reason}]})
                        if is_long and i == 0:
                            with outer.lock:
                                outer.long_first_tokens += run == outer.run
                    self._event({"choices": [], "usage": usage})
                    self.wfile.write(b"data: [DONE]\n\n")
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client hung up
                self.close_connection = True

            def _event(self, body: object) -> None:
                self.wfile.write(f"data: {json.dumps(body)}\n\n".encode())
                self.wfile.flush()

            def _send(self, status: int, kind: str, text: str) -> None:
                data = text.encode()
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        super().__init__(Handler)

    def next_run(self) -> None:
        with self.lock:
            self.run += 1
            self.long_prompts = self.long_first_tokens = self.streams = 0


@pytest.fixture
def server() -> Iterator[SlowPrefillServer]:
    with SlowPrefillServer() as fake:
        yield fake


# phase -> (ready, then the delay): a moment inside that phase.
MOMENTS: dict[str, tuple[Callable[[SlowPrefillServer], bool], float]] = {
    "alone": (lambda s: s.long_prompts >= 1, 0.3),  # in the alone prompt's 1 s prefill
    "warm-up": (lambda s: s.streams >= STREAMS, 0.1),  # ~3 of the 8 warm-up chunks
    "prompt": (lambda s: s.long_prompts >= 2, 0.3),  # in the long prompt's prefill
    "tail": (lambda s: s.long_first_tokens >= 2, 0.05),  # its first token came; the tail runs
}
PHASE_TEXT = {
    "alone": "while the long prompt ran alone",
    "warm-up": "while the streams warmed up",
    "prompt": "before the long prompt's first token",
    "tail": "after the long prompt's first token",
}
REPEATS = 3


@pytest.mark.parametrize("phase", MOMENTS)
def test_long_prompt_ctrl_c_prints_and_saves_what_was_measured(
    server: SlowPrefillServer, tmp_path: Path, phase: str
) -> None:
    ready, delay_s = MOMENTS[phase]
    for repeat in range(REPEATS):
        server.next_run()
        out = tmp_path / f"r{repeat}.json"
        args = ["bench", "--base-url", server.url, "--scenario", "long-prompt", "--streams", str(STREAMS)]
        args += ["--prompt-tokens", "400", "--stream-prompt-tokens", "8", "--stream-max-tokens", "300"]
        args += ["--prompt-max-tokens", "4", "--chars-per-token", "4", "--seed", str(repeat)]
        args += ["--save-result", str(out)]
        result = interrupt(args, ready=lambda: ready(server), delay_s=delay_s, whole_group=repeat % 2 == 0)
        context = f"{phase}, repeat {repeat}: {result.stderr}"
        assert result.returncode == 130, context
        assert result.exit_s < 5, f"{context} took {result.exit_s:.1f} s to exit"
        assert not result.survivors and "Traceback" not in result.stderr, context
        assert f"stallfree bench: interrupted; stopped {PHASE_TEXT[phase]}" in result.stderr, context
        assert f"saved {out}" in result.stderr
        assert (
            "= long-prompt @ " in result.stdout
            and f"INTERRUPTED: stopped {PHASE_TEXT[phase]}" in result.stdout
        )

        saved: dict[str, Any] = json.loads(out.read_text())
        assert saved["interrupted"] == {"phase": phase}, context
        assert saved["failed"] == 0 and saved["completed"] == len(saved["input_lens"])
        alone_ms = saved["long_prompt_alone_ttft_ms"]
        prompt_ms = saved["long_prompt_ttft_ms"]
        if phase == "alone":  # nothing measured yet
            assert saved["completed"] == 0 and alone_ms is None and prompt_ms is None
            continue
        assert alone_ms is not None and PREFILL_S * 1000 <= alone_ms < PREFILL_S * 1000 + 500
        assert "Long prompt TTFT alone (ms):" in result.stdout
        assert 1 <= saved["completed"] <= STREAMS + (phase == "tail"), context  # streams with a chunk
        assert saved["median_itl_ms"] >= TOKEN_S * 1000 * 0.8  # the streams' gaps so far
        if phase == "warm-up":
            assert saved["streams_max_itl_ms"] is None  # no gap after the warm-up yet
        else:
            assert saved["completed"] >= STREAMS
            assert saved["streams_max_itl_ms"] >= saved["streams_median_itl_ms"] >= TOKEN_S * 1000 * 0.8
            assert "Streams' longest gap (ms):" in result.stdout
        if phase == "tail":  # the prompt had its first token: its TTFT is in
            assert prompt_ms is not None and prompt_ms >= PREFILL_S * 1000
            assert saved["long_prompt_tokens"] >= LONG_PROMPT_WORDS
            assert "Long prompt TTFT with streams (ms):" in result.stdout
        else:
            assert prompt_ms is None and "Long prompt TTFT with streams" not in result.stdout


def test_long_prompt_sigterm_stops_as_ctrl_c_does(server: SlowPrefillServer, tmp_path: Path) -> None:
    """``kill PID`` mid-run: the same partial table and --save-result as a Ctrl-C, exit 130."""
    server.next_run()
    out = tmp_path / "r.json"
    args = ["bench", "--base-url", server.url, "--scenario", "long-prompt", "--streams", str(STREAMS)]
    args += ["--prompt-tokens", "400", "--stream-prompt-tokens", "8", "--stream-max-tokens", "300"]
    args += ["--prompt-max-tokens", "4", "--chars-per-token", "4", "--seed", "0", "--save-result", str(out)]
    ready, delay_s = MOMENTS["prompt"]
    result = interrupt(
        args, ready=lambda: ready(server), delay_s=delay_s, whole_group=False, signum=signal.SIGTERM
    )
    assert result.returncode == 143, result.stderr
    assert result.exit_s < 5 and not result.survivors and "Traceback" not in result.stderr
    assert f"stallfree bench: interrupted; stopped {PHASE_TEXT['prompt']}" in result.stderr
    assert json.loads(out.read_text())["interrupted"] == {"phase": "prompt"}


def test_no_request_with_two_tokens_has_no_tpot_or_itl(
    server: SlowPrefillServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One token each: TPOT and ITL have no sample, so null in the result and "-" in the table
    (they read 0.00 ms, as fast as can be), while TTFT is measured."""
    from stallfree.cli import main

    out = tmp_path / "r.json"
    args = ["bench", "--base-url", server.url, "--scenario", "poisson", "--num-requests", "3"]
    args += ["--qps", "50", "--lengths", "fixed:8,1", "--chars-per-token", "4", "--seed", "0"]
    assert main([*args, "--no-progress", "--save-result", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert saved["completed"] == 3 and saved["mean_ttft_ms"] > 0
    for key in ("mean_tpot_ms", "p99_tpot_ms", "median_itl_ms", "p99_itl_ms", "max_itl_ms"):
        assert saved[key] is None, key
    table = capsys.readouterr().out
    for label in ("Mean TPOT (ms):", "Median ITL (ms):", "P99 ITL (ms):", "Max ITL (ms):"):
        assert re.search(rf"^{re.escape(label)} +-$", table, re.M), table
    assert re.search(r"^Mean TTFT \(ms\): +\d+\.\d\d$", table, re.M)
    assert "Request goodput" not in table  # no SLOs: left out, not "-"
