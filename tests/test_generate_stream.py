"""``stallfree generate`` writes tokens as they come and keeps them on Ctrl-C (a real subprocess)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time

import pytest

from stallfree.cli import main
from tests.interrupts import CLI, session_pids

TINY = ["--model", "random:tiny", "--dtype", "float32", "--device", "cpu", "--num-blocks", "64"]
# ~30 ms a token on one core: 2,000 tokens run for minutes unless interrupted.
LONG = ["generate", "--model", "random:small", "--dtype", "float32", "--device", "cpu"]
LONG += ["--num-blocks", "130", "--max-tokens", "2000", "--ignore-eos", "--seed", "3", "--prompt", "hi"]


def _start(argv: list[str]) -> tuple[subprocess.Popen[bytes], list[bytes]]:
    proc = subprocess.Popen(
        [*CLI, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        start_new_session=True,
    )
    received: list[bytes] = []

    def read() -> None:
        assert proc.stdout is not None
        while chunk := os.read(proc.stdout.fileno(), 4096):
            received.append(chunk)

    threading.Thread(target=read, daemon=True).start()
    return proc, received


@pytest.mark.parametrize("attempt", range(2))
def test_ctrl_c_keeps_the_streamed_text(attempt: int) -> None:
    proc, received = _start(LONG)
    try:
        deadline = time.monotonic() + 60
        while len(b"".join(received)) < 40 * (attempt + 1):  # text arrives while it still runs
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no streamed text within 60 s"
            time.sleep(0.02)
        streamed = b"".join(received).decode()
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(10)
        time.sleep(0.1)
        assert proc.stderr is not None
        stderr = proc.stderr.read().decode()
        out = b"".join(received).decode()
        assert proc.returncode == 130, stderr
        assert "Traceback" not in stderr and "interrupted" in stderr
        assert out.startswith(streamed) and out.endswith("\n") and len(out) > len(streamed) - 1
        assert not session_pids(proc.pid)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_ctrl_c_with_json_prints_the_partial_record() -> None:
    proc, received = _start([*LONG, "--json"])
    try:
        deadline = time.monotonic() + 90
        # --json prints nothing before the end: wait for CPU seconds well past start-up (~4 s of
        # imports and loading on one thread), so the engine has been generating for a while
        while time.monotonic() < deadline and proc.poll() is None and _cpu_busy_s(proc.pid) < 10.0:
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(10)
        record = json.loads(b"".join(received).decode())
        assert proc.returncode == 130
        assert record["finish_reason"] == "abort" and 0 < len(record["token_ids"]) < 2000
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _cpu_busy_s(pid: int) -> float:
    """User + system CPU seconds the process has used (from /proc)."""
    try:
        stat = open(f"/proc/{pid}/stat").read()  # noqa: PTH123, SIM115 - a Linux pseudo-file
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_streamed_batch_prints_prompt_by_prompt(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["generate", *TINY, "--prompt", "one", "--prompt", "two two", "--prompt", "three"]
    argv += ["--max-tokens", "12", "--seed", "5", "--ignore-eos"]
    assert main([*argv, "--json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert main(argv) == 0
    assert capsys.readouterr().out == "".join(r["text"] + "\n" for r in records)


def test_stop_string_text_is_never_written_then_cut(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["generate", *TINY, "--prompt", "abc", "--max-tokens", "40", "--temperature", "0"]
    assert main([*argv, "--json"]) == 0
    text = json.loads(capsys.readouterr().out)["text"]
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    if len(stop.strip()) < 3:
        pytest.skip("greedy text has no usable stop string")
    assert main([*argv, "--stop", stop]) == 0
    assert capsys.readouterr().out == text[: text.find(stop)] + "\n"
