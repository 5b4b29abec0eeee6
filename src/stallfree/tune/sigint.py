"""Ctrl-C (SIGINT) and SIGTERM during long commands: never lost, never raised where it breaks a pool.

Python turns SIGINT into KeyboardInterrupt at whatever line the main thread is running. Three
kinds of line make that go wrong, and this module owns the answers:

- Inside concurrent.futures, multiprocessing or Ray (submitting a trial, spawning a worker,
  waiting for a result), the exception can leave a future's lock held (the executor's shutdown
  then hangs) or a spawned worker unrecorded (an orphan that dies with a traceback).
  :func:`deferred` holds the signal over such a call and raises it once the call is done.
- C code may swallow it: an extension module's init that clears errors (numpy.random's, first
  imported while the sweep checks its grid) turns the Ctrl-C into nothing, and the run goes on
  to the end.
- Python code that runs from a callback (a weakref's, a finalizer) cannot pass it on: Python
  prints "Exception ignored in ..." and a traceback, and drops it.

:class:`SigintGuard` answers the last two: while it is in place a SIGINT is only recorded, and
raised at points where an exception is safe (:meth:`SigintGuard.check`, and the end of every
:func:`deferred` block); :func:`interruptible` lets it raise at once around long work such as a
trial run in this process. Everything acts in the main thread only (the one Python runs signal
handlers in), and an ignored SIGINT stays ignored.

SIGTERM (``kill PID``, a container's stop) would otherwise end the process at once, leaving its
pool workers running: :func:`sigterm_as_sigint` (around every command's handler) sends it down
the Ctrl-C path above, so every command stops, reaps and keeps what it finished the same way for
both; :func:`stop_exit_code` then says which came (130 for SIGINT, 143 for SIGTERM). :func:`stop_on_signal` is for work that polls: either signal only sets a flag, and the work
stops at its next clean point (a simulation between steps).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType


class _StopSignal:
    """Which stop signal the process took (SIGINT unless a SIGTERM came): the exit code says it."""

    __slots__ = ("signum",)

    def __init__(self) -> None:
        self.signum = signal.SIGINT


_STOP = _StopSignal()


def stop_exit_code() -> int:
    """The exit code of a command a signal stopped: 128 + the signal, 130 for Ctrl-C (SIGINT),
    143 for SIGTERM, as shells report a process the signal ended."""
    return 128 + int(_STOP.signum)


class SigintGuard:
    """While entered, a SIGINT is recorded in ``received`` and raised as KeyboardInterrupt by
    :meth:`check` (or at once inside :func:`interruptible`). Inactive outside the main thread and
    where SIGINT is not Python's default handling."""

    def __init__(self) -> None:
        self.received = False
        self._active = False
        self._raising = 0  # interruptible blocks open

    def __enter__(self) -> SigintGuard:
        in_main = threading.current_thread() is threading.main_thread()
        if in_main and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, self)
            self._active = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._active and signal.getsignal(signal.SIGINT) is self:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        self._active = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.received = True
        if self._raising:
            raise KeyboardInterrupt

    def check(self) -> None:
        """Raise KeyboardInterrupt if a Ctrl-C came while the guard was in place."""
        if self.received:
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def interruptible(self) -> Iterator[None]:
        """Raise a Ctrl-C at once while the block runs (long work in this thread)."""
        self.check()
        self._raising += 1
        try:
            yield
        finally:
            self._raising -= 1


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold SIGINT while the block runs. When it ends, a Ctrl-C that came meanwhile goes to the
    handler in place (Python's raises KeyboardInterrupt; a default disposition ends the process),
    and one a :class:`SigintGuard` in place has recorded is raised."""
    handler = signal.getsignal(signal.SIGINT)
    if handler is signal.SIG_IGN or threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    # signal.signal runs a signal already pending with the old handler first: a Ctrl-C from
    # just before the block is raised here, before the block starts.
    signal.signal(signal.SIGINT, lambda signum, frame: came.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, handler)
        if came and isinstance(handler, SigintGuard):
            handler.received = True  # recorded even when the block raised
    if came and not isinstance(handler, SigintGuard):
        if callable(handler):
            handler(signal.SIGINT, None)
        else:  # SIG_DFL, or a handler installed outside Python: its own effect
            signal.raise_signal(signal.SIGINT)
    if isinstance(handler, SigintGuard):
        handler.check()


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Under a :class:`SigintGuard`, raise a Ctrl-C at once during the block (long work in this
    thread); elsewhere Python's own handling does that already."""
    handler = signal.getsignal(signal.SIGINT)
    if isinstance(handler, SigintGuard) and threading.current_thread() is threading.main_thread():
        with handler.interruptible():
            yield
    else:
        yield


def _sigterm_as_sigint(signum: int, frame: FrameType | None) -> None:
    _STOP.signum = signal.SIGTERM
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        raise KeyboardInterrupt  # SIGINT ignored (a background job): a SIGTERM must still stop it
    # Raised again as SIGINT, it meets whatever handles SIGINT now: Python's KeyboardInterrupt, a
    # SigintGuard, deferred()'s hold, asyncio's handler; blocked in this thread, it waits as one.
    signal.raise_signal(signal.SIGINT)


@contextlib.contextmanager
def sigterm_as_sigint() -> Iterator[None]:
    """While the block runs, a SIGTERM takes the path of a Ctrl-C (where SIGINT is ignored it
    raises KeyboardInterrupt). Decorate a command's handler with it. Nothing changes outside the
    main thread or where SIGTERM already has a handler. Entering it starts a command: no stop
    signal taken yet (:func:`stop_exit_code` says 130 until a SIGTERM comes)."""
    _STOP.signum = signal.SIGINT
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return
    signal.signal(signal.SIGTERM, _sigterm_as_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


class StopFlag:
    """Set by the first SIGINT or SIGTERM under :func:`stop_on_signal`; polled by the work."""

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def is_set(self) -> bool:
        return self._set

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGTERM:
            _STOP.signum = signal.SIGTERM
        if self._set:
            raise KeyboardInterrupt  # a second signal: the user insists, stop at once
        self._set = True


@contextlib.contextmanager
def stop_on_signal() -> Iterator[StopFlag]:
    """While the block runs, the first SIGINT or SIGTERM only sets the flag yielded, so work that
    polls it (``flag.is_set``) stops at a clean point and keeps what it finished; a second one
    raises KeyboardInterrupt. An ignored SIGINT stays ignored; outside the main thread nothing is
    installed (the flag is never set)."""
    flag = StopFlag()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return
    takes_over = {
        signal.SIGINT: (signal.default_int_handler,),
        signal.SIGTERM: (signal.SIG_DFL, _sigterm_as_sigint),
    }
    previous = {}
    for signum, handlers in takes_over.items():
        if signal.getsignal(signum) in handlers:
            previous[signum] = signal.signal(signum, flag)
    try:
        yield flag
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
