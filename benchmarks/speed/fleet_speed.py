"""The simulator's speed where fleets need it, each run in a fresh process (``stallfree simulate``):

(a) Mooncake's whole conversation trace (12,031 requests, an hour at its own timestamps, from
    ``../shared/traces/mooncake/``; else the shipped slice) through 100 replicas of llama-3.1-8b on
    one H100 each behind the cache-aware router, priced by aiconfigurator-core's vLLM tables;
(b) 1,000 Mooncake-conversation requests at QPS 5 on one replica (H100 x TP 8), prefix cache on vs
    off: simulate()'s own time (``sim_wall_s``);
(c) a priced 5-request run end to end (interpreter start to exit), five times, with Python's
    bytecode cache on (as it is by default; this project's machines set PYTHONDONTWRITEBYTECODE).

(a) and (b) run on the pure-Python package and, with mypyc installed (``.[dev]``), again on the
optional compiled build (``make compiled``), built into a copy under the temp folder. Beside them,
``../shared/tools/pyref.py``'s fixed pure-Python loop on the same machine, so a figure from a faster
or slower machine can be scaled; and the load average before and after.

    .venv/bin/python benchmarks/speed/fleet_speed.py        # needs .[gpu] (aiconfigurator-core)
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common/ and the groups
from common.host import loadavg, machine
from fleet.mooncake_fleet import DEPLOYMENT, TRACES, stallfree

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import compiled

PYREF = Path(__file__).resolve().parents[3] / "shared" / "tools" / "pyref.py"


def simulate(*argv: str, env: dict[str, str] | None = None) -> tuple[dict, float]:
    """The first policy's summary and the process wall time."""
    result, wall_s = stallfree("simulate", *argv, env=env)
    return next(iter(result["policies"].values())), wall_s


def pyref() -> str:
    if not PYREF.exists():
        return "pyref: not here (../shared/tools/pyref.py)"
    out = subprocess.run([sys.executable, str(PYREF)], capture_output=True, text=True, check=True)
    return f"pyref {out.stdout.strip()} s"


def main() -> None:
    print(f"{machine()}; load {loadavg()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {pyref()}")
    builds: dict[str, dict[str, str] | None] = {"pure Python": None}
    if (Path(sys.executable).parent / "mypyc").exists():
        src = compiled.build_copy(Path(tempfile.gettempdir()) / "stallfree-compiled")
        builds["compiled"] = compiled.environ(src)
    full, shipped = TRACES["conversation"]
    trace = str(full) if full.exists() else shipped
    one = ["--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--tp", "8", "--lengths", "mooncake-conversation",
           "--qps", "5", "--num-requests", "1000"]  # fmt: skip
    for build, env in builds.items():
        fleet, wall_s = simulate(
            *DEPLOYMENT, "--trace", trace, "--replicas", "100", "--router", "cache-aware", env=env
        )
        rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # the largest child so far
        print(
            f"(a) {build}: 100 replicas, {fleet['completed']:,} requests ({trace}): simulate() "
            f"{fleet['sim_wall_s']:.1f} s, process {wall_s:.1f} s, peak RSS {rss_mb:.0f} MB; hit rate "
            f"{100 * fleet['prefix_cache_hit_rate']:.1f}%, median TTFT {fleet['median_ttft_ms']:,.0f} ms",
            flush=True,
        )
        on, _ = simulate(*one, "--enable-prefix-caching", env=env)
        off, _ = simulate(*one, "--no-enable-prefix-caching", env=env)
        print(
            f"(b) {build}: 1,000 requests, one replica: cache on {on['sim_wall_s']:.2f} s, off "
            f"{off['sim_wall_s']:.2f} s ({on['sim_wall_s'] / off['sim_wall_s']:.2f}x; hit rate "
            f"{100 * on['prefix_cache_hit_rate']:.1f}%)",
            flush=True,
        )
    bytecode = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    small = [simulate(*DEPLOYMENT, "--num-requests", "5", env=bytecode)[1] for _ in range(6)][1:]
    print(
        f"(c) a priced 5-request run end to end: {', '.join(f'{s:.2f}' for s in small)} s (the first of six not kept)"
    )
    print(f"load after: {loadavg()}; {pyref()}")


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()  # no options: --help
    main()
