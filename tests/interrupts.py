"""Run the real ``stallfree`` CLI as a subprocess, Ctrl-C it (or SIGTERM it), and find what it
left running.

The command starts in its own session, so every process it starts (pool workers, Ray, a
server's threads) carries its session id even after it is orphaned and re-parented; that is how
:func:`session_pids` finds survivors (from ``/proc``; psutil is not a dependency).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

CLI = [sys.executable, "-c", "import sys; from stallfree.cli import main; sys.exit(main())"]


def session_pids(sid: int) -> list[int]:
    """Live (not zombie) processes whose session id is ``sid``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp session ...; comm may hold spaces and parentheses.
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z" and int(fields[3]) == sid:
            pids.append(int(entry.name))
    return pids


@dataclass(frozen=True, slots=True)
class Interrupted:
    returncode: int
    stdout: str
    stderr: str
    exit_s: float  # from the signal to the exit
    survivors: list[int]


def interrupt(
    args: Sequence[str],
    *,
    ready: Callable[[], bool] | None = None,
    delay_s: float = 0.0,
    whole_group: bool = True,
    exit_timeout_s: float = 20.0,
    start_timeout_s: float = 60.0,
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
    on_start: Callable[[int], None] | None = None,
    banner: Callable[[str], None] | None = None,
    signum: signal.Signals = signal.SIGINT,
) -> Interrupted:
    """Start ``stallfree ARGS``, wait for ``ready()`` (if given) then ``delay_s``, send ``signum``
    (to the process group, as a terminal's Ctrl-C does, or to the CLI alone, as ``timeout -s INT``
    or ``kill PID``), and wait for the exit. Whatever survives is listed and then killed. ``on_start(pid)`` is
    told the CLI's pid (its session id) as soon as it runs; ``banner(line)`` the first line it
    writes to stderr (a server's address), read as it comes."""
    env = {"OMP_NUM_THREADS": "1", **os.environ, **(env or {})}
    proc = subprocess.Popen(
        [*CLI, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )
    if on_start is not None:
        on_start(proc.pid)
    err_lines: list[str] = []
    reader = None
    if banner is not None:

        def read_stderr() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                if not err_lines:
                    banner(line)
                err_lines.append(line)

        reader = threading.Thread(target=read_stderr, daemon=True)
        reader.start()
    try:
        deadline = time.monotonic() + start_timeout_s
        while ready is not None and not ready():
            if proc.poll() is not None:
                out, err = proc.communicate()
                raise AssertionError(f"exited {proc.returncode} before it was ready:\n{out}\n{err}")
            if time.monotonic() > deadline:
                raise AssertionError("never became ready")
            time.sleep(0.02)
        time.sleep(delay_s)
        sent = time.monotonic()
        if whole_group:
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)
        try:
            out, err = _communicate(proc, exit_timeout_s, reader, err_lines)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = _communicate(proc, None, reader, err_lines)
            raise AssertionError(
                f"still running {exit_timeout_s} s after {signum.name}:\n{out}\n{err}"
            ) from None
        exit_s = time.monotonic() - sent
        time.sleep(0.2)  # a worker the CLI terminated needs a moment to be gone
        survivors = session_pids(proc.pid)
        return Interrupted(proc.returncode, out, err, exit_s, survivors)
    finally:
        for pid in session_pids(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _communicate(
    proc: subprocess.Popen[str],
    timeout_s: float | None,
    reader: threading.Thread | None,
    err_lines: list[str],
) -> tuple[str, str]:
    if reader is None:
        return proc.communicate(timeout=timeout_s)
    proc.wait(timeout_s)
    reader.join(5)
    assert proc.stdout is not None
    return proc.stdout.read(), "".join(err_lines)
