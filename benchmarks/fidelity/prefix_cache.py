"""Prefix caching, checked: the engine in process vs the simulator on multi-turn sessions, Mooncake's
conversation trace on Llama-3.1-8B / H100 with and without the cache (and tune's best budget for
each), and the simulator's speed with the cache on.

``--part engine``: ``stallfree profile --model random:medium`` (the engine's default dtype on this
CPU; reused from ``--out`` with ``--skip-profile``), then ``validate`` in process on chat sessions
(a shared system prompt; each turn repeats the conversation so far, the engine's own answers
included), cache on and off: the hit rate measured (the engine's scheduler counters) vs predicted
(the simulator's), TTFT and ITL measured vs predicted.

``--part mooncake``: ``simulate --trace mooncake-conversation`` (the shipped slice's 3,000
requests: arrivals and 512-token block hashes; 8 x H100, as one H100 cannot keep up with its
prompts) with the cache and without, then ``tune --lengths mooncake-conversation`` (rows in order,
Poisson arrivals) both ways: does the cache move the best budget?

``--part speed``: ``speed/sim_speed.py`` (10,000 arXiv requests, no shared prefixes) alternately with the
cache on and off, ``--repeats`` times each: simulate()'s CPU time.

    .venv/bin/python benchmarks/fidelity/prefix_cache.py                       # all three, ~15 min on 2 cores
    .venv/bin/python benchmarks/fidelity/prefix_cache.py --part engine --skip-profile
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from stallfree.core.serving import ServingConfig
from stallfree.validate import ValidationOptions, validate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common/
from common.cli import stallfree
from common.host import loadavg as load

SIM_SPEED = Path(__file__).resolve().parents[1] / "speed" / "sim_speed.py"
NUM_SESSIONS, TURNS, SYSTEM_PROMPT, THINK_S = 16, 4, 512, 6.0
SESSION_QPS, LENGTHS, BUDGET = 0.25, "fixed:96,32", 128
MOONCAKE = ["--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--tp", "8"]


def engine_part(args: argparse.Namespace) -> list[str]:
    profile = args.out / "medium.profile.json"
    if not (args.skip_profile and profile.exists()):
        started, before = time.perf_counter(), load()
        stallfree("profile", "--model", "random:medium", "--out", str(profile), "--no-progress")
        print(f"profile: {time.perf_counter() - started:.0f} s, load {before} -> {load()}", file=sys.stderr)
    rows = [
        f"{NUM_SESSIONS} sessions x {TURNS} turns starting at {SESSION_QPS}/s, system prompt {SYSTEM_PROMPT}, "
        f"think {THINK_S:g} s, {LENGTHS}, chunked {BUDGET}",
        "| cache | hit rate meas / pred | median TTFT ms (meas / pred, ratio) | p99 TTFT ms | median ITL ms "
        "| p99 ITL ms | load before -> after |",
        "|---|---|---|---|---|---|---|",
    ]
    for caching in (True, False):
        serving = ServingConfig(max_num_batched_tokens=BUDGET, enable_prefix_caching=caching)
        options = ValidationOptions(
            profile=str(profile), servings=(serving,), qps=SESSION_QPS, lengths=LENGTHS,
            num_requests=NUM_SESSIONS * TURNS, turns=TURNS, system_prompt_tokens=SYSTEM_PROMPT,
            think_time_s=THINK_S,
        )  # fmt: skip
        before = load()
        result = validate(options)
        body = result.to_json()
        (args.out / f"validate-sessions-{'on' if caching else 'off'}.json").write_text(
            json.dumps(body, indent=2)
        )
        m = body["policies"]["chunked"]["metrics"]
        hits = m["prefix_cache_hit_rate"]
        hit_text = f"{hits['measured']:.1%} / {hits['predicted']:.1%}" if caching else "-"
        cells = [
            f"{m[k]['measured']:,.0f} / {m[k]['predicted']:,.0f} ({m[k]['ratio']:.2f})"
            for k in ("median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "p99_itl_ms")
        ]
        rows.append(
            f"| {'on' if caching else 'off'} | {hit_text} | {' | '.join(cells)} | {before} -> {load()} |"
        )
    return rows


def mooncake_part(args: argparse.Namespace) -> list[str]:
    rows = ["| cache | hit rate | requests with a hit | mean TTFT ms | median TTFT | p99 TTFT | p99 ITL ms |"]
    rows.append("|---|---:|---:|---:|---:|---:|---:|")
    for flag in ("--enable-prefix-caching", "--no-enable-prefix-caching"):
        out = stallfree(
            "simulate", "--trace", "mooncake-conversation", *MOONCAKE, flag, "--json", capture=True
        )
        s = json.loads(out)["policies"]["chunked"]
        hits = "-" if s["prefix_cache_hit_rate"] is None else f"{s['prefix_cache_hit_rate']:.1%}"
        with_hit = (
            "-" if s.get("prefix_cache_hit_requests") is None else f"{s['prefix_cache_hit_requests']:.1%}"
        )
        rows.append(
            f"| {'on' if flag.startswith('--enable') else 'off'} | {hits} | {with_hit} | {s['mean_ttft_ms']:,.0f} "
            f"| {s['median_ttft_ms']:,.0f} | {s['p99_ttft_ms']:,.0f} | {s['p99_itl_ms']:.1f} |"
        )
    rows += ["", "| cache | best budget | capacity (QPS) | trials | wall s |", "|---|---:|---:|---:|---:|"]
    for flag in ("--enable-prefix-caching", "--no-enable-prefix-caching"):
        started = time.perf_counter()
        out = stallfree(
            "tune", "--lengths", "mooncake-conversation", *MOONCAKE, "--policy", "chunked",
            "--num-requests", str(args.tune_requests), flag, "--json", "--no-progress", capture=True,
        )  # fmt: skip
        body = json.loads(out)
        entry = body["policies"]["chunked"]
        best = next((p for p in entry["curve"] if p["token_budget"] == entry["best_budget"]), None)
        capacity = "-" if best is None else f"{best['capacity_qps']:.3g}"
        rows.append(
            f"| {'on' if flag.startswith('--enable') else 'off'} | {entry['best_budget']} | {capacity} "
            f"| {len(body['trials'])} | {time.perf_counter() - started:.0f} |"
        )
    return rows


def speed_part(args: argparse.Namespace) -> list[str]:
    cpu: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(args.repeats):
        for caching in (True, False):
            cmd = [sys.executable, str(SIM_SPEED), "--child", "10000", "--cost-model", "full"]
            if not caching:
                cmd.append("--no-enable-prefix-caching")
            row = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
            cpu[caching].append(row["simulate_cpu_s"])
    on, off = statistics.median(cpu[True]), statistics.median(cpu[False])
    return [
        f"10,000 arXiv requests, simulate() CPU s, median of {args.repeats} (alternating; load {load()}): "
        f"cache on {on:.2f} ({min(cpu[True]):.2f}-{max(cpu[True]):.2f}), off {off:.2f} "
        f"({min(cpu[False]):.2f}-{max(cpu[False]):.2f}): on / off {on / off:.2f}x"
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("all", "engine", "mooncake", "speed"), default="all")
    parser.add_argument("--out", type=Path, default=Path("out/prefix-cache"))
    parser.add_argument("--skip-profile", action="store_true", help="reuse the profile under --out")
    parser.add_argument("--tune-requests", type=int, default=1000, help="requests per tune trial")
    parser.add_argument("--repeats", type=int, default=3, help="--part speed: runs of each")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    parts = {"engine": engine_part, "mooncake": mooncake_part, "speed": speed_part}
    for name, part in parts.items():
        if args.part in ("all", name):
            print(f"## {name}", flush=True)
            print("\n".join(part(args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
