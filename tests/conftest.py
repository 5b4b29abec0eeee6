"""Test-session setup shared by every test module."""

from __future__ import annotations

import os

# Under pytest-xdist each worker is its own process: two workers x two torch threads on
# a 2-core CI machine oversubscribe the cores, and OpenMP's barriers then make tiny
# matmuls 10-100x slower. One thread per worker (set before torch is imported, and
# inherited by the servers the tests start as subprocesses).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_configure(config: object) -> None:
    """Build the engine's compiled kernels once, before the workers start: the engines the tests
    make (and the servers they start, whose start-up waits are short) then load it from the cache
    instead of each waiting out a ~1 min build on a cold machine."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    try:
        from stallfree.engine.native import native_module
    except ImportError:  # no torch: the engine's tests skip
        return
    native_module()
