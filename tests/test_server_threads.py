"""The engine thread's torch thread budget: by the machine's size by default, or what serve is told."""

from __future__ import annotations

import os
import threading

import httpx
import pytest
import torch

from stallfree.engine.engine import LLMEngine
from stallfree.server.app import ServerConfig, build_app
from stallfree.server.engine_thread import EngineThread, default_num_threads
from stallfree.server.launch import ServerThread, build_server
from stallfree.server.prometheus import ServerMetrics

MODEL = "random:tiny"


@pytest.mark.parametrize(("cores", "threads"), [(1, 1), (2, 2), (4, 4), (5, 4), (16, 15)])
def test_default_leaves_the_event_loop_a_core_on_larger_machines(
    monkeypatch: pytest.MonkeyPatch, cores: int, threads: int
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(cores)))
    assert default_num_threads() == threads


@pytest.mark.parametrize("num_threads", [1, 2])
def test_steps_run_with_the_engine_threads_budget(num_threads: int) -> None:
    app = build_server(MODEL, dtype="float32", device="cpu", num_threads=num_threads)
    engine_thread = app.state.engine_thread
    assert engine_thread.num_threads == num_threads
    seen: list[int] = []
    real_step = engine_thread.engine.step

    def step():  # type: ignore[no-untyped-def]
        seen.append(torch.get_num_threads())
        return real_step()

    engine_thread.engine.step = step
    with ServerThread(app) as server:
        body = {"model": MODEL, "prompt": "a", "max_tokens": 3, "ignore_eos": True}
        assert httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=30).status_code == 200
    assert seen and set(seen) == {num_threads}


def test_a_non_positive_thread_count_is_refused() -> None:
    app = build_server(MODEL, dtype="float32", device="cpu")
    with pytest.raises(ValueError, match="num_threads"):
        EngineThread(lambda: app.state.engine_thread.engine, app.state.engine_thread.metrics, num_threads=0)


def test_the_engine_is_built_on_the_thread_that_steps_it() -> None:
    """One thread runs every torch kernel (one OpenMP pool): the loading as well as the steps."""
    built_on: list[int] = []

    def make_engine() -> LLMEngine:
        built_on.append(threading.get_ident())
        return LLMEngine(MODEL, dtype="float32", device="cpu")

    engine_thread = EngineThread(make_engine, ServerMetrics(MODEL), num_threads=1)
    stepped_on: set[int] = set()
    real_step = engine_thread.engine.step

    def step():  # type: ignore[no-untyped-def]
        stepped_on.add(threading.get_ident())
        return real_step()

    engine_thread.engine.step = step
    with ServerThread(build_app(engine_thread, ServerConfig(served_model_name=MODEL))) as server:
        body = {"model": MODEL, "prompt": "a", "max_tokens": 3, "ignore_eos": True}
        assert httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=30).status_code == 200
    assert built_on[0] != threading.get_ident()
    assert stepped_on == {built_on[0]}


def test_an_engine_that_fails_to_build_raises_on_the_callers_thread() -> None:
    def make_engine() -> LLMEngine:
        raise ValueError("no such model")

    with pytest.raises(ValueError, match="no such model"):
        EngineThread(make_engine, ServerMetrics(MODEL))
