"""Where trials run: in this process, in a local process pool, or as Ray tasks.

Every pool takes a trial function (``TrialSpec -> summary``; module-level, so it pickles)
and offers two calls: :meth:`TrialPool.submit` a spec under an integer ticket, and
:meth:`TrialPool.next_result` to block until some submitted trial is done. The caller decides
what to submit next from the results, so adaptive searches keep every worker busy. Pools
never reorder or reseed anything: a trial's result depends on its spec alone, so every pool
gives the same results for the same specs (only completion order differs).
"""

from __future__ import annotations

import abc
import concurrent.futures as cf
import contextlib
import multiprocessing
import os
import signal
import socket
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stallfree.metrics import Summary
from stallfree.tune.sigint import deferred, interruptible
from stallfree.tune.trial import TrialSpec

TrialFn = Callable[[TrialSpec], Summary]
POOLS = ("local", "ray")


class TrialPool(abc.ABC):
    """Runs trials; use as a context manager so workers are always shut down."""

    workers: int = 1

    @abc.abstractmethod
    def submit(self, ticket: int, spec: TrialSpec) -> None: ...

    @abc.abstractmethod
    def next_result(self) -> tuple[int, Summary]:
        """Block until a submitted trial finishes; its ticket and summary."""

    def close(self) -> None:  # noqa: B027 - nothing to release by default
        """Release workers."""

    def __enter__(self) -> TrialPool:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        try:
            self.close()
        except KeyboardInterrupt:
            if exc_type is None:
                raise  # a Ctrl-C during a clean close
            # Already unwinding (an interrupt or an error): that exception goes on.


class SerialPool(TrialPool):
    """Runs each trial in this process, first submitted first, when a result is asked for."""

    def __init__(self, trial_fn: TrialFn) -> None:
        self._trial_fn = trial_fn
        self._queue: deque[tuple[int, TrialSpec]] = deque()

    def submit(self, ticket: int, spec: TrialSpec) -> None:
        self._queue.append((ticket, spec))

    def next_result(self) -> tuple[int, Summary]:
        ticket, spec = self._queue.popleft()
        with interruptible():  # a trial here takes seconds: a Ctrl-C stops it at once
            return ticket, self._trial_fn(spec)


class ProcessPool(TrialPool):
    """A local process pool of ``workers`` processes (spawned: no state leaks from the parent).

    Workers ignore SIGINT: a Ctrl-C reaches the whole process group, and a worker dying of it
    mid-task breaks the executor in ways its shutdown can hang on. The parent alone handles the
    interrupt; :meth:`close` with trials still in flight (an interrupt or an error) terminates
    the workers and reaps them instead of waiting for their trials to end.
    """

    def __init__(self, trial_fn: TrialFn, workers: int) -> None:
        if workers <= 0:
            raise ValueError(f"workers must be positive, got {workers}")
        self.workers = workers
        self._trial_fn = trial_fn
        with deferred():  # its queues start multiprocessing's resource tracker (a process)
            self._pool = cf.ProcessPoolExecutor(
                workers, mp_context=multiprocessing.get_context("spawn"), initializer=_ignore_sigint
            )
        self._futures: dict[cf.Future[Summary], int] = {}

    def submit(self, ticket: int, spec: TrialSpec) -> None:
        # A submit may spawn a worker. A Ctrl-C meanwhile is raised once the worker is recorded
        # (deferred), and SIGINT stays blocked in this thread: the new process inherits the mask,
        # so a Ctrl-C during its start-up cannot kill it with a traceback before its initializer
        # ignores SIGINT. (The mask alone holds nothing back here: a thread that does not block
        # SIGINT takes the signal for the main thread, such as tqdm's monitor, which starts even
        # for a disabled bar, or a BLAS thread.)
        with deferred():
            blocked = threading.current_thread() is threading.main_thread()
            if blocked:
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            try:
                self._futures[self._pool.submit(self._trial_fn, spec)] = ticket
            finally:
                if blocked:
                    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

    def next_result(self) -> tuple[int, Summary]:
        # Wait in slices, each deferred: a Ctrl-C is raised between them (within 0.2 s), never
        # inside concurrent.futures, where it could leave a future's lock held and the shutdown
        # hung. Slices also wake the main thread for a Ctrl-C that another thread took.
        done: set[cf.Future[Summary]] = set()
        while not done:
            with deferred():
                done, _ = cf.wait(self._futures, timeout=0.2, return_when=cf.FIRST_COMPLETED)
        future = min(done, key=self._futures.__getitem__)  # lowest ticket: a stable order
        return self._futures.pop(future), future.result()

    def close(self) -> None:
        with deferred():  # a second Ctrl-C must not cut the cleanup short (orphans)
            if not any(not f.done() for f in self._futures):
                self._pool.shutdown(wait=True)
                return
            self._futures.clear()
            # Private but stable since 3.8 (3.14 adds terminate_workers()): the live workers and
            # the thread that manages them, taken before shutdown() forgets them.
            processes = list((getattr(self._pool, "_processes", None) or {}).values())
            manager = getattr(self._pool, "_executor_manager_thread", None)
            self._pool.shutdown(wait=False, cancel_futures=True)
            for process in processes:
                with contextlib.suppress(OSError, ValueError):
                    process.terminate()
            for process in processes:
                with contextlib.suppress(OSError, ValueError, AssertionError):
                    process.join(timeout=5.0)
                    if process.is_alive():
                        process.kill()
                        process.join(timeout=5.0)
            if isinstance(manager, threading.Thread):
                manager.join(timeout=5.0)  # it sees the dead workers, fails their futures, exits


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class RayPool(TrialPool):
    """Trials as Ray tasks: on the cluster at ``address``, or on a local Ray started here.

    ``address`` is what ``ray.init`` takes (``auto``, ``HOST:PORT``, ``ray://HOST:PORT``). A
    ``HOST:PORT`` that does not accept a TCP connection within ``connect_timeout_s``, or accepts
    one but is not a Ray head, fails in about that time with one line, rather than after Ray's
    own retries (about 20 s of warnings). Ray itself starts (or is joined) at the first trial.
    """

    def __init__(
        self,
        trial_fn: TrialFn,
        address: str | None = None,
        num_cpus: int | None = None,
        connect_timeout_s: float = 3.0,
    ) -> None:
        try:
            import ray
        except ImportError:
            raise ValueError("the ray backend needs Ray: pip install 'stallfree[ray]'") from None
        if address not in (None, "auto", "local"):
            check_address(address, connect_timeout_s)
        self._ray: Any = ray
        self._trial_fn = trial_fn
        self._address = address
        self._num_cpus = num_cpus
        self._connect_timeout_s = connect_timeout_s
        self._started_here = False
        self._remote: Any = None
        self._refs: dict[Any, int] = {}

    def _start(self) -> None:
        """Start or join Ray at the first trial, so input checked before it never waits for Ray.
        A Ctrl-C meanwhile waits for Ray to be up (seconds), so that close() can shut it down."""
        ray = self._ray
        if not ray.is_initialized():
            if self._address is None:
                self._started_here = True  # before init: a Ray that fails halfway is shut down too
                ray.init(num_cpus=self._num_cpus, include_dashboard=False, log_to_driver=False)
            else:
                _connect(ray, self._address, self._connect_timeout_s)
                self._started_here = True
        self.workers = max(1, int(ray.cluster_resources().get("CPU", 1)))
        self._remote = ray.remote(num_cpus=1)(self._trial_fn)

    def submit(self, ticket: int, spec: TrialSpec) -> None:
        with deferred():
            if self._remote is None:
                self._start()
            self._refs[self._remote.remote(spec)] = ticket

    def next_result(self) -> tuple[int, Summary]:
        ready: list[Any] = []
        while not ready:  # in deferred slices, as ProcessPool.next_result
            with deferred():
                ready, _ = self._ray.wait(list(self._refs), num_returns=1, timeout=0.2)
        with deferred():
            result: Summary = self._ray.get(ready[0])
        return self._refs.pop(ready[0]), result

    def close(self) -> None:
        with deferred():  # a second Ctrl-C must not leave a local Ray running
            for ref in self._refs:
                with contextlib.suppress(Exception):  # already finished or its worker gone
                    self._ray.cancel(ref, force=True)
            self._refs.clear()
            if self._started_here:
                self._ray.shutdown()


def _connect(ray: Any, address: str, timeout_s: float) -> None:
    """``ray.init(address)`` with Ray's connection retries cut to ``timeout_s`` and its retry
    warnings (C++ logs on fd 2) kept off the terminal, so a failure is our one line."""
    budget = {"RAY_gcs_server_port_wait_time_s": str(max(1, round(timeout_s)))}
    saved_env = {name: os.environ.get(name) for name in budget}
    os.environ.update({k: v for k, v in budget.items() if saved_env[k] is None})
    saved_stderr = os.dup(2)
    try:
        with Path(os.devnull).open("w") as devnull:
            os.dup2(devnull.fileno(), 2)
            ray.init(address=address, log_to_driver=False, logging_level="error")
    except (ConnectionError, RuntimeError) as error:
        lines = str(error).strip().splitlines()
        raise ValueError(
            f"cannot reach a Ray cluster at {address}: {lines[0] if lines else type(error).__name__}"
        ) from None
    finally:
        os.dup2(saved_stderr, 2)
        os.close(saved_stderr)
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)


def check_address(address: str, timeout_s: float) -> None:
    """Raise a one-line ``ValueError`` unless ``[ray://]HOST:PORT`` accepts a TCP connection."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"bad Ray address {address!r}; expected auto, HOST:PORT or ray://HOST:PORT")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            pass
    except OSError as error:
        raise ValueError(f"no Ray cluster answers at {address} ({error.strerror or error})") from None


def make_pool(name: str, trial_fn: TrialFn, *, workers: int, address: str | None = None) -> TrialPool:
    """``local`` (a pool of ``workers``, or this process when ``workers`` is 1) or ``ray``."""
    if name == "local":
        if address is not None:
            raise ValueError("--address applies to the ray backend only")
        return SerialPool(trial_fn) if workers == 1 else ProcessPool(trial_fn, workers)
    if name == "ray":
        return RayPool(trial_fn, address, num_cpus=workers)
    raise ValueError(f"unknown backend {name!r}; choose from {', '.join(POOLS)}")
