"""Ctrl-C (or SIGTERM, ``kill PID``) on the real ``stallfree serve`` with streams open: the
streams end with an error event and ``[DONE]`` (not cut), the server exits within seconds, no
traceback, nothing left running; a SIGTERM ends as a Ctrl-C does (exit 143 with the same message, not killed by it)."""

from __future__ import annotations

import json
import signal
import threading

import httpx
import pytest

from tests.interrupts import interrupt


@pytest.mark.parametrize(
    ("attempt", "signum"),
    [(0, signal.SIGINT), (1, signal.SIGINT), (2, signal.SIGINT), (1, signal.SIGTERM)],
    ids=["SIGINT-0", "SIGINT-1", "SIGINT-2", "SIGTERM"],
)
def test_serve_ctrl_c_ends_open_streams_cleanly(attempt: int, signum: signal.Signals) -> None:
    base_url: list[str] = []
    events: list[list[str]] = [[], []]
    errors: list[BaseException] = []

    def stream(i: int) -> None:
        body = {"model": "random:tiny", "prompt": "hello", "max_tokens": 1000, "stream": True}
        body["ignore_eos"] = True
        try:
            with httpx.stream("POST", f"{base_url[0]}/v1/completions", json=body, timeout=30) as response:
                for line in response.iter_lines():
                    if line.startswith("data:"):
                        events[i].append(line[5:].strip())
        except BaseException as error:  # a cut stream is what this test is about
            errors.append(error)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(2)]

    def streaming() -> bool:
        if not base_url:
            return False
        if not threads[0].ident:
            for thread in threads:
                thread.start()
        return all(len(e) >= 3 + attempt for e in events)

    argv = ["serve", "--model", "random:tiny", "--dtype", "float32", "--device", "cpu", "--port", "0"]
    argv += ["--num-blocks", "256", "--log-level", "warning"]
    result = interrupt(
        argv,
        ready=streaming,
        whole_group=attempt != 1,
        signum=signum,
        banner=lambda line: base_url.append(line.rsplit(" on ", 1)[1].strip()),
    )
    for thread in threads:
        thread.join(10)
    assert result.returncode in ((0, 130) if signum == signal.SIGINT else (143,)), result.stderr
    assert result.exit_s < 5, f"{result.exit_s:.1f} s to exit"
    assert "Traceback" not in result.stderr and "CancelledError" not in result.stderr, result.stderr
    assert not result.survivors and not errors, errors
    for received in events:
        assert received[-1] == "[DONE]"
        last = json.loads(received[-2])
        assert "error" in last and "shutting down" in last["error"]["message"]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("delay_s", [0.6, 1.2, 2.0, 3.0])
def test_serve_stopped_while_the_model_loads_exits_in_one_line(
    delay_s: float, signum: signal.Signals
) -> None:
    """Anywhere in the load (reading the GGUF, packing weights, building kernels) or just after:
    128 + the signal, the same one line, never an abort from torch's teardown (exit 134)."""
    argv = ["serve", "--model", "smollm2", "--port", "0", "--log-level", "warning"]
    result = interrupt(argv, delay_s=delay_s, whole_group=False, signum=signum)
    assert result.returncode == 128 + signum, result.stderr
    assert "terminate called" not in result.stderr and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == "stallfree serve: interrupted"
    assert not result.survivors
