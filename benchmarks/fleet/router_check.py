"""stallfree's routers against the real vllm-router on the same requests: which replica each goes to.

Two ``stallfree serve`` replicas (SmolLM2, one thread each) behind ``vllm-router --policy P``
(``make router``: its own venv). Multi-turn chats are sent one request at a time (so every load is
0 when a request is routed: the rule's cache and tie-break decide, not the balancing), each turn's
prompt the chat so far (a system prompt, the earlier messages and answers, a new message). Which
replica served each request is read from the replicas' ``/metrics``. The same prompts go through
:class:`stallfree.core.router.CacheAware` (and ``RoundRobin``) twice: over the prompt's characters
and over its token ids (the real router's units: it asks each worker to tokenize the prompt, here
stallfree serve's ``/tokenize``; and what the simulator knows of a prompt: one unit per id), and
the choices are compared request by request, and as a split of the requests (with all loads equal,
vllm-router's pick among the least loaded is fixed within a process but not which replica it is, so
the replicas' names may swap between runs).

    make router && python benchmarks/fleet/router_check.py --sessions 6 --turns 4
    python benchmarks/fleet/router_check.py --part hits   # the fleet's prefix-cache hit rate, measured vs predicted
    python benchmarks/fleet/router_check.py --part faults # a replica killed mid-run behind the router
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx

from stallfree.core import PromptBlocks, Request
from stallfree.core.router import CacheAware, RoundRobin, Router

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common/ and the groups
from common.host import loadavg, machine
from common.servers import ROOT, stallfree_serve, vllm_router

POLICIES = {"cache_aware": "cache-aware", "round_robin": "round-robin"}
WORDS = [
    "stall",
    "free",
    "batching",
    "chunk",
    "prompt",
    "decode",
    "stream",
    "token",
    "budget",
    "step",
    "cache",
    "prefix",
    "replica",
]


@contextlib.contextmanager
def router(urls: list[str], policy: str) -> Iterator[str]:
    """vllm-router ``--policy policy`` in front of ``urls``; its URL once healthy (log under out/)."""
    log = ROOT / "out" / "router_check" / f"router-{policy}.log"
    with vllm_router(["--worker-urls", *urls, "--policy", policy], log=log) as server:
        yield server.url


def served(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(
        float(m) for m in re.findall(r"^stallfree:request_success_total\{[^}]*\} ([\d.e+]+)$", text, re.M)
    )


def chats(sessions: int, turns: int, seed: int, shared: bool) -> list[list[str]]:
    """Each chat's messages, its first one after its system prompt (one for all chats if ``shared``)."""
    rng = random.Random(seed)

    def words(n: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(n))

    common = words(60)
    return [
        [f"You are a helpful assistant. {common if shared else words(60)} user {s}: {words(25)}"]
        + [f"user {s}: {words(25)}" for _ in range(turns - 1)]
        for s in range(sessions)
    ]


def run(base_url: str, urls: list[str], messages: list[list[str]], model: str) -> tuple[list[str], list[int]]:
    """The prompts sent (turn by turn across the chats) and the replica that served each."""
    history = ["" for _ in messages]
    prompts, chosen = [], []
    for turn in range(len(messages[0])):
        for s, chat in enumerate(messages):
            prompt = (history[s] + " " + chat[turn]).strip() if history[s] else chat[turn]
            before = [served(u) for u in urls]
            body = {"model": model, "prompt": prompt, "max_tokens": 8, "temperature": 0}
            answer = httpx.post(f"{base_url}/v1/completions", json=body, timeout=60).json()
            after = [served(u) for u in urls]
            (replica,) = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if b > a]
            prompts.append(prompt)
            chosen.append(replica)
            history[s] = prompt + answer["choices"][0]["text"]
    return prompts, chosen


def ours(make: type[Router] | None, prompts: list[str], units: list[tuple[int, ...]]) -> list[int]:
    router: Router = CacheAware(2) if make is None else make()
    out = []
    for i, unit in enumerate(units):
        request = Request(str(i), max(1, len(unit)), 8, prompt_blocks=PromptBlocks(unit) if unit else None)
        out.append(router.route(request, [0, 0]))
    return out


SESSIONS = ["--scenario", "multi-turn", "--sessions", "8", "--turns", "4", "--system-prompt-tokens", "512",
            "--lengths", "fixed:96,24", "--qps", "0.5", "--think-time-s", "1", "--temperature", "0"]  # fmt: skip


def hit_rates(serve_args: list[str], out: Path) -> list[str]:
    """Multi-turn chats through vllm-router in front of two fresh replicas, per policy: the fleet's
    prefix-cache hit rate measured (both replicas' counters) and predicted (``simulate --replay``
    of the same requests, two replicas behind stallfree's router)."""
    from fidelity.vllm_side_by_side import bench, json_of, prefix_counters

    rows = ["| policy | requests | prompt tokens from the cache, measured | predicted | split (requests per replica) |",
            "|---|---:|---:|---:|---|"]  # fmt: skip
    for policy, name in POLICIES.items():
        with stallfree_serve(serve_args) as a, stallfree_serve(serve_args) as b:
            urls = [a.url, b.url]
            before = [prefix_counters(u, "stallfree")[1] for u in urls]
            counts = [served(u) for u in urls]
            with router(urls, policy) as base_url:
                result = out / f"sessions-{policy}.json"
                measured = bench(base_url, result, *SESSIONS, "--seed", "7")
            hits = sum(prefix_counters(u, "stallfree")[1] - b for u, b in zip(urls, before, strict=True))
            split = [int(served(u) - c) for u, c in zip(urls, counts, strict=True)]
        sim = json_of("simulate", "--replay", str(result), "--replicas", "2", "--router", name, "--model",
                      "llama-3-8b", "--token-budget", "256")  # fmt: skip
        predicted = sim["policies"]["chunked"]["prefix_cache_hit_rate"] or 0.0
        per_replica = [r["completed"] for r in sim["policies"]["chunked"]["replicas"]]
        queried = sum(measured["input_lens"])
        rows.append(f"| {policy} | {len(measured['input_lens'])} | {hits / queried:.1%} | {predicted:.1%} | "
                    f"measured {split}, predicted {per_replica} |")  # fmt: skip
        print(rows[-1], file=sys.stderr, flush=True)
    return rows


FAULT_LOAD = ["--scenario", "poisson", "--qps", "1.5", "--num-requests", "40", "--lengths", "fixed:64,48", "--temperature", "0",
              "--seed", "3", "--timeout", "120"]  # fmt: skip


def faults(serve_args: list[str], out: Path, kill_after_s: float) -> list[str]:
    """Poisson traffic through vllm-router (round_robin) in front of two replicas; one is killed
    (SIGKILL) mid-run. What bench records: the failed requests and why, the rest completed, the
    fleet it found behind the router, and that it ended on its own (a hang would hit its bound)."""
    import signal

    result = out / "faults.json"
    with (
        stallfree_serve(serve_args) as a,
        stallfree_serve(serve_args) as b,
        router([a.url, b.url], "round_robin") as base,
    ):
        url_b, pid_b = b.url, b.pid
        argv = [sys.executable, "-c", "import sys; from stallfree.cli import main; sys.exit(main())", "bench", "--base-url", base, *FAULT_LOAD,
                "--save-result", str(result), "--no-progress"]  # fmt: skip
        started = time.perf_counter()
        bench_proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        time.sleep(kill_after_s)
        os.kill(pid_b, signal.SIGKILL)
        killed_at = time.perf_counter() - started
        try:
            printed, _ = bench_proc.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            bench_proc.kill()
            return [f"bench still running 600 s after the kill: it hangs (killed at {killed_at:.1f} s)"]
        wall = time.perf_counter() - started
    if not result.exists():
        return [
            f"bench exited {bench_proc.returncode} with no result (replica killed at {killed_at:.1f} s):",
            printed,
        ]
    body = json.loads(result.read_text())
    errors = [e for e in body["errors"] if e]
    return [
        f"{' '.join(FAULT_LOAD)}; replica {url_b} killed at {killed_at:.1f} s; bench exited {bench_proc.returncode} "
        f"after {wall:.1f} s",
        f"completed {body['completed']}, failed {body['failed']} of {body['num_prompts']}; "
        f"errors: {dict(Counter(e.split(':')[0] for e in errors))}",
        f"first error: {errors[0] if errors else '-'}",
        f"fleet recorded: {json.dumps(body.get('fleet'))}",
        printed.strip().splitlines()[-1] if printed.strip() else "",
    ]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sessions", type=int, default=6)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--system-prompt", choices=("shared", "per-chat"), default="per-chat")
    parser.add_argument("--part", choices=("choices", "hits", "faults"), default="choices")
    parser.add_argument(
        "--kill-after-s", type=float, default=12.0, help="--part faults: when to kill a replica"
    )
    args = parser.parse_args()
    import torch

    from stallfree.engine.weights import load_model

    _, tokenizer = load_model("smollm2", torch.float32, "cpu")
    print(f"machine: {machine()}; load {loadavg()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    os.environ["OMP_NUM_THREADS"] = "1"
    serve_args = ["--model", "smollm2", "--threads", "1", "--token-budget", "256"]
    if args.part == "faults":
        out = ROOT / "out" / "router_check"
        out.mkdir(parents=True, exist_ok=True)
        print("\n".join(faults(serve_args, out, args.kill_after_s)))
        return 0
    if args.part == "hits":
        out = ROOT / "out" / "router_check"
        out.mkdir(parents=True, exist_ok=True)
        print(f"{' '.join(SESSIONS)}")
        print("\n".join(hit_rates(serve_args, out)))
        return 0
    with stallfree_serve(serve_args) as a, stallfree_serve(serve_args) as b:
        urls = [a.url, b.url]
        model = httpx.get(f"{a.url}/v1/models").json()["data"][0]["id"]
        for policy, name in POLICIES.items():
            with router(urls, policy) as base_url:
                prompts, real = run(
                    base_url,
                    urls,
                    chats(args.sessions, args.turns, args.seed, args.system_prompt == "shared"),
                    model,
                )
            chars = [tuple(ord(c) for c in p) for p in prompts]
            tokens = [tuple(tokenizer.encode(p)) for p in prompts]
            make = RoundRobin if name == "round-robin" else None
            for unit_name, units in (("characters", chars), ("token ids", tokens)):
                mine = ours(make, prompts, units)
                same = sum(a == b for a, b in zip(real, mine, strict=True))
                split = max(same, len(real) - same)  # two replicas: the same split, whichever is called 0
                print(f"{policy}: {len(real)} requests; vllm-router {''.join(map(str, real))}; "
                      f"stallfree {name} over {unit_name} {''.join(map(str, mine))}: {same}/{len(real)} "
                      f"to the same replica, {split}/{len(real)} the same split")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
