"""What ``bench`` learns of a server's speculative decoding: its spec-decode counters.

vLLM (``vllm:``) and stallfree (``stallfree:``) export the same counters on ``/metrics``: verify
runs (``spec_decode_num_drafts``), draft tokens, accepted tokens, and accepted tokens by draft
position. ``bench`` reads them before and after a run (from every replica behind a router) and
records what moved: the acceptance a simulation of the same server needs.
"""

from __future__ import annotations

import re
from typing import Any

import httpx

_TOTALS = {
    "spec_decode_num_drafts_total": "num_drafts",
    "spec_decode_num_draft_tokens_total": "num_draft_tokens",
    "spec_decode_num_accepted_tokens_total": "num_accepted_tokens",
}
_LINE = re.compile(r"^\w+:(spec_decode_\w+?)(?:\{([^}]*)\})? ([-+\d.eE]+)$", re.M)
_POSITION = re.compile(r'position="(\d+)"')

Counters = dict[str, float]


def parse(text: str) -> Counters:
    """The spec-decode counters of a Prometheus page, summed over other labels; accepted tokens at
    draft position ``i`` under ``"position_i"``."""
    out: Counters = {}
    for name, labels, value in _LINE.findall(text):
        key = _TOTALS.get(name)
        if name == "spec_decode_num_accepted_tokens_per_pos_total" and (
            pos := _POSITION.search(labels or "")
        ):
            key = f"position_{pos.group(1)}"
        if key is not None:
            out[key] = out.get(key, 0.0) + float(value)
    return out


async def scrape(http: httpx.AsyncClient, urls: list[str]) -> list[Counters]:
    """Each server's spec-decode counters now (empty where /metrics does not answer or has none)."""
    out = []
    for url in urls:
        try:
            response = await http.get(f"{url.rstrip('/')}/metrics", timeout=5.0)
            out.append(parse(response.text) if response.status_code == 200 else {})
        except httpx.HTTPError:
            out.append({})
    return out


def moved(before: list[Counters], after: list[Counters]) -> dict[str, Any] | None:
    """What the counters moved by over the run, summed over the servers, with the rates derived as
    vLLM's dashboards do (None: no draft was verified)."""
    total: Counters = {}
    for start, end in zip(before, after, strict=True):
        for key, value in end.items():
            total[key] = total.get(key, 0.0) + value - start.get(key, 0.0)
    drafts, tokens = total.get("num_drafts", 0.0), total.get("num_draft_tokens", 0.0)
    if drafts <= 0:
        return None
    accepted = total.get("num_accepted_tokens", 0.0)
    positions = sorted(int(k.removeprefix("position_")) for k in total if k.startswith("position_"))
    return {
        "num_drafts": int(drafts),
        "num_draft_tokens": int(tokens),
        "num_accepted_tokens": int(accepted),
        "mean_acceptance_length": 1 + accepted / drafts,
        "draft_acceptance_rate": accepted / tokens if tokens else None,
        "acceptance_per_position": [
            total[f"position_{i}"] / drafts for i in range(max(positions, default=-1) + 1)
        ],
    }
