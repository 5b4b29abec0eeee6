"""The simulator's speed where fleets need it, each run in a fresh process (``stallfree simulate``):

(a) Mooncake's whole conversation trace (12,031 requests, an hour at its own timestamps, from
    ``../shared/traces/mooncake/``; else the shipped slice) through 100 replicas of llama-3.1-8b on
    one H100 each behind the cache-aware router, priced by aiconfigurator-core's vLLM tables;
(b) 1,000 Mooncake-conversation requests at QPS 5 on one replica (H100 x TP 8), prefix cache on vs
    off: simulate()'s own time (``sim_wall_s``);
(c) a priced 5-request run end to end (interpreter start to exit).

Beside them, ``../shared/tools/pyref.py``'s fixed pure-Python loop on the same machine, so a
figure from a faster or slower machine can be scaled; and the load average before and after.

    .venv/bin/python benchmarks/fleet_speed.py        # needs .[gpu] (aiconfigurator-core)
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from llama_cpp_side_by_side import loadavg, machine

ROOT = Path(__file__).resolve().parent.parent
STALLFREE = ROOT / ".venv" / "bin" / "stallfree"
PYREF = ROOT.parent / "shared" / "tools" / "pyref.py"
FULL = ROOT.parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"
PRICED = [
    "--model",
    "llama-3.1-8b",
    "--hardware",
    "h100-sxm",
    "--cost-model",
    "measured",
    "--framework",
    "vllm",
]


def simulate(*argv: str) -> tuple[dict, float, float]:
    """The first policy's summary, the process wall time and its peak RSS (MB)."""
    started = time.perf_counter()
    done = subprocess.run(
        ["/usr/bin/time", "-f", "%M", str(STALLFREE), "simulate", *argv, "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    wall_s = time.perf_counter() - started
    rss_mb = int(done.stderr.strip().splitlines()[-1]) / 1024
    summary = next(iter(json.loads(done.stdout)["policies"].values()))
    return summary, wall_s, rss_mb


def pyref() -> str:
    if not PYREF.exists():
        return "pyref: not here (../shared/tools/pyref.py)"
    out = subprocess.run([sys.executable, str(PYREF)], capture_output=True, text=True, check=True)
    return f"pyref {out.stdout.strip()} s"


def main() -> None:
    print(f"{machine()}; load {loadavg()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {pyref()}")
    trace = str(FULL) if FULL.exists() else "mooncake-conversation"
    fleet, wall_s, rss_mb = simulate(
        *PRICED, "--trace", trace, "--replicas", "100", "--router", "cache-aware"
    )
    print(
        f"(a) 100 replicas, {fleet['completed']:,} requests ({trace}): simulate() {fleet['sim_wall_s']:.1f} s, "
        f"process {wall_s:.1f} s, peak RSS {rss_mb:.0f} MB; hit rate {100 * fleet['prefix_cache_hit_rate']:.1f}%, "
        f"median TTFT {fleet['median_ttft_ms']:,.0f} ms"
    )
    one = ["--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--tp", "8", "--lengths", "mooncake-conversation",
           "--qps", "5", "--num-requests", "1000"]  # fmt: skip
    on, _, _ = simulate(*one, "--enable-prefix-caching")
    off, _, _ = simulate(*one, "--no-enable-prefix-caching")
    print(
        f"(b) 1,000 requests, one replica: cache on {on['sim_wall_s']:.2f} s, off {off['sim_wall_s']:.2f} s "
        f"({on['sim_wall_s'] / off['sim_wall_s']:.2f}x; hit rate {100 * on['prefix_cache_hit_rate']:.1f}%)"
    )
    _, small_s, _ = simulate(*PRICED, "--num-requests", "5")
    print(f"(c) a priced 5-request run: {small_s:.2f} s end to end")
    print(f"load after: {loadavg()}; {pyref()}")


if __name__ == "__main__":
    main()
