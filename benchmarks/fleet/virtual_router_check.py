"""Eight virtual replicas behind the real vllm-router on a Mooncake slice: where requests go and the
fleet's prefix-cache hit rate, measured vs what ``simulate --replicas 8 --router R`` predicts.

One ``stallfree serve --simulate --replicas 8`` process (each replica llama-3.1-8b on an h100-sxm,
steps priced by Vidur's measured tables, 2,048 tokens a step, prefix caching on), fresh for each
policy, behind ``vllm-router --policy cache_aware`` then ``round_robin`` (``make router``). The
first ``--rows`` rows of Mooncake's conversation trace go through the router at the trace's
timestamps (divided by ``--time-scale``, the replicas' clock running that much faster),
non-streaming, ``max_tokens`` = the row's output_length. A prompt's text follows its hash ids: one
fixed text per id, 512 words of a space and three letters (one token each to the replicas'
estimate tokenizer, so the replica counts the row's input_length), the last id's text cut to the
row's length; equal ids are equal text, so the replicas' prefix caches and the router's tree (token
ids from the replicas' ``/tokenize``) see what the trace shares. Every token is 4 characters, so a
match rate is the same share of a prompt in characters, tokens or 16-token blocks (to a block).

Measured, from each replica's ``/metrics`` over the run: requests served, prefix-cache queries and
hits (vLLM's counters), and how late each step ended against its price
(``stallfree:virtual_step_late_seconds``: how much later than its simulated time a token left, the
tracking error); the client's end-to-end latency of each request. Predicted: the same requests
(lengths, block ids, trace arrival times) through :func:`stallfree.sim.simulate` with 8 replicas
behind stallfree's ``cache-aware`` / ``round-robin`` router, as ``stallfree simulate --trace
mooncake-conversation --num-requests ROWS --replicas 8 --router R`` does (one router unit a
512-token id); for cache-aware also with 16-token units (the tree nearer vllm-router's token ids: a
partly shared last block counts by its tokens) and behind ``least-requests`` (what vllm-router does
with a request whose tokens it could not get). Replica names may permute, so splits compare sorted.
Beside them, vllm-router's own counters (``--prometheus-port``): its routing outcomes (prefix hit or
miss, load imbalance, missing tokens) and how its ``/tokenize`` calls to the workers ended, against
the requests whose prompt matches more than 30% of an earlier one (the tree's hits, predicted).

    make router && .venv/bin/python benchmarks/fleet/virtual_router_check.py     # ~6 min on 2 cores
    .venv/bin/python benchmarks/fleet/virtual_router_check.py --policies cache_aware --processes 8  # a process a replica
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import json
import os
import random
import re
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from stallfree.core import PromptBlocks, Request
from stallfree.core.router import CacheAwareConfig, PrefixTree, prompt_units
from stallfree.sim import simulate
from stallfree.sim.deployment import Deployment
from stallfree.workload.traces import MOONCAKE_BLOCK_TOKENS, load_trace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common/
from common.cli import stallfree
from common.host import machine
from common.servers import ROOT, Server, free_port, stallfree_serve, vllm_router

POLICIES = {"cache_aware": "cache-aware", "round_robin": "round-robin"}
VOCAB = ["".join(w) for w in itertools.product("abcdefghijklmnop", repeat=3)]  # " abc": one estimated token
FINE_UNIT = 16  # tokens a router unit in the finer prediction (512 / 16 = 32 units an id)
LATE = "stallfree:virtual_step_late_seconds"
SAMPLE = re.compile(r"^([a-zA-Z_:][\w:]*)(?:\{([^}]*)\})? (\S+)$", re.M)


@dataclass(frozen=True, slots=True)
class Row:
    arrival_s: float  # from the slice's first row, trace time
    prompt_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...]


def mooncake_rows(start: int, count: int) -> list[Row]:
    trace = load_trace("mooncake-conversation")
    if trace.arrival_time_s is None or trace.hash_ids is None or start + count > len(trace):
        raise SystemExit(f"the shipped slice has {len(trace)} rows with arrivals and hash ids")
    first = float(trace.arrival_time_s[start])
    return [
        Row(
            float(trace.arrival_time_s[i]) - first,
            int(trace.num_prompt_tokens[i]),
            int(trace.num_output_tokens[i]),
            trace.hash_ids[i],
        )
        for i in range(start, start + count)
    ]


def block_text(hash_id: int, cache: dict[int, str]) -> str:
    """Hash id ``hash_id``'s 512 words, the same for every prompt that names it."""
    text = cache.get(hash_id)
    if text is None:
        text = cache[hash_id] = "".join(
            " " + w for w in random.Random(hash_id).choices(VOCAB, k=MOONCAKE_BLOCK_TOKENS)
        )
    return text


def prompt_text(row: Row, cache: dict[int, str]) -> str:
    *whole, last = row.hash_ids
    in_last = row.prompt_tokens - MOONCAKE_BLOCK_TOKENS * len(whole)
    return "".join(block_text(h, cache) for h in whole) + block_text(last, cache)[: 4 * in_last]


def as_requests(rows: list[Row], unit_tokens: int) -> list[Request]:
    """The rows as the simulator takes them: one id per ``unit_tokens`` prompt tokens."""
    per_id = MOONCAKE_BLOCK_TOKENS // unit_tokens
    out = []
    for i, row in enumerate(rows):
        ids = tuple(h * per_id + k for h in row.hash_ids for k in range(per_id))
        ids = ids[: -(-row.prompt_tokens // unit_tokens)]
        blocks = PromptBlocks(ids, unit_tokens, row.prompt_tokens)
        out.append(Request(str(i), row.prompt_tokens, row.output_tokens, row.arrival_s, prompt_blocks=blocks))
    return out


# -- measured --------------------------------------------------------------------------------------


def scrape(url: str) -> dict[str, float]:
    """A replica's metrics, summed over labels but a histogram bucket's ``le``."""
    out: dict[str, float] = defaultdict(float)
    for name, labels, value in SAMPLE.findall(httpx.get(f"{url}/metrics", timeout=60).text):
        le = re.search(r'le="([^"]+)"', labels or "")
        out[f"{name}@{le.group(1)}" if le else name] += float(value)
    return out


def cpu_s(servers: list[Server]) -> float:
    """CPU seconds the servers' processes have used."""
    ticks = 0
    for server in servers:
        fields = Path(f"/proc/{server.pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


async def send_all(
    base_url: str, model: str, rows: list[Row], prompts: list[str], scale: float
) -> list[dict[str, Any]]:
    """Each row at its (scaled) arrival time; its status, send lag, wall latency and prompt tokens."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(900.0), limits=limits) as http:
        start_s = time.perf_counter() + 1.0

        async def one(row: Row, prompt: str) -> dict[str, Any]:
            due_s = start_s + row.arrival_s / scale
            await asyncio.sleep(max(0.0, due_s - time.perf_counter()))
            sent_s = time.perf_counter()
            body = {"model": model, "prompt": prompt, "max_tokens": row.output_tokens, "temperature": 0}
            response = await http.post(f"{base_url}/v1/completions", json=body)
            done_s = time.perf_counter()
            usage = response.json().get("usage", {}) if response.status_code == 200 else {}
            return {"status": response.status_code, "lag_s": sent_s - due_s, "latency_s": done_s - sent_s,
                    "prompt_tokens": usage.get("prompt_tokens")}  # fmt: skip

        return list(await asyncio.gather(*(one(r, p) for r, p in zip(rows, prompts, strict=True))))


def measure(
    policy: str, deployment: Path, rows: list[Row], args: argparse.Namespace, out: Path
) -> dict[str, Any]:
    """``rows`` through vllm-router ``policy`` in front of fresh virtual replicas."""
    serve_args = ["--simulate", "--deployment", str(deployment), "--time-scale", f"{args.time_scale:g}"]
    cache: dict[int, str] = {}
    prompts = [prompt_text(r, cache) for r in rows]
    per = -(-args.replicas // args.processes)
    sizes = [min(per, args.replicas - first) for first in range(0, args.replicas, per)]
    with contextlib.ExitStack() as stack:
        servers = [
            stack.enter_context(stallfree_serve(serve_args, replicas=n, log=out / f"serve-{policy}-{k}.log"))
            for k, n in enumerate(sizes)
        ]
        urls = [
            f"http://127.0.0.1:{s.port + i}" for s, n in zip(servers, sizes, strict=True) for i in range(n)
        ]
        model = httpx.get(f"{urls[0]}/v1/models").json()["data"][0]["id"]
        for url in urls:  # every replica's estimate tokenizer numbers the words alike, in this order
            httpx.post(f"{url}/tokenize", json={"prompt": "".join(" " + w for w in VOCAB)}, timeout=60)
        before = [scrape(u) for u in urls]
        log = out / f"router-{policy}.log"
        metrics_port = free_port()
        router_args = ["--worker-urls", *urls, "--policy", policy, "--prometheus-port", str(metrics_port)]
        with vllm_router(router_args, log=log) as router:
            load_before, cpu_before, wall_before = uptime(), cpu_s(servers), time.perf_counter()
            sent = asyncio.run(send_all(router.url, model, rows, prompts, args.time_scale))
            wall_s = time.perf_counter() - wall_before
            cpu_used_s, load_after = cpu_s(servers) - cpu_before, uptime()
            router_metrics = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30).text
            (out / f"router-{policy}.metrics").write_text(router_metrics)
        after = [scrape(u) for u in urls]
    delta = [{k: a[k] - b.get(k, 0.0) for k in a} for a, b in zip(after, before, strict=True)]
    late_max_s = max(a.get("stallfree:virtual_step_late_max_seconds", 0.0) for a in after)
    decisions = {  # how the router routed (outcome) and got each prompt's tokens from a worker (result)
        found.group(1): float(value)
        for name, labels, value in SAMPLE.findall(router_metrics)
        if name in ("vllm_router_prefix_routing_decisions_total", "vllm_router_kv_routing_inputs_total")
        and (found := re.search(r'(?:outcome|result)="([^"]*)"', labels or ""))
    }
    return {"sent": sent, "replicas": delta, "late_max_s": late_max_s, "wall_s": wall_s, "cpu_s": cpu_used_s,
            "load": [load_before, load_after], "router_decisions": decisions}  # fmt: skip


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def late_summary(replicas: list[dict[str, float]], late_max_s: float) -> str:
    """The steps' lateness over every replica: count, mean, shares past 1 / 5 / 50 ms, the worst."""
    steps = sum(r.get(f"{LATE}_count", 0.0) for r in replicas)
    if not steps:
        return "no steps"
    total_s = sum(r.get(f"{LATE}_sum", 0.0) for r in replicas)
    past = [
        1 - sum(r.get(f"{LATE}_bucket@{le}", 0.0) for r in replicas) / steps
        for le in ("0.001", "0.005", "0.05")
    ]
    return (f"{steps:,.0f} steps, mean {1000 * total_s / steps:.2f} ms late, {past[0]:.1%} > 1 ms, "
            f"{past[1]:.1%} > 5 ms, {past[2]:.2%} > 50 ms, worst {1000 * late_max_s:.0f} ms")  # fmt: skip


# -- predicted -------------------------------------------------------------------------------------


def predict(deployment: Deployment, requests: list[Request]) -> dict[str, Any]:
    result = simulate(requests, deployment)
    each = result.summary["replicas"]
    e2e_s = [r.finish_s - r.arrival_s for r in result.records if r.is_completed]
    return {
        "requests": [int(r["completed"]) for r in each],
        "hits": [(r["prefix_cache_hit_tokens"], r["prefix_cache_queried_tokens"]) for r in each],
        "e2e_s": e2e_s,
    }


def matched_over_threshold(requests: list[Request]) -> int:
    """Requests whose prompt matches more than the cache threshold of an earlier one's: those
    cache-aware routes by its tree (the union of the replicas' trees holds every earlier prompt, so
    the count does not depend on where they went; no eviction, and loads never 64 apart here)."""
    tree, threshold, count = PrefixTree(1 << 62), CacheAwareConfig().cache_threshold, 0
    for request in requests:
        units = prompt_units(request)
        count += bool(units) and tree.match(units) / len(units) > threshold
        tree.insert(units)
    return count


# -- the table -------------------------------------------------------------------------------------


def rate(hits: float, queried: float) -> float:
    return hits / queried if queried else 0.0


def table(measured: dict[str, Any], predicted: dict[str, dict[str, Any]], scale: float) -> list[str]:
    reps = measured["replicas"]
    m_req = [round(r.get("vllm:request_success_total", 0.0)) for r in reps]
    m_hits = [
        (r.get("vllm:prefix_cache_hits_total", 0.0), r.get("vllm:prefix_cache_queries_total", 0.0))
        for r in reps
    ]
    m_order = sorted(range(len(reps)), key=lambda i: (-m_req[i], -rate(*m_hits[i])))
    ok = [s for s in measured["sent"] if s["status"] == 200]
    m_e2e = sorted(s["latency_s"] * scale for s in ok)
    cols = list(predicted)
    rows = ["| | measured | " + " | ".join(f"predicted, {c}" for c in cols) + " |",
            "|---|---|" + "---|" * len(cols)]  # fmt: skip

    def line(what: str, mine: str, theirs: list[str]) -> None:
        rows.append(f"| {what} | {mine} | " + " | ".join(theirs) + " |")

    sorted_p = {c: sorted(p["requests"], reverse=True) for c, p in predicted.items()}
    m_sorted = [m_req[i] for i in m_order]
    line("requests per replica, sorted", str(m_sorted),
         [f"{sorted_p[c]} ({sum(abs(a - b) for a, b in zip(m_sorted, sorted_p[c], strict=True)) // 2} moved)" for c in cols])  # fmt: skip
    m_fleet = rate(sum(h for h, _ in m_hits), sum(q for _, q in m_hits))
    p_fleet = {
        c: rate(sum(h for h, _ in p["hits"]), sum(q for _, q in p["hits"])) for c, p in predicted.items()
    }
    line(
        "fleet hit rate",
        f"{m_fleet:.1%}",
        [f"{p_fleet[c]:.1%} ({100 * (m_fleet - p_fleet[c]):+.1f} pts)" for c in cols],
    )
    m_each = ", ".join(f"{rate(*m_hits[i]):.0%}" for i in m_order)
    p_each = []
    for p in predicted.values():
        order = sorted(range(len(p["requests"])), key=lambda i: (-p["requests"][i], -rate(*p["hits"][i])))
        p_each.append(", ".join(f"{rate(*p['hits'][i]):.0%}" for i in order))
    line("hit rate per replica (most requests first, then highest rate)", m_each, p_each)
    for stat, q in (("median", 0.5), ("p90", 0.9)):
        m = m_e2e[min(len(m_e2e) - 1, int(q * len(m_e2e)))] if m_e2e else float("nan")
        theirs = []
        for p in predicted.values():
            e2e = sorted(p["e2e_s"])
            v = e2e[min(len(e2e) - 1, int(q * len(e2e)))]
            theirs.append(f"{v:.2f} ({m / v:.2f}x)")
        line(f"{stat} E2E latency s (client; x time scale)", f"{m:.2f}", theirs)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--rows", type=int, default=300, help="trace rows sent (default 300: 102 s of the trace)"
    )
    parser.add_argument("--start", type=int, default=0, help="first row of the shipped 3,000-row slice")
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument(
        "--processes", type=int, default=1, help="serve processes the replicas are split over (default 1)"
    )
    parser.add_argument(
        "--time-scale", type=float, default=1.0, help="the replicas' clock and the arrivals K x faster"
    )
    parser.add_argument("--policies", default="cache_aware,round_robin")
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--hardware", default="h100-sxm")
    parser.add_argument("--gpu-tables", default="vidur", help="which measured GPU tables price the steps")
    parser.add_argument("--token-budget", type=int, default=2048)
    args = parser.parse_args()
    out = ROOT / "out" / "virtual_router_check"
    out.mkdir(parents=True, exist_ok=True)
    path = out / "deployment.yaml"
    stallfree("simulate", "--model", args.model, "--hardware", args.hardware, "--cost-model", "measured",
              "--gpu-tables", args.gpu_tables, "--token-budget", str(args.token_budget), "--num-requests", "1",
              "--deployment-out", str(path), capture=True)  # fmt: skip
    one = Deployment.from_dict(yaml.safe_load(path.read_text()))
    rows = mooncake_rows(args.start, args.rows)
    print(f"machine: {machine()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"Mooncake conversation rows {args.start}-{args.start + args.rows - 1}: {sum(r.prompt_tokens for r in rows):,} "
          f"prompt tokens, {sum(r.output_tokens for r in rows):,} output, {rows[-1].arrival_s:.0f} s of the trace "
          f"(/{args.time_scale:g}); {args.replicas} x {args.model} on {args.hardware} ({args.gpu_tables} tables, "
          f"{args.token_budget}-token budget)")  # fmt: skip
    for policy in args.policies.split(","):
        name = POLICIES[policy]
        fleet = dataclasses.replace(one, replicas=args.replicas, router=name)
        predicted = {
            "512-token ids (simulate --trace)": predict(fleet, as_requests(rows, MOONCAKE_BLOCK_TOKENS))
        }
        if name == "cache-aware":
            predicted[f"{FINE_UNIT}-token units"] = predict(fleet, as_requests(rows, FINE_UNIT))
            least = dataclasses.replace(fleet, router="least-requests")
            predicted["least-requests"] = predict(least, as_requests(rows, MOONCAKE_BLOCK_TOKENS))
        measured = measure(policy, path, rows, args, out)
        (out / f"{policy}.json").write_text(json.dumps({"measured": measured, "predicted": predicted}))
        sent = measured["sent"]
        failed = sum(s["status"] != 200 for s in sent)
        counted = sum(s["prompt_tokens"] or 0 for s in sent)
        print(f"\n### {policy} (stallfree {name})\n")
        print("\n".join(table(measured, predicted, args.time_scale)))
        if name == "cache-aware":
            print(f"\nrequests matching > 30% of an earlier prompt (routed by the tree), predicted: "
                  f"{matched_over_threshold(as_requests(rows, MOONCAKE_BLOCK_TOKENS))} (512-token ids), "
                  f"{matched_over_threshold(as_requests(rows, FINE_UNIT))} ({FINE_UNIT}-token units)")  # fmt: skip
        if measured["router_decisions"]:
            counters = "; ".join(f"{k} {v:g}" for k, v in sorted(measured["router_decisions"].items()))
            print(f"vllm-router's counters (routing outcomes; its /tokenize calls): {counters}")
        print(f"\n{len(sent) - failed} of {len(sent)} answered ({failed} failed); prompt tokens counted "
              f"{counted:,} (trace {sum(r.prompt_tokens for r in rows):,}); sends late by at most "
              f"{1000 * max(s['lag_s'] for s in sent):.0f} ms; tracking error: "
              f"{late_summary(measured['replicas'], measured['late_max_s'])}; replicas' processes "
              f"{measured['cpu_s'] / measured['wall_s']:.0%} of a core over {measured['wall_s']:.0f} s; "
              f"load {measured['load'][0].split('load average: ')[-1]} -> "
              f"{measured['load'][1].split('load average: ')[-1]}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
