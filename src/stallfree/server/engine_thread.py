"""One thread steps the engine; asyncio handlers talk to it through a thread-safe inbox.

Invariants:

- only the engine thread touches the :class:`~stallfree.engine.engine.LLMEngine` (and so the
  scheduler and its KV blocks), and it builds it too: every torch kernel of the server runs on this
  one thread's OpenMP pool. A second thread that ran a parallel kernel once (the loading, say)
  keeps a pool of its own; libgomp then counts more threads than cores and parks its workers
  between kernels instead of spinning (a wake-up per kernel: the steps of a served model ran
  1.3-1.6x slower on a 2-core EPYC); handlers put :class:`_Add` / :class:`_Abort` commands in the
  inbox, which the thread applies between steps, so an abort frees KV blocks before the next step;
- each request's :class:`RequestStream` is fed on the event loop: one
  ``loop.call_soon_threadsafe`` per step carries every output of that step;
- every stream from :meth:`EngineThread.add` is handed back through :meth:`EngineThread.release`,
  which aborts it if it has not finished (a client that went away);
- a request the engine refuses fails alone (:class:`RequestRejected`); an exception from a step
  kills the thread: every stream then fails with :class:`EngineDeadError`, new requests fail at
  once, and :attr:`EngineThread.dead_reason` says why (``/health`` answers 503);
- the engine's kernels get ``num_threads`` torch threads, by default every core on a machine of up
  to ``SMALL_MACHINE_CORES`` cores and every core but one above: on 2 cores, a core kept for the event
  loop (HTTP, SSE framing, detokenized text) halved the bandwidth the weights stream at (14.5 vs
  25.8 GB/s) and cost more than the OpenMP barrier stalls it avoids (benchmarks/README.md); with
  more cores it is a small share, kept so that the event loop never preempts an OpenMP worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import os
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from stallfree.core import SamplingParams
from stallfree.core.autoscale import ReplicaMetrics
from stallfree.core.config import ShedRule
from stallfree.server.step_log import write_step

if TYPE_CHECKING:
    from stallfree.core.outputs import RequestOutput
    from stallfree.engine.engine import LLMEngine
    from stallfree.server.prometheus import ServerMetrics
    from stallfree.server.virtual import VirtualEngine

    Engine = LLMEngine | VirtualEngine

_log = logging.getLogger(__name__)

# How long an engine that has requests but cannot schedule any waits for a command.
_STALLED_WAIT_S = 0.01


SMALL_MACHINE_CORES = 4  # up to this many cores the engine gets all of them


def default_num_threads() -> int:
    """Torch threads for the engine: the cores this process may use, less one for the event loop
    when there are more than ``SMALL_MACHINE_CORES``."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return cores if cores <= SMALL_MACHINE_CORES else cores - 1


class EngineDeadError(RuntimeError):
    """The engine thread stopped; no request can be served."""


class RequestRejected(ValueError):
    """The engine refused the request (it can never run under this configuration)."""


class OverloadedError(RuntimeError):
    """Too many requests are waiting for their first token (or a sheddable one came while many do)."""


class RequestStream:
    """Outputs of one request, read by one handler on the event loop."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.accepted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.finished = False
        self.has_output = False
        self._queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()

    # put / accept run on the event loop only (the engine thread schedules them there).
    def put(self, item: RequestOutput | BaseException) -> None:
        """Queue an output, or an error that ends the stream."""
        if isinstance(item, BaseException) and not self.accepted.done():
            self.accepted.set_exception(item)
        self._queue.put_nowait(item)

    def accept(self) -> None:
        """The engine took the request: ``accepted`` resolves."""
        if not self.accepted.done():
            self.accepted.set_result(None)

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        while not self.finished:
            item = await self._queue.get()
            if isinstance(item, BaseException):
                self.finished = True
                raise item
            self.finished = item.finished
            self.has_output = True
            yield item


@dataclass(frozen=True, slots=True)
class _Add:
    stream: RequestStream
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    arrival_s: float
    priority: int = 0


@dataclass(frozen=True, slots=True)
class _Abort:
    request_id: str


@dataclass(frozen=True, slots=True)
class _Stop:
    pass


_Command = _Add | _Abort | _Stop


class EngineThread:
    """Owns the engine's thread. :meth:`add` / :meth:`release` are called on the event loop.

    The thread starts at construction, runs ``make_engine`` (whose exception, a ValueError for
    bad options, is raised here) and then waits for :meth:`start` to step the engine.
    """

    def __init__(
        self,
        make_engine: Callable[[], Engine],
        metrics: ServerMetrics,
        *,
        max_waiting_requests: int = 256,
        num_threads: int | None = None,
        step_log: str | None = None,
        uses_torch: bool = True,
        shed: ShedRule | None = None,
    ) -> None:
        if max_waiting_requests <= 0:
            raise ValueError(f"max_waiting_requests must be positive, got {max_waiting_requests}")
        if num_threads is not None and num_threads <= 0:
            raise ValueError(f"num_threads must be positive, got {num_threads}")
        self.engine: Engine
        self.uses_torch = uses_torch  # a virtual replica's engine runs no kernels
        self.num_threads = num_threads or default_num_threads()
        self.metrics = metrics
        self.max_waiting_requests = max_waiting_requests
        self.shed = shed
        self.step_log = step_log  # a JSON line per step (server/step_log.py), written by the engine thread
        self.dead_reason: str | None = None
        # Held while checking health and queueing, and while dying: no request slips in unanswered.
        self._lock = threading.Lock()
        self._inbox: queue.SimpleQueue[_Command] = queue.SimpleQueue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = threading.Event()  # start() or stop() was called
        self._ids = itertools.count()
        # Event loop only: streams without a first token yet (what overload is measured by).
        self._waiting: set[str] = set()
        # Engine thread only.
        self._streams: dict[str, RequestStream] = {}
        self._arrival_s: dict[str, float] = {}
        self._last_token_s: dict[str, float] = {}
        self._num_preemptions_seen = 0
        self._prefix_seen = (0, 0)  # the scheduler's prefix-cache token counters last reported
        built = threading.Event()
        failure: list[BaseException] = []
        self._thread = threading.Thread(
            target=self._build_and_run,
            args=(make_engine, built, failure),
            name="stallfree-engine",
            daemon=True,
        )
        self._thread.start()
        built.wait()
        if failure:
            self._thread.join()
            raise failure[0]

    # -- lifecycle (event loop) ------------------------------------------------------------

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if not self._thread.is_alive():  # started again after a stop: the first thread is gone
            self._thread = threading.Thread(target=self._run, name="stallfree-engine", daemon=True)
            self._thread.start()
        self._started.set()

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._thread.is_alive():
            self._inbox.put(_Stop())
            self._started.set()
            self._thread.join(timeout_s)

    @property
    def is_healthy(self) -> bool:
        return self.dead_reason is None and self._loop is not None and self._thread.is_alive()

    # -- requests (event loop) -------------------------------------------------------------

    async def add(
        self, prompt_token_ids: Sequence[int], params: SamplingParams, priority: int = 0
    ) -> RequestStream:
        """Queue a request and wait until the engine holds it; then iterate the stream.

        Raises :class:`EngineDeadError`, :class:`OverloadedError` or :class:`RequestRejected`.
        """
        waiting = len(self._waiting)
        if waiting >= self.max_waiting_requests:
            raise OverloadedError(f"{waiting} requests are already waiting for a first token")
        if self.shed is not None and self.shed.sheds(priority, waiting):
            self.metrics.request_shed()
            raise OverloadedError(self.shed.reason(waiting))
        stream = RequestStream(f"cmpl-{next(self._ids)}-{time.monotonic_ns():x}")
        with self._lock:
            if not self.is_healthy:
                raise EngineDeadError(self.dead_reason or "the engine is not running")
            self._inbox.put(_Add(stream, tuple(prompt_token_ids), params, time.perf_counter(), priority))
        self._waiting.add(stream.request_id)
        try:
            await stream.accepted
        except BaseException:
            self.release(stream)
            raise
        return stream

    def release(self, stream: RequestStream) -> None:
        """The handler is done with ``stream``: abort it if the engine is still running it."""
        self._waiting.discard(stream.request_id)
        if not stream.finished:
            stream.finished = True
            self._inbox.put(_Abort(stream.request_id))

    def got_first_output(self, stream: RequestStream) -> None:
        self._waiting.discard(stream.request_id)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    # -- the engine thread -----------------------------------------------------------------

    def _build_and_run(
        self, make_engine: Callable[[], Engine], built: threading.Event, failure: list[BaseException]
    ) -> None:
        self._set_torch_threads()  # before this thread's first kernel
        try:
            self.engine = make_engine()
        except BaseException as exc:  # raised again by __init__, on the caller's thread
            failure.append(exc)
            return
        finally:
            built.set()
        self._started.wait()
        if self._loop is None:  # stopped before it started: drop the stop, step nothing
            self._take_commands(0.0)
            return
        self._run()

    def _set_torch_threads(self) -> None:
        if self.uses_torch:
            import torch  # the engine needs it; this module does not, at import

            torch.set_num_threads(self.num_threads)

    def _run(self) -> None:
        self._set_torch_threads()  # a restarted thread's own pool
        stalled = False
        log = None
        try:
            if self.step_log:  # opened here: a failure kills the thread with a reason, like a step's
                log = Path(self.step_log).open("a", buffering=1)  # noqa: SIM115
            while True:
                deliveries: list[Callable[[], None]] = []
                busy = self.engine.has_unfinished_requests()
                wait_s = (_STALLED_WAIT_S if stalled else 0.0) if busy else None
                for command in self._take_commands(wait_s):
                    if isinstance(command, _Stop):
                        self._die("the server is shutting down")
                        return
                    if isinstance(command, _Abort):
                        self._abort(command.request_id)
                    else:
                        self._add(command, deliveries)
                stalled = False
                if self.engine.has_unfinished_requests():
                    start_s = time.perf_counter()
                    stepped = self.engine.step()
                    if log is not None and stepped.step is not None:
                        step = stepped.step
                        write_step(log, step.plan, start_s, time.perf_counter(), step.result.duration_s)
                    self._after_step(stepped.outputs, deliveries)
                    if stepped.step is not None and stepped.step.plan.num_draft_tokens:
                        self.metrics.record_drafts(stepped.step.plan, stepped.step.events.num_accepted_drafts)
                    stalled = not stepped.ran  # nothing could be scheduled: wait for a command
                self._update_gauges()
                self._deliver(deliveries)
        except Exception as exc:
            _log.exception("the engine thread died")
            self._die(f"engine thread died: {type(exc).__name__}: {exc}")
        finally:
            if log is not None:
                log.close()

    def _die(self, reason: str) -> None:
        """Fail every request the engine holds or has not read yet; refuse new ones."""
        with self._lock:
            self.dead_reason = reason
            streams = list(self._streams.values())
            streams += [c.stream for c in self._take_commands(0.0) if isinstance(c, _Add)]
        for request_id in list(self._streams):  # free their KV blocks (a broken engine may refuse)
            with contextlib.suppress(Exception):
                self.engine.abort_request(request_id)
        self._streams.clear()
        error = EngineDeadError(reason)
        self._deliver([functools.partial(stream.put, error) for stream in streams])

    def _take_commands(self, wait_s: float | None) -> list[_Command]:
        """Every queued command; first waits up to ``wait_s`` for one (None: until one comes)."""
        commands: list[_Command] = []
        try:
            if wait_s is None:
                commands.append(self._inbox.get())
            elif wait_s > 0:
                commands.append(self._inbox.get(timeout=wait_s))
            while True:
                commands.append(self._inbox.get_nowait())
        except queue.Empty:
            pass
        return commands

    def _add(self, command: _Add, deliveries: list[Callable[[], None]]) -> None:
        stream = command.stream
        try:
            self.engine.add_request(
                stream.request_id,
                prompt_token_ids=list(command.prompt_token_ids),
                sampling_params=command.params,
                priority=command.priority,
            )
        except Exception as exc:  # a bad request fails alone; the engine keeps going
            deliveries.append(functools.partial(stream.put, RequestRejected(str(exc))))
            return
        self._streams[stream.request_id] = stream
        self._arrival_s[stream.request_id] = command.arrival_s
        deliveries.append(stream.accept)

    def _abort(self, request_id: str) -> None:
        if self._streams.pop(request_id, None) is None:
            return  # finished (or refused) already
        self.engine.abort_request(request_id)
        self.metrics.request_finished("abort")
        self._forget(request_id)

    def _after_step(self, outputs: Sequence[RequestOutput], deliveries: list[Callable[[], None]]) -> None:
        now_s = time.perf_counter()
        ttfts_s: list[float] = []
        itls_s: list[float] = []
        e2es_s: list[float] = []
        num_prompt_tokens = num_generated_tokens = 0
        for out in outputs:
            rid = out.request_id
            stream = self._streams.get(rid)
            if stream is None:
                continue
            last_s = self._last_token_s.get(rid)
            if last_s is None:
                ttfts_s.append(now_s - self._arrival_s[rid])
                num_prompt_tokens += len(out.prompt_token_ids)
            else:
                itls_s.append(now_s - last_s)
            self._last_token_s[rid] = now_s
            num_generated_tokens += len(out.new_token_ids)
            deliveries.append(functools.partial(stream.put, out))
            if out.finished:
                e2es_s.append(now_s - self._arrival_s[rid])
                self.metrics.request_finished(out.finish_reason or "stop")
                del self._streams[rid]
                self._forget(rid)
        self.metrics.record_step(
            ttfts_s=ttfts_s,
            itls_s=itls_s,
            num_prompt_tokens=num_prompt_tokens,
            num_generated_tokens=num_generated_tokens,
            e2es_s=e2es_s,
        )

    def _forget(self, request_id: str) -> None:
        self._last_token_s.pop(request_id, None)
        self._arrival_s.pop(request_id, None)

    def _update_gauges(self) -> None:
        scheduler = self.engine.scheduler
        new_preemptions = scheduler.num_preemptions - self._num_preemptions_seen
        self._num_preemptions_seen = scheduler.num_preemptions
        state = scheduler.state
        queried, hits = state.num_prefix_queried_tokens, state.num_prefix_hit_tokens
        seen_queried, seen_hits = self._prefix_seen
        self._prefix_seen = (queried, hits)
        load = ReplicaMetrics.of(scheduler)
        self.metrics.update_engine(
            num_running=load.num_running,
            num_waiting=load.num_waiting,
            num_used_blocks=scheduler.block_manager.num_used_blocks,
            num_blocks=scheduler.block_manager.num_blocks,
            new_preemptions=new_preemptions,
            new_prefix_queries=queried - seen_queried,
            new_prefix_hits=hits - seen_hits,
            load_tokens=(load.num_decode_kv_tokens, load.num_queued_prompt_tokens, load.max_kv_tokens),
        )

    def _deliver(self, deliveries: list[Callable[[], None]]) -> None:
        if not deliveries or self._loop is None:
            return
        with contextlib.suppress(RuntimeError):  # a closed loop: the server is shutting down
            self._loop.call_soon_threadsafe(_run_all, deliveries)


def _run_all(callbacks: list[Callable[[], None]]) -> None:
    for callback in callbacks:
        callback()
