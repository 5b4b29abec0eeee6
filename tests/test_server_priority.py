"""Priorities over HTTP (vLLM's ``priority`` request field) and shedding: the field reaches the
scheduler, a bad one is a 400, sheddable requests get 429 with Retry-After and are counted."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import httpx
import pytest

from stallfree.cli import main
from stallfree.core import SamplingParams
from stallfree.core.config import ShedRule
from stallfree.core.serving import ServingConfig
from stallfree.costs import CostChoice
from stallfree.server.launch import ServerThread, build_virtual_server
from stallfree.server.virtual import VirtualEngine
from stallfree.sim import Deployment

DEPLOYMENT = Deployment(
    costs=CostChoice(kind="full", model="llama-3.1-8b", hardware="h100-sxm"),
    serving=ServingConfig(max_num_batched_tokens=256, max_num_seqs=1, scheduling_policy="priority"),
)


def _first_token_order(deployment: Deployment) -> list[str]:
    engine = VirtualEngine(deployment, time_scale=50.0)
    for rid, priority in (("first", 5), ("batch", 9), ("chat", 0), ("urgent", -3)):
        engine.add_request(
            rid, sampling_params=SamplingParams(max_tokens=3), prompt_token_ids=[7] * 40, priority=priority
        )
    order: list[str] = []
    while engine.has_unfinished_requests():
        order += [o.request_id for o in engine.step().outputs if o.request_id not in order]
    return order


def test_the_served_priority_orders_the_queue() -> None:
    """One sequence at a time: all four queue before the first step, so they start in priority
    order under the priority policy and in arrival order under fcfs."""
    assert _first_token_order(DEPLOYMENT) == ["urgent", "chat", "first", "batch"]
    fcfs = replace(DEPLOYMENT, serving=replace(DEPLOYMENT.serving, scheduling_policy="fcfs"))
    assert _first_token_order(fcfs) == ["first", "batch", "chat", "urgent"]


@pytest.fixture(scope="module")
def shedding() -> Iterator[ServerThread]:
    # max_waiting 0: a sheddable request is refused whatever waits, so the test needs no load.
    app = build_virtual_server(DEPLOYMENT, time_scale=4.0, shed=ShedRule(min_priority=10, max_waiting=0))
    with ServerThread(app) as running:
        yield running


def test_sheddable_requests_get_429_with_retry_after_and_are_counted(shedding: ServerThread) -> None:
    url = f"{shedding.base_url}/v1/completions"
    body = {"model": "llama-3.1-8b", "prompt": "one two three", "max_tokens": 4}
    assert httpx.post(url, json={**body, "priority": 9}, timeout=30).status_code == 200
    refused = httpx.post(url, json={**body, "priority": 10}, timeout=30)
    assert refused.status_code == 429
    assert int(refused.headers["retry-after"]) >= 1
    error = refused.json()["error"]
    assert error["type"] == "rate_limit_error" and "priority >= 10" in error["message"]
    chat = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}], "priority": 12}
    assert httpx.post(f"{shedding.base_url}/v1/chat/completions", json=chat, timeout=30).status_code == 429
    metrics = httpx.get(f"{shedding.base_url}/metrics", timeout=30).text
    assert 'stallfree:requests_shed_total{model_name="llama-3.1-8b"} 2.0' in metrics


@pytest.mark.parametrize("priority", [1.5, "high", True, None])
def test_a_priority_that_is_not_an_integer_is_a_400(shedding: ServerThread, priority: object) -> None:
    body = {"model": "llama-3.1-8b", "prompt": "hi", "max_tokens": 2, "priority": priority}
    answer = httpx.post(f"{shedding.base_url}/v1/completions", json=body, timeout=30)
    assert answer.status_code == 400
    assert "priority" in answer.json()["error"]["message"]


def test_shed_waiting_needs_shed_priority(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--simulate", "--shed-waiting", "3"]) == 2
    assert "--shed-waiting applies with --shed-priority P" in capsys.readouterr().err
