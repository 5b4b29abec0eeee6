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

import resource
import subprocess
import sys
import time
from pathlib import Path

from llama_cpp_side_by_side import loadavg, machine
from mooncake_fleet import DEPLOYMENT, TRACES, stallfree

PYREF = Path(__file__).resolve().parent.parent.parent / "shared" / "tools" / "pyref.py"


def simulate(*argv: str) -> tuple[dict, float]:
    """The first policy's summary and the process wall time."""
    result, wall_s = stallfree("simulate", *argv)
    return next(iter(result["policies"].values())), wall_s


def pyref() -> str:
    if not PYREF.exists():
        return "pyref: not here (../shared/tools/pyref.py)"
    out = subprocess.run([sys.executable, str(PYREF)], capture_output=True, text=True, check=True)
    return f"pyref {out.stdout.strip()} s"


def main() -> None:
    print(f"{machine()}; load {loadavg()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {pyref()}")
    full, shipped = TRACES["conversation"]
    trace = str(full) if full.exists() else shipped
    fleet, wall_s = simulate(*DEPLOYMENT, "--trace", trace, "--replicas", "100", "--router", "cache-aware")
    # the largest child so far: (a) (pyref's is a few MB)
    rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(
        f"(a) 100 replicas, {fleet['completed']:,} requests ({trace}): simulate() {fleet['sim_wall_s']:.1f} s, "
        f"process {wall_s:.1f} s, peak RSS {rss_mb:.0f} MB; hit rate {100 * fleet['prefix_cache_hit_rate']:.1f}%, "
        f"median TTFT {fleet['median_ttft_ms']:,.0f} ms"
    )
    one = ["--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--tp", "8", "--lengths", "mooncake-conversation",
           "--qps", "5", "--num-requests", "1000"]  # fmt: skip
    on, _ = simulate(*one, "--enable-prefix-caching")
    off, _ = simulate(*one, "--no-enable-prefix-caching")
    print(
        f"(b) 1,000 requests, one replica: cache on {on['sim_wall_s']:.2f} s, off {off['sim_wall_s']:.2f} s "
        f"({on['sim_wall_s'] / off['sim_wall_s']:.2f}x; hit rate {100 * on['prefix_cache_hit_rate']:.1f}%)"
    )
    _, small_s = simulate(*DEPLOYMENT, "--num-requests", "5")
    print(f"(c) a priced 5-request run: {small_s:.2f} s end to end")
    print(f"load after: {loadavg()}; {pyref()}")


if __name__ == "__main__":
    main()
