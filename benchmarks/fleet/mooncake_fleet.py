"""Mooncake's traces at their own rate through a fleet: cache-aware vs round-robin routing.

For each trace (the full conversation and synthetic traces in ``../shared/traces/mooncake/``
when present, else the slices shipped with stallfree) and each router, ``stallfree tune`` sizes
the fleet (the fewest replicas of llama-3.1-8b on one H100 each, priced by aiconfigurator's
measured vLLM tables, meeting P99 TTFT <= 10 s, the strict P99 TBT and a P50 scheduling delay <=
2 s), then the whole trace runs through 16 replicas behind each router: the fleet's prefix-cache
hit rate, TTFT, TBT and load imbalance, and each simulation's wall time.

    python benchmarks/fleet/mooncake_fleet.py            # needs stallfree[gpu] (aiconfigurator-core)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common/
from common.host import loadavg, machine

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "traces" / "mooncake"
TRACES = {
    "conversation": (SHARED / "conversation_trace.jsonl", "mooncake-conversation"),
    "synthetic": (SHARED / "synthetic_trace.jsonl", "mooncake-synthetic"),
}
ROUTERS = ("cache-aware", "round-robin")
DEPLOYMENT = [
    "--model",
    "llama-3.1-8b",
    "--hardware",
    "h100-sxm",
    "--cost-model",
    "measured",
    "--framework",
    "vllm",
]
SLOS = ["--slo-ttft-p99-ms", "10000"]


def stallfree(*argv: str, env: dict[str, str] | None = None) -> tuple[dict, float]:
    started = time.perf_counter()
    done = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "stallfree"), *argv, "--json"], capture_output=True, text=True, env=env
    )
    wall_s = time.perf_counter() - started
    if done.returncode not in (0, 1):
        sys.exit(f"stallfree {' '.join(argv)} failed: {done.stderr.strip()}")
    return json.loads(done.stdout), wall_s


def rows_of(path: Path) -> int:
    with path.open() as f:
        return sum(1 for line in f if line.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--replicas", type=int, default=16, help="the fleet every router serves the whole trace with"
    )
    parser.add_argument("--budget", default="2048", help="the token budget(s) tune tries (default 2048)")
    args = parser.parse_args()
    print(f"# {machine()}; load {loadavg()}; {time.strftime('%Y-%m-%d')}")
    for name, (full, shipped) in TRACES.items():
        trace = str(full) if full.exists() else shipped
        n = rows_of(full) if full.exists() else None
        requests = ["--num-requests", str(n)] if n else []
        print(f"\n## {name}: {trace} ({n or 'all shipped'} requests) at its own rate")
        sized, tune_wall_s = stallfree(
            "tune", *DEPLOYMENT, "--lengths", trace, "--arrival", "trace", *requests, "--router", ",".join(ROUTERS),
            "--budgets", args.budget, *SLOS, "--no-progress",
        )  # fmt: skip
        print(f"tune: {len(sized['trials'])} fleet simulations in {tune_wall_s:.0f} s "
              f"({sized['backend']['workers']} workers); SLOs {sized['slos']}")  # fmt: skip
        for router in ROUTERS:
            best = sized["routers"][router]["best"]
            text = (
                f"{best['replicas']} replicas at budget {best['token_budget']}"
                if best
                else "none within the limit"
            )
            print(f"  {router:<12} fewest replicas meeting the SLOs: {text}")
        print(f"\n{args.replicas} replicas, the whole trace:")
        print(f"  {'router':<12}{'hit rate':>9}{'TTFT p50':>10}{'TTFT p99':>10}{'TBT p50':>9}{'TBT p99':>9}"
              f"{'load max/mean':>15}{'wall (s)':>10}")  # fmt: skip
        for router in ROUTERS:
            result, _ = stallfree(
                "simulate", *DEPLOYMENT, "--trace", trace, "--replicas", str(args.replicas), "--router", router,
                "--max-num-batched-tokens", args.budget.split(",")[0],
            )  # fmt: skip
            s = result["policies"]["chunked"]
            print(f"  {router:<12}{100 * s['prefix_cache_hit_rate']:>8.1f}%{s['median_ttft_ms']:>10,.0f}"
                  f"{s['p99_ttft_ms']:>10,.0f}{s['median_itl_ms']:>9.1f}{s['p99_itl_ms']:>9.1f}"
                  f"{s['load_imbalance']:>15.2f}{s['sim_wall_s']:>10.1f}")  # fmt: skip
    print(f"\n(cores: {os.cpu_count()})")


if __name__ == "__main__":
    main()
