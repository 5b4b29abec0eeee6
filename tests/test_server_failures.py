"""Overload answers 429 with Retry-After; a dead engine thread makes the server unhealthy, not hung."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from stallfree.server.launch import ServerThread, build_server

MODEL = "random:tiny"


def test_overload_is_429_with_retry_after() -> None:
    # One running sequence at a time: while A decodes, B and C wait for their first token.
    app = build_server(MODEL, dtype="float32", device="cpu", max_num_seqs=1, max_waiting_requests=2)
    body = {"model": MODEL, "max_tokens": 1000, "stream": True, "ignore_eos": True}

    async def main(base_url: str) -> httpx.Response:
        async with (
            httpx.AsyncClient(base_url=base_url, timeout=30) as client,
            client.stream("POST", "/v1/completions", json={**body, "prompt": "a"}) as a,
        ):
            lines = a.aiter_lines()  # kept: a dropped iterator closes the response
            await anext(lines)  # A has its first token: it no longer waits
            async with (
                client.stream("POST", "/v1/completions", json={**body, "prompt": "b"}) as b,
                client.stream("POST", "/v1/completions", json={**body, "prompt": "c"}) as c,
            ):
                assert (b.status_code, c.status_code) == (200, 200)
                return await client.post("/v1/completions", json={**body, "prompt": "d", "stream": False})

    with ServerThread(app) as server:
        response = asyncio.run(main(server.base_url))
        assert response.status_code == 429
        assert int(response.headers["retry-after"]) >= 1
        assert response.json()["error"]["type"] == "rate_limit_error"
        # Once the queue drains, requests are served again.
        ok = httpx.post(
            f"{server.base_url}/v1/completions", json={"model": MODEL, "prompt": "e", "max_tokens": 2}
        )
        assert ok.status_code == 200


def test_dead_engine_thread_fails_fast_and_reports_unhealthy() -> None:
    app = build_server(MODEL, dtype="float32", device="cpu")
    engine = app.state.engine_thread.engine
    real_step = engine.step
    calls = 0

    def failing_step():  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        if calls > 3:
            raise RuntimeError("simulated device failure")
        return real_step()

    engine.step = failing_step
    with ServerThread(app) as server:
        url = f"{server.base_url}/v1/completions"
        body = {"model": MODEL, "prompt": "x", "max_tokens": 50, "ignore_eos": True}
        with httpx.stream("POST", url, json={**body, "stream": True}, timeout=10) as response:
            events = [line for line in response.iter_lines() if line.startswith("data: ")]
        assert '"code":503' in events[-2]  # the stream ends with an error event, then [DONE]
        assert events[-1] == "data: [DONE]"
        health = httpx.get(f"{server.base_url}/health")
        assert health.status_code == 503
        assert "simulated device failure" in health.json()["error"]["message"]
        start_s = time.monotonic()
        response = httpx.post(url, json=body, timeout=10)
        assert response.status_code == 503
        assert time.monotonic() - start_s < 5  # fails fast instead of hanging until a client timeout


@pytest.mark.parametrize("port", [-1, 70000])
def test_serve_rejects_bad_ports(port: int, capsys: pytest.CaptureFixture[str]) -> None:
    from stallfree.cli import main

    assert main(["serve", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "port" in err


def test_serve_reports_a_busy_port(capsys: pytest.CaptureFixture[str]) -> None:
    from stallfree.cli import main
    from stallfree.server.launch import bind

    sock = bind("127.0.0.1", 0)
    try:
        assert main(["serve", "--port", str(sock.getsockname()[1])]) == 2
    finally:
        sock.close()
    assert "cannot listen" in capsys.readouterr().err
