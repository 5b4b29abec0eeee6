"""Test-session setup shared by every test module."""

from __future__ import annotations

import os

# Under pytest-xdist each worker is its own process: two workers x two torch threads on
# a 2-core CI machine oversubscribe the cores, and OpenMP's barriers then make tiny
# matmuls 10-100x slower. One thread per worker (set before torch is imported, and
# inherited by the servers the tests start as subprocesses).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
