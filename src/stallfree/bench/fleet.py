"""What ``bench`` learns of a fleet behind a router: its replicas, and each one's counters.

vllm-router and sglang-router list their workers at ``GET /list_workers`` (``{"urls": [...]}``);
a plain server answers 404 there, and then ``bench`` records no fleet. Each replica's Prometheus
``/metrics`` (vLLM's ``vllm:`` names or stallfree's ``stallfree:``, the same counters) is read
before and after the run, so the result says how many requests each replica served and how many
prompt tokens its prefix cache looked up and found.
"""

from __future__ import annotations

import re
from typing import Any

import httpx

COUNTERS = {
    "request_success_total": "requests",
    "prefix_cache_queries_total": "prefix_cache_queries",
    "prefix_cache_hits_total": "prefix_cache_hits",
}
_LINE = re.compile(r"^\w+:(\w+?)(?:\{[^}]*\})? ([-+\d.eE]+|NaN)$", re.M)


async def list_workers(http: httpx.AsyncClient, base_url: str) -> list[str] | None:
    """The router's replicas, or None when ``base_url`` is not a router that lists them."""
    try:
        response = await http.get(f"{base_url.rstrip('/')}/list_workers", timeout=5.0)
        urls = response.json()["urls"] if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None
    return [str(u) for u in urls] if isinstance(urls, list) and urls else None


def parse_counters(text: str) -> dict[str, float]:
    """The :data:`COUNTERS` a Prometheus text page holds, summed over their labels."""
    out = dict.fromkeys(COUNTERS.values(), 0.0)
    for name, value in _LINE.findall(text):
        if name in COUNTERS and value != "NaN":
            out[COUNTERS[name]] += float(value)
    return out


async def scrape(http: httpx.AsyncClient, urls: list[str]) -> list[dict[str, float] | None]:
    """Each replica's counters now (None: its /metrics did not answer, a replica down)."""
    out: list[dict[str, float] | None] = []
    for url in urls:
        try:
            response = await http.get(f"{url.rstrip('/')}/metrics", timeout=5.0)
            out.append(parse_counters(response.text) if response.status_code == 200 else None)
        except httpx.HTTPError:
            out.append(None)
    return out


def fleet_json(
    urls: list[str], before: list[dict[str, float] | None], after: list[dict[str, float] | None]
) -> dict[str, Any]:
    """The result's ``fleet``: its size, and per replica what its counters moved by during the run
    (None where a scrape failed, before or after)."""
    replicas = []
    for url, start, end in zip(urls, before, after, strict=True):
        moved = None if start is None or end is None else {k: end[k] - start[k] for k in end}
        replicas.append({"url": url, "up_after": end is not None, "counters": moved})
    return {"num_replicas": len(urls), "replicas": replicas}
