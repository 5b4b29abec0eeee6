"""Mooncake's traces through a fleet with KV tiers below each GPU's prefix cache: how much of the
prompts' repeated blocks each tier finds, TTFT, the replicas needed, and what the tiers cost the
simulator.

For each trace (the full conversation and synthetic traces in ``../shared/traces/mooncake/`` when
present, else the slices shipped with stallfree), 16 replicas of llama-3.1-8b on one H100 each
(aiconfigurator's measured vLLM tables, chunked at 2,048 tokens, prefix caching on) behind the
cache-aware router run the whole trace with no tier, a host tier a replica, a shared store, and
both. For each: the share of prompt tokens found on the GPU and in each tier against the bound
(the tokens whose block chain an earlier request of the trace already had: an infinite cache
shared by all), TTFT and the loads' wait. Then the fewest replicas (bisection, 1..16) meeting
P99 TTFT <= 10 s with P50 scheduling delay <= 2 s. Last, what the tiers cost the simulator: the
16-replica run without tiers and with both, one after the other ``--repeat`` times, the fastest of
each (a shared 2-core machine's load moves single timings 2x), simulate's own wall time and the
process's CPU time.

    python benchmarks/fleet/kv_tiers_fleet.py            # needs stallfree[gpu] (aiconfigurator-core)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common/ and the groups
from common.host import loadavg, log, machine
from fleet.mooncake_fleet import ROOT, TRACES, rows_of

DEPLOYMENT = [
    "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--cost-model", "measured", "--framework", "vllm",
    "--router", "cache-aware", "--max-num-batched-tokens", "2048",
]  # fmt: skip
HOST = ["--kv-host-gb", "512", "--kv-host-link", "pcie5"]
STORE = ["--kv-shared-gb", "8192", "--kv-shared-link", "ib-400"]
TIERS = {"GPU only": [], "+ host": HOST, "+ shared": STORE, "+ host + shared": [*HOST, *STORE]}
SLO_TTFT_P99_MS = 10_000
SLO_DELAY_P50_MS = 2_000


def simulate(*argv: str) -> tuple[dict[str, Any], float, float]:
    """The chunked policy's summary, the wall time and the CPU time (user + system) of the run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "stallfree"), "simulate", *DEPLOYMENT, *argv, "--json"],
        capture_output=True,
        text=True,
    )
    wall_s = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"stallfree simulate {' '.join(argv)} failed: {done.stderr.strip()}")
    cpu_s = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return json.loads(done.stdout)["policies"]["chunked"], wall_s, cpu_s


def bound(path: Path | None, limit: int | None) -> float | None:
    """The share of prompt tokens whose chain of 512-token blocks an earlier request had (short of
    each prompt's last token, in 16-token blocks, as the prefix cache looks them up)."""
    if path is None:
        return None
    seen: set[tuple[int, ...]] = set()
    hit = total = 0
    with path.open() as f:
        for n, line in enumerate(f):
            if limit is not None and n >= limit:
                break
            row = json.loads(line)
            ids, tokens = row["hash_ids"], row["input_length"]
            chain: tuple[int, ...] = ()
            found = 0
            for i in ids:
                chain = (*chain, i)
                if chain in seen:
                    found += 1
                else:
                    break
            hit += min(found * 512, (tokens - 1) // 16 * 16)
            total += tokens
            chain = ()
            for i in ids:
                chain = (*chain, i)
                seen.add(chain)
    return hit / total


def meets_slos(summary: dict[str, Any]) -> bool:
    return bool(
        summary["completed"] > 0
        and summary["p99_ttft_ms"] <= SLO_TTFT_P99_MS
        and summary["median_scheduling_delay_ms"] <= SLO_DELAY_P50_MS
    )


def fewest_replicas(trace: list[str], tiers: list[str], most: int) -> int | None:
    """The fewest replicas meeting the SLOs (bisection over 1..most; None: not even ``most``)."""
    low, high = 0, most  # low fails (0 replicas), high is to be checked
    summary, _, _ = simulate(*trace, "--replicas", str(high), *tiers)
    if not meets_slos(summary):
        return None
    while high - low > 1:
        mid = (low + high) // 2
        summary, _, _ = simulate(*trace, "--replicas", str(mid), *tiers)
        low, high = (low, mid) if meets_slos(summary) else (mid, high)
    return high


def capacity(trace: list[str], most: int) -> None:
    print(f"fewest replicas meeting P99 TTFT <= {SLO_TTFT_P99_MS / 1000:g} s, P50 scheduling delay "
          f"<= {SLO_DELAY_P50_MS / 1000:g} s:")  # fmt: skip
    for label, tiers in TIERS.items():
        log(f"capacity, {label}")
        found = fewest_replicas(trace, tiers, most)
        print(f"  {label:<16}{found if found is not None else f'more than {most}'}")


def speed(name: str, trace: list[str], replicas: int, repeat: int) -> None:
    """The run without tiers and with both, alternately ``repeat`` times: the fastest of each."""
    runs: dict[str, list[tuple[float, float]]] = {"GPU only": [], "+ host + shared": []}
    for _ in range(repeat):
        for label in runs:
            log(f"{name}: speed, {label}")
            s, _, cpu_s = simulate(*trace, "--replicas", str(replicas), *TIERS[label])
            runs[label].append((s["sim_wall_s"], cpu_s))
    off, on = runs.values()
    off_wall, off_cpu = min(w for w, _ in off), min(c for _, c in off)
    on_wall, on_cpu = min(w for w, _ in on), min(c for _, c in on)
    print(f"simulation time, the fastest of {repeat}: GPU only {off_wall:.2f} s ({off_cpu:.2f} s CPU), "
          f"+ host + shared {on_wall:.2f} s ({on_cpu:.2f} s CPU): {on_wall / off_wall:.2f}x "
          f"({on_cpu / off_cpu:.2f}x CPU)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=16, help="the fleet every run serves the trace with")
    parser.add_argument("--no-capacity", action="store_true", help="skip the fewest-replicas search")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each for the speed (default 3)")
    args = parser.parse_args()
    print(f"# {machine()}; load {loadavg()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    for name, (full, shipped) in TRACES.items():
        path = full if full.exists() else None
        trace = ["--trace", str(full) if path else shipped]
        if path is not None:
            trace += ["--num-requests", str(rows_of(path))]
        share = bound(path, None)
        shown = f"{100 * share:.1f}%" if share is not None else "not computed (shipped slice)"
        print(f"\n## {name}: {trace[1]}; tokens an earlier request's blocks already held: {shown}")
        print(f"{args.replicas} replicas, cache-aware:")
        print(f"  {'tiers':<16}{'GPU':>7}{'host':>7}{'shared':>8}{'all':>7}{'TTFT p50':>10}{'TTFT p99':>10}"
              f"{'load wait':>11}")  # fmt: skip
        for label, tiers in TIERS.items():
            log(f"{name}: {label}")
            s, _, _ = simulate(*trace, "--replicas", str(args.replicas), *tiers)
            every = s["prefix_cache_hit_rate"]  # with tiers: every source's
            gpu = s.get("kv_gpu_hit_rate", every)
            host, shared = s.get("kv_host_hit_rate") or 0.0, s.get("kv_shared_hit_rate") or 0.0
            wait = s.get("mean_kv_load_wait_ms")
            print(f"  {label:<16}{100 * gpu:>6.1f}%{100 * host:>6.1f}%{100 * shared:>7.1f}%"
                  f"{100 * every:>6.1f}%{s['median_ttft_ms']:>10,.0f}{s['p99_ttft_ms']:>10,.0f}"
                  f"{'-' if wait is None else f'{wait:.1f} ms':>11}")  # fmt: skip
        if not args.no_capacity:
            capacity(trace, args.replicas)
        speed(name, trace, args.replicas, args.repeat)
    print(f"\n(cores: {os.cpu_count()}; load at the end {loadavg()})")


if __name__ == "__main__":
    main()
