"""Start and stop the servers and routers the benchmarks measure, one way for all of them.

``stallfree serve``, vLLM's OpenAI server (``make vllm``: ``.venv-vllm``), vllm-router (``make
router``: ``.venv-router``) and llama.cpp's ``llama-server`` are each a context manager over
:func:`launched`: the process starts on a free loopback port (its output to ``log``, or to this
process's own stdout/stderr when there is none), is ready once ``GET /health`` answers 200, and is
stopped on the way out, however the block ends: SIGTERM, then SIGKILL if it has not exited after
``stop_timeout_s``. A process that exits before it is ready, or is not ready in
``ready_timeout_s``, raises :class:`ServerError` naming its log. Each start and readiness is logged
on stderr with the time; stdout stays the benchmark's results.

    with stallfree_serve(["--model", "smollm2", "--threads", "1"]) as a, stallfree_serve([...]) as b:
        with vllm_router(["--worker-urls", a.url, b.url, "--policy", "round_robin"], log=LOG) as router:
            ...  # router.url; os.kill(b.pid, SIGKILL) to take a replica down mid-run

Pinning is the caller's: vLLM's CPU worker binds the cores in ``VLLM_CPU_OMP_THREADS_BIND``
(``env=``), ``stallfree serve`` takes ``--threads``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from common.cli import PYTHON_MAIN, stallfree
from common.host import log as say

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
VLLM_ROUTER = ROOT / ".venv-router" / "bin" / "vllm-router"
VLLM_KV_CACHE_GIB = "2"  # VLLM_CPU_KVCACHE_SPACE: vLLM's CPU KV cache, in GiB, unless env= says otherwise
KV_CACHE_LINE = re.compile(r"KV cache size: ([\d,]+) tokens")


class ServerError(RuntimeError):
    """A server exited before it was ready, or was not ready in time."""


@dataclass(frozen=True, slots=True)
class Server:
    """A running server: its name in the logs, base URL, process and log file."""

    name: str
    url: str
    proc: subprocess.Popen[bytes]
    log: Path | None
    kv_cache_tokens: int | None = None  # vLLM's KV cache as its log reports it; None for the others

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])


def free_port() -> int:
    """A loopback port no one listens on now (the OS's pick)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def healthy(url: str) -> bool:
    """Whether ``url``/health answers 200 within 2 s."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def wait_healthy(
    proc: subprocess.Popen[bytes], url: str, timeout_s: float, what: str, poll_s: float = 0.2
) -> None:
    """Return once ``url``/health answers 200; ServerError if ``proc`` exits or ``timeout_s`` passes."""
    deadline_s = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise ServerError(f"{what} exited with {proc.returncode}")
        if healthy(url):
            return
        if time.monotonic() > deadline_s:
            raise ServerError(f"{what} was not ready in {timeout_s:.0f} s")
        time.sleep(poll_s)


def stop(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM, then SIGKILL if ``proc`` has not exited after ``timeout_s``; reaped either way."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def launched(
    name: str,
    argv: Sequence[str],
    *,
    port: int,
    log: Path | None = None,
    env: Mapping[str, str] | None = None,
    ready_timeout_s: float = 120.0,
    stop_timeout_s: float = 30.0,
    poll_s: float = 0.2,
) -> Iterator[Server]:
    """``argv`` (which must listen on 127.0.0.1:``port``) as a :class:`Server` once healthy; stopped
    on exit. ``env`` is added to this process's environment; ``log`` gets stdout and stderr."""
    url = f"http://127.0.0.1:{port}"
    full_env = {**os.environ, **env} if env else None
    say(f"starting {name}: {' '.join(argv)}" + (f" (log: {log})" if log else ""))
    started = time.monotonic()
    if log is None:
        proc = subprocess.Popen(list(argv), env=full_env)
    else:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("wb") as sink:
            proc = subprocess.Popen(list(argv), stdout=sink, stderr=subprocess.STDOUT, env=full_env)
    try:
        what = f"{name}" + (f" (log: {log})" if log else "")
        wait_healthy(proc, url, ready_timeout_s, what, poll_s)
        say(f"{name} ready after {time.monotonic() - started:.1f} s at {url}")
        yield Server(name, url, proc, log)
    finally:
        stop(proc, stop_timeout_s)


def free_ports(count: int, tries: int = 50) -> int:
    """The first of ``count`` consecutive loopback ports no one listens on now."""
    for _ in range(tries):
        first = free_port()
        if first + count - 1 > 65535:
            continue
        with contextlib.ExitStack() as stack:
            try:
                for port in range(first + 1, first + count):
                    sock = stack.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return first
    raise ServerError(f"no {count} consecutive free ports found in {tries} tries")


@contextlib.contextmanager
def stallfree_serve(
    serve_args: Sequence[str],
    *,
    log: Path | None = None,
    name: str = "stallfree serve",
    ready_timeout_s: float = 120.0,
    replicas: int = 1,
    prefix: Sequence[str] = (),
) -> Iterator[Server]:
    """``stallfree serve SERVE_ARGS`` through this Python (so a ``PYTHONPATH`` copy of the package is
    the one served), on a free port, ``--log-level warning``. ``replicas`` > 1 (``serve --simulate
    --replicas N``): N consecutive free ports, ready once each answers; the server is replica 0,
    replica i is on ``server.port + i``. ``prefix`` runs the command under another (``taskset -c 1``)."""
    port = free_ports(replicas) if replicas > 1 else free_port()
    argv = [*prefix, sys.executable, *PYTHON_MAIN, "serve", *serve_args]
    if replicas > 1:
        argv += ["--replicas", str(replicas)]
    argv += ["--port", str(port), "--log-level", "warning"]
    with launched(name, argv, port=port, log=log, ready_timeout_s=ready_timeout_s) as server:
        for i in range(1, replicas):
            wait_healthy(server.proc, f"http://127.0.0.1:{port + i}", ready_timeout_s, f"{name} replica {i}")
        yield server


@contextlib.contextmanager
def vllm_serve(
    model_dir: Path,
    flags: Sequence[str] = (),
    *,
    log: Path,
    dtype: str = "float32",
    env: Mapping[str, str] | None = None,
) -> Iterator[Server]:
    """vLLM's OpenAI server on ``model_dir`` (``dtype``, 2 GiB of KV cache, ``env`` added: e.g.
    ``VLLM_CPU_OMP_THREADS_BIND``), its ``kv_cache_tokens`` read from ``log``. Up to 10 min to
    start (it compiles on a CPU), a minute to stop."""
    if not VLLM_PYTHON.exists():
        raise SystemExit(f"no vLLM venv at {VLLM_PYTHON.parent.parent}: run `make vllm` first")
    port = free_port()
    argv = [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--dtype", dtype, "--port", str(port), *flags]  # fmt: skip
    env = {"VLLM_CPU_KVCACHE_SPACE": VLLM_KV_CACHE_GIB, **(env or {})}
    with launched(
        "vLLM", argv, port=port, log=log, env=env, ready_timeout_s=600, stop_timeout_s=60
    ) as server:
        found = KV_CACHE_LINE.search(log.read_text(errors="replace"))
        if found is None:
            raise ServerError(f"no 'KV cache size' line in {log}")
        yield Server(server.name, server.url, server.proc, log, int(found.group(1).replace(",", "")))


@contextlib.contextmanager
def vllm_router(args: Sequence[str], *, log: Path) -> Iterator[Server]:
    """vllm-router ``ARGS`` (``--worker-urls ... --policy P``, or its PD mode's flags) on a free port,
    ``--log-level warning``."""
    if not VLLM_ROUTER.exists():
        raise SystemExit(f"no vllm-router at {VLLM_ROUTER}: run `make router` first")
    port = free_port()
    argv = [str(VLLM_ROUTER), *args, "--port", str(port), "--log-level", "warning"]
    with launched("vllm-router", argv, port=port, log=log, ready_timeout_s=60, stop_timeout_s=10) as server:
        yield server


@contextlib.contextmanager
def llama_server(name: str, argv: Sequence[str], *, log: Path) -> Iterator[Server]:
    """llama.cpp's ``llama-server`` (``argv``: the binary and its flags; ``--port`` added) under
    ``name``; up to 3 min to load, 20 s to stop."""
    port = free_port()
    with launched(
        name,
        [*argv, "--port", str(port)],
        port=port,
        log=log,
        ready_timeout_s=180,
        stop_timeout_s=20,
        poll_s=0.5,
    ) as server:
        yield server


def http_path_ms(url: str, simulate_flags: Sequence[str], tries: int = 20) -> tuple[float, float]:
    """An idle server's TTFT for a 2-token prompt (median of ``tries``, one at a time; a router's URL
    times its hop too) and the simulator's price of that request on the replica ``simulate_flags``
    describe: their difference is what the HTTP path (client, router, server, back) adds to a
    request's TTFT, ``simulate --route-delay-ms``."""
    import httpx

    alone = json.loads(
        stallfree(
            "simulate",
            *simulate_flags,
            "--lengths",
            "fixed:2,1",
            "--num-requests",
            "1",
            "--json",
            capture=True,
        )
    )
    priced_ms = float(next(iter(alone["policies"].values()))["median_ttft_ms"])
    ttfts_ms = []
    with httpx.Client(timeout=30) as http:
        model = http.get(f"{url}/v1/models").json()["data"][0]["id"]
        body = {"model": model, "prompt": "hello", "max_tokens": 1, "stream": True}  # "hell" "o": 2 tokens
        for _ in range(tries):
            sent_s = time.perf_counter()
            with http.stream("POST", f"{url}/v1/completions", json=body) as response:
                if next(line for line in response.iter_lines() if line.startswith("data:")):
                    ttfts_ms.append(1000 * (time.perf_counter() - sent_s))
            time.sleep(0.05)
    return statistics.median(ttfts_ms), priced_ms
