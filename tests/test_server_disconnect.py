"""Clients that go away: their requests are aborted and every KV block comes back."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from stallfree.server.launch import ServerThread, build_server

MODEL = "random:tiny"
MAX_TOKENS = 400


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    app = build_server(
        MODEL, dtype="float32", device="cpu", token_budget=128, num_blocks=4096, max_waiting_requests=512
    )
    with ServerThread(app) as running:
        yield running


def _metric(server: ServerThread, name: str) -> float:
    text = httpx.get(f"{server.base_url}/metrics").text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _wait_until_idle(server: ServerThread, timeout_s: float = 20.0) -> None:
    """Poll until the engine holds no request (a deadline, not a timing claim)."""
    scheduler = server.app.state.engine_thread.engine.scheduler
    deadline_s = time.monotonic() + timeout_s
    while scheduler.has_unfinished_requests() or scheduler.block_manager.num_used_blocks:
        if time.monotonic() > deadline_s:
            break
        time.sleep(0.02)


def test_100_clients_disconnecting_mid_stream_free_every_block(server: ServerThread) -> None:
    body = {"model": MODEL, "max_tokens": MAX_TOKENS, "stream": True, "ignore_eos": True}
    generated_before = _metric(server, "stallfree:generation_tokens_total")

    async def leave_early(client: httpx.AsyncClient, i: int) -> int:
        chunks = 0
        async with client.stream(
            "POST", "/v1/completions", json={**body, "prompt": f"client {i} says"}
        ) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                if line.startswith("data: {"):
                    chunks += 1
                    if chunks == 3:
                        break  # leaving the block closes the connection mid-stream
        return chunks

    async def main() -> list[int]:
        limits = httpx.Limits(max_connections=200)
        async with httpx.AsyncClient(base_url=server.base_url, limits=limits, timeout=60) as client:
            return await asyncio.gather(*(leave_early(client, i) for i in range(100)))

    assert asyncio.run(main()) == [3] * 100
    _wait_until_idle(server)
    scheduler = server.app.state.engine_thread.engine.scheduler
    assert scheduler.block_manager.num_used_blocks == 0
    assert not scheduler.has_unfinished_requests()
    assert _metric(server, "stallfree:kv_cache_used_blocks") == 0
    assert _metric(server, 'stallfree:request_success_total{finished_reason="abort"') == 100
    # Aborted, not run to the end: far fewer tokens than 100 full answers.
    assert _metric(server, "stallfree:generation_tokens_total") - generated_before < 100 * MAX_TOKENS / 4


def test_client_leaving_a_non_streamed_request_aborts_it(server: ServerThread) -> None:
    body = json.dumps({"model": MODEL, "prompt": "a long answer", "max_tokens": 1000, "ignore_eos": True})
    aborted_before = _metric(server, 'stallfree:request_success_total{finished_reason="abort"')
    scheduler = server.app.state.engine_thread.engine.scheduler
    host, port = server.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        request = (
            f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n{body}"
        )
        sock.sendall(request.encode())
        deadline_s = time.monotonic() + 20
        while not scheduler.num_running and time.monotonic() < deadline_s:
            time.sleep(0.001)
        assert scheduler.num_running == 1  # hang up while the answer is being generated
    _wait_until_idle(server)
    assert scheduler.block_manager.num_used_blocks == 0
    assert _metric(server, 'stallfree:request_success_total{finished_reason="abort"') == aborted_before + 1
