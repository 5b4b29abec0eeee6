"""``stallfree bench`` against a small fake server that behaves like llama.cpp's llama-server:
context in ``meta.n_ctx``, ``/tokenize`` with ``content``/``add_special``, a prompt cache, an
empty closing chunk with the finish_reason, a tokenizer the client's calibration line fits only
roughly. Also the bench's own edges: length caps that hold, Ctrl-C, --save-result, --api-key."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from tests.fake_http import LocalHttpServer
from tests.interrupts import CLI, interrupt

N_CTX = 2048


def llama_tokens(text: str) -> int:
    """BOS + one token per word + one more for every word over four letters: not linear in
    characters, so a prompt sized by the calibration line can overshoot its target."""
    words = text.split()
    return 1 + len(words) + sum(len(w) > 4 for w in words)


class FakeLlamaServer(LocalHttpServer):
    def __init__(self, *, token_delay_s: float = 0.0, api_key: str | None = None) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.token_delay_s = token_delay_s
        self.api_key = api_key
        self.seen_prompts: set[str] = set()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _json(self, status: int, body: object) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _authorized(self) -> bool:
                if outer.api_key is None or self.headers.get("Authorization") == f"Bearer {outer.api_key}":
                    return True
                self._json(
                    401,
                    {"error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}},
                )
                return False

            def do_GET(self) -> None:
                if not self._authorized():
                    return
                card = {
                    "id": "smollm2.gguf",
                    "object": "model",
                    "owned_by": "llamacpp",
                    "meta": {"vocab_type": 2, "n_vocab": 49152, "n_ctx_train": 8192, "n_ctx": N_CTX},
                }
                self._json(200, {"object": "list", "data": [card]})

            def do_POST(self) -> None:
                if not self._authorized():
                    return
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/tokenize":
                    n = llama_tokens(body["content"]) - (0 if body.get("add_special") else 1)
                    self._json(200, {"tokens": list(range(n))})
                    return
                outer.bodies.append(body)
                n_prompt = llama_tokens(body["prompt"])
                if n_prompt + body["max_tokens"] > N_CTX:
                    self._json(400, {"error": {"code": 400, "message": "context exceeded"}})
                    return
                cached = body["prompt"] in outer.seen_prompts  # llama.cpp's prompt cache
                outer.seen_prompts.add(body["prompt"])
                usage = {"prompt_tokens": n_prompt, "completion_tokens": body["max_tokens"]}
                if not body.get("stream"):
                    choice = {"text": "x", "index": 0, "finish_reason": "length"}
                    self._json(200, {"choices": [choice], "usage": usage})
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                try:
                    if not cached:
                        time.sleep(n_prompt * 1e-5)
                    for _ in range(body["max_tokens"]):
                        time.sleep(outer.token_delay_s)
                        self._event({"choices": [{"text": " x", "index": 0, "finish_reason": None}]})
                    self._event(
                        {"choices": [{"text": "", "index": 0, "finish_reason": "length"}], "usage": usage}
                    )
                    self.wfile.write(b"data: [DONE]\n\n")
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass
                self.close_connection = True

            def _event(self, body: object) -> None:
                self.wfile.write(f"data: {json.dumps(body)}\n\n".encode())
                self.wfile.flush()

        super().__init__(Handler)

    def streamed(self) -> list[dict[str, Any]]:
        return [b for b in self.bodies if b.get("stream")]


@pytest.fixture
def server() -> Iterator[FakeLlamaServer]:
    with FakeLlamaServer() as fake:
        yield fake


def bench(url: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    argv = [*CLI, "bench", "--base-url", url, "--no-ignore-eos", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


POISSON = ["--scenario", "poisson", "--qps", "200", "--num-requests", "12"]


def test_caps_hold_on_the_servers_own_count(server: FakeLlamaServer, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    caps = ["--lengths", "uniform:400-900,200-400", "--max-prompt-tokens", "512", "--max-total-tokens", "768"]
    done = bench(server.url, *POISSON, *caps, "--seed", "1", "--save-result", str(out))
    assert done.returncode == 0, done.stderr
    streamed = server.streamed()
    assert len(streamed) == 12
    for body in streamed:
        n = llama_tokens(body["prompt"])
        assert n <= 512 and n + body["max_tokens"] <= 768, (n, body["max_tokens"])
    result = json.loads(out.read_text())
    assert result["prompt_caps"] == "server-counted" and max(result["input_lens"]) <= 512
    # The empty closing chunk is not a token: one stamp per streamed token, no fake ~0 gap.
    assert [len(itls) + 1 for itls in result["itls"]] == result["output_lens"]


def test_context_from_meta_n_ctx_and_sampling_passed_through(server: FakeLlamaServer) -> None:
    args = ["--lengths", "fixed:3000,100", "--temperature", "0.3", "--top-p", "0.9", "--top-k", "40"]
    done = bench(server.url, *POISSON, *args)
    assert done.returncode == 0, done.stderr
    assert "Failed requests:                                           0" in done.stdout
    for body in server.streamed():
        assert llama_tokens(body["prompt"]) + body["max_tokens"] <= N_CTX  # capped to meta.n_ctx
        assert (body["temperature"], body["top_p"], body["top_k"]) == (0.3, 0.9, 40)
        assert "ignore_eos" not in body
    # --max-model-len overrides the listed context; --max-tokens every request's max_tokens.
    server.bodies.clear()
    done = bench(
        server.url, *POISSON, "--lengths", "fixed:3000,100", "--max-model-len", "1000", "--max-tokens", "7"
    )
    assert done.returncode == 0, done.stderr
    for body in server.streamed():
        assert llama_tokens(body["prompt"]) + 7 <= 1000 and body["max_tokens"] == 7


def test_prompts_are_new_each_run_unless_seeded(server: FakeLlamaServer, tmp_path: Path) -> None:
    runs, results = [], []
    for i, seed in enumerate(([], [], ["--seed", "4"], ["--seed", "4"], ["--seed", "4", "--text-seed", "5"])):
        server.bodies.clear()
        out = tmp_path / f"r{i}.json"
        done = bench(
            server.url, *POISSON, "--lengths", "uniform:100-300,4-4", *seed, "--save-result", str(out)
        )
        assert done.returncode == 0, done.stderr
        runs.append({b["prompt"] for b in server.streamed()})
        results.append(json.loads(out.read_text()))
    assert not runs[0] & runs[1]  # no prompt repeats across unseeded runs: no prompt-cache hits
    assert runs[2] == runs[3]
    # --text-seed: the same arrivals and lengths as --seed 4, none of its prompts
    assert not runs[4] & runs[2]
    assert results[4]["requested_input_lens"] == results[2]["requested_input_lens"]
    assert len(set(results[2]["requested_input_lens"])) > 1  # drawn, not all alike
    assert results[4]["text_seed"] == 5 and "text_seed" not in results[2]


def test_wrong_api_key_and_unwritable_result_fail_before_the_run(tmp_path: Path) -> None:
    with FakeLlamaServer(api_key="right") as fake:
        done = bench(fake.url, *POISSON, "--lengths", "fixed:50,4", "--api-key", "wrong")
        assert done.returncode == 2
        assert (
            "rejected the API key given with --api-key" in done.stderr and "pass --api-key" not in done.stderr
        )
        blocker = tmp_path / "file"
        blocker.write_text("")
        done = bench(fake.url, *POISSON, "--api-key", "right", "--save-result", str(blocker / "r.json"))
        assert done.returncode == 2 and "--save-result" in done.stderr
        assert not fake.bodies  # not one request was sent


def test_ctrl_c_prints_what_finished_and_saves_it(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    with FakeLlamaServer(token_delay_s=0.05) as fake:
        args = [
            "bench",
            "--base-url",
            fake.url,
            "--scenario",
            "poisson",
            "--qps",
            "4",
            "--num-requests",
            "40",
        ]
        args += ["--lengths", "uniform:50-100,4-60", "--seed", "2", "--save-result", str(out)]

        def some_finished() -> bool:
            return len(fake.streamed()) >= 8

        result = interrupt(args, ready=some_finished, delay_s=1.0, whole_group=True)
    assert result.returncode == 130, result.stderr
    assert not result.survivors and "Traceback" not in result.stderr
    assert result.exit_s < 5
    saved = json.loads(out.read_text())
    finished = saved["interrupted"]["finished"]
    assert 0 < finished < 40 == saved["interrupted"]["requests"]
    assert saved["completed"] == finished == len(saved["input_lens"])
    assert f"INTERRUPTED: {finished} of 40 requests had finished" in result.stdout
    assert "Successful requests:" in result.stdout
    assert "\r" not in result.stderr  # no progress bar off a TTY
