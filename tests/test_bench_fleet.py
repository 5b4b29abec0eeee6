"""What bench records of a fleet behind a router: its replicas, and what each served."""

from __future__ import annotations

import asyncio

import httpx

from stallfree.bench.fleet import fleet_json, list_workers, parse_counters, scrape

PAGE = """# HELP vllm:request_success_total Count of successfully processed requests.
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 3.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 4.0
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1200.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 300.0
vllm:num_requests_running{engine="0",model_name="m"} 2.0
"""


def test_counters_sum_over_labels_and_ignore_the_rest() -> None:
    assert parse_counters(PAGE) == {
        "requests": 7.0,
        "prefix_cache_queries": 1200.0,
        "prefix_cache_hits": 300.0,
    }
    ours = (
        'stallfree:request_success_total{finished_reason="length"} 2\nstallfree:prefix_cache_hits_total 5\n'
    )
    assert parse_counters(ours) == {"requests": 2.0, "prefix_cache_queries": 0.0, "prefix_cache_hits": 5.0}


def _handler(request: httpx.Request) -> httpx.Response:
    if request.url.path == "/list_workers" and request.url.host == "router":
        return httpx.Response(200, json={"urls": ["http://a:1", "http://b:2"]})
    if request.url.path == "/metrics" and request.url.host == "a":
        return httpx.Response(200, text=PAGE)
    if request.url.host == "b":
        raise httpx.ConnectError("connection refused")
    return httpx.Response(404, json={"error": {"message": "not found"}})


def test_a_router_lists_its_replicas_and_a_dead_one_is_recorded_as_down() -> None:
    async def go() -> tuple[list[str] | None, list[str] | None, dict[str, object]]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(_handler)) as http:
            workers = await list_workers(http, "http://router")
            plain = await list_workers(http, "http://server")
            assert workers is not None
            before = await scrape(http, workers)
            return workers, plain, fleet_json(workers, before, await scrape(http, workers))

    workers, plain, fleet = asyncio.run(go())
    assert workers == ["http://a:1", "http://b:2"] and plain is None
    assert fleet["num_replicas"] == 2
    a, b = fleet["replicas"]  # type: ignore[misc]
    assert a["counters"] == {"requests": 0.0, "prefix_cache_queries": 0.0, "prefix_cache_hits": 0.0}
    assert b == {"url": "http://b:2", "up_after": False, "counters": None}
