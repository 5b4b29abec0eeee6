"""Build a server from engine options, bind its socket, and run it (blocking or in a thread).

The socket is bound before uvicorn starts, so a port in use is one clear ``ValueError`` and
port 0 gives a free port whose number the caller can read (tests and benchmarks use that).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import uvicorn
from fastapi import FastAPI

from stallfree.core.config import ShedRule
from stallfree.server.app import ServerConfig, build_app
from stallfree.server.engine_thread import EngineThread
from stallfree.server.prometheus import ServerMetrics
from stallfree.specs.gguf import KNOWN_GGUF_MODELS, is_gguf_path, read_gguf

if TYPE_CHECKING:
    from stallfree.engine.config import EngineConfig
    from stallfree.server.virtual import ServedTokenizer
    from stallfree.sim.deployment import Deployment


def build_server(
    engine: EngineConfig | str = "random:small",
    *,
    served_model_name: str | None = None,
    api_key: str | None = None,
    max_waiting_requests: int = 256,
    shed: ShedRule | None = None,
    num_threads: int | None = None,
    step_log: str | None = None,
    **engine_options: Any,
) -> FastAPI:
    """Load the engine (ValueError on bad options) and wrap it in the app; ``app.state.engine_thread``.

    ``engine``: an :class:`~stallfree.engine.config.EngineConfig`, or a model with the rest of
    one as keyword ``engine_options`` (:meth:`EngineConfig.from_options`).

    ``served_model_name``: the name clients ask for, in /v1/models, every answer's ``model`` and
    every metric's label (default: :func:`default_served_model_name`);
    ``num_threads``: torch threads for the engine (default: every core up to 4, every core but one above; see EngineThread);
    ``step_log``: a file the engine thread appends a JSON line to per step (server/step_log.py);
    ``shed``: sheddable requests refused early (:class:`~stallfree.core.config.ShedRule`)."""
    from stallfree.engine.config import EngineConfig
    from stallfree.engine.engine import LLMEngine

    config = (
        engine if isinstance(engine, EngineConfig) else EngineConfig.from_options(engine, **engine_options)
    )
    if served_model_name is not None and not served_model_name.strip():
        raise ValueError("the served model name must not be empty")
    name = served_model_name or default_served_model_name(config.model)
    thread = EngineThread(  # builds the engine on its own thread, where every step will run
        lambda: LLMEngine(config),
        ServerMetrics(name),
        max_waiting_requests=max_waiting_requests,
        shed=shed,
        num_threads=num_threads,
        step_log=step_log,
    )
    return build_app(thread, ServerConfig(served_model_name=name, api_key=api_key))


def build_virtual_server(
    deployment: Deployment,
    *,
    served_model_name: str | None = None,
    api_key: str | None = None,
    max_waiting_requests: int = 256,
    shed: ShedRule | None = None,
    tokenizer: ServedTokenizer | None = None,
    time_scale: float = 1.0,
    seed: int = 0,
) -> FastAPI:
    """A virtual replica of ``deployment`` (:class:`~stallfree.server.virtual.VirtualEngine`: the
    scheduler and its cost model on the wall clock) behind the same app; metrics named ``vllm:``,
    and its steps' lateness as ``stallfree:virtual_step_late_seconds`` (and ``_max_seconds``).
    ``served_model_name`` defaults to the priced model's name; ValueError on a deployment that
    cannot be priced."""
    from stallfree.server.virtual import LATE_BUCKETS_S, VirtualEngine

    engine = VirtualEngine(deployment, tokenizer, time_scale=time_scale, seed=seed)  # checked here
    if served_model_name is not None and not served_model_name.strip():
        raise ValueError("the served model name must not be empty")
    name = served_model_name or engine.pick.model.name
    metrics = ServerMetrics(name, prefix="vllm")
    metrics.track_steps(engine.tracking, LATE_BUCKETS_S)  # stallfree:virtual_step_late_seconds
    thread = EngineThread(
        lambda: engine,
        metrics,
        max_waiting_requests=max_waiting_requests,
        shed=shed,
        uses_torch=False,
    )
    return build_app(thread, ServerConfig(served_model_name=name, api_key=api_key))


def default_served_model_name(model: str) -> str:
    """The model's own name, never the path it was loaded from: ``random:<preset>`` and short GGUF
    names (``smollm2``) as given, a GGUF file's ``general.name`` (else its stem), an HF folder's name."""
    from stallfree.engine.weights import RANDOM_PREFIX

    if model.startswith(RANDOM_PREFIX) or model in KNOWN_GGUF_MODELS:
        return model
    path = Path(model).expanduser()
    if is_gguf_path(model):
        return read_gguf(path).model_name
    return path.resolve().name


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port``; ValueError (one line) if it cannot be had."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ValueError(f"cannot resolve host {host!r}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise ValueError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


class _Server(uvicorn.Server):
    """uvicorn, but a shutdown first stops the engine: every open stream then ends at once with
    an error event and ``[DONE]`` (its KV blocks freed) instead of holding the graceful wait
    until uvicorn cancels it (a CancelledError traceback and a stream cut with no end)."""

    def __init__(self, config: uvicorn.Config, engine_thread: EngineThread) -> None:
        super().__init__(config)
        self._engine_thread = engine_thread

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await asyncio.to_thread(self._engine_thread.stop)
        await super().shutdown(sockets)


def _uvicorn_server(app: FastAPI, log_level: str) -> uvicorn.Server:
    config = uvicorn.Config(
        app, log_level=log_level, access_log=False, timeout_graceful_shutdown=5, lifespan="on"
    )
    return _Server(config, app.state.engine_thread)


def serve(app: FastAPI, sock: socket.socket, log_level: str = "info") -> None:
    """Serve until interrupted (Ctrl-C / SIGTERM)."""
    _uvicorn_server(app, log_level).run(sockets=[sock])


class ServerThread:
    """Serve ``app`` on 127.0.0.1 (a free port unless given, or the socket ``sock`` already bound)
    in a background thread.

    ``with ServerThread(app) as server: httpx.get(server.base_url + "/health")``
    """

    def __init__(
        self,
        app: FastAPI,
        host: str = "127.0.0.1",
        port: int = 0,
        log_level: str = "warning",
        sock: socket.socket | None = None,
    ) -> None:
        self.app = app
        self._sock = sock if sock is not None else bind(host, port)
        bound_host, bound_port = self._sock.getsockname()[:2]
        self.base_url = f"http://{bound_host}:{bound_port}"
        self._server = _uvicorn_server(app, log_level)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    def __enter__(self) -> ServerThread:
        self._thread.start()
        deadline_s = time.monotonic() + 60
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline_s:
                raise RuntimeError("the server thread did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(30)
        self._sock.close()
