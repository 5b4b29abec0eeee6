"""A day of Mooncake-like traffic through an autoscaled fleet: how long the simulator takes.

Lengths and prefix hashes from Mooncake's conversation trace (the shipped slice's rows drawn with
replacement), arrivals at a cosine day whose mean is the trace's own hourly rate (peak 5.0, trough
1.7 requests/s: about 290,000 requests in 24 h), llama-3.1-8b on H100s priced by the measured
tables, behind the cache-aware router; KEDA's rule on waiting requests between 2 and 24 replicas,
two-minute start-ups. Each build runs in a fresh process (``stallfree simulate``): the pure-Python
package and, with mypyc installed (``.[dev]``), the compiled build in a copy under the temp folder.
The fixed fleet of 24 on the same requests beside it (the autoscaled path must not slow it).

    .venv/bin/python benchmarks/speed/day_speed.py [--hours 24] [--builds pure,compiled]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common/ and the groups
from common.host import loadavg, machine
from fleet.mooncake_fleet import stallfree

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import compiled

DAY = ["--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--cost-model", "measured", "--framework", "vllm"]
DAY += ["--lengths", "mooncake-conversation", "--lengths-sampling", "with-replacement"]
DAY += ["--router", "cache-aware", "--token-budget", "2048", "--goodput", "ttft:2000", "tpot:50"]
AUTOSCALE = [
    "--autoscale",
    "keda:waiting=8",
    "--min-replicas",
    "2",
    "--max-replicas",
    "24",
    "--startup-s",
    "120",
]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hours", type=float, default=24.0, help="the day's length (default 24)")
    parser.add_argument("--builds", default="pure,compiled", help="pure, compiled or both (default both)")
    args = parser.parse_args()
    print(f"{machine()}; load {loadavg()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    profile = ["--rate-profile", f"diurnal:5.0,1.7,{args.hours:g}"]
    builds = {}
    if "pure" in args.builds:
        builds["pure Python"] = None
    if "compiled" in args.builds and (Path(sys.executable).parent / "mypyc").exists():
        src = compiled.build_copy(Path(tempfile.gettempdir()) / "stallfree-compiled")
        builds["compiled"] = compiled.environ(src)
    for name, env in builds.items():
        for label, extra in (("autoscaled 2-24", AUTOSCALE), ("fixed 24", ["--replicas", "24"])):
            out, wall_s = stallfree("simulate", *DAY, *profile, *extra, env=env)
            s = next(iter(out["policies"].values()))
            scale = s.get("autoscale")
            hours = (
                f"{scale['gpu_hours']:,.1f} GPU-hours, {scale['num_replicas_started']} replicas started"
                if scale
                else f"{24 * s['duration'] / 3600:,.1f} GPU-hours"
            )
            print(
                f"{name:>12} {label:<16} {s['completed'] + s['rejected']:>8,} requests, simulate() "
                f"{s['sim_wall_s']:6.1f} s (process {wall_s:6.1f} s); {hours}; P99 TTFT "
                f"{s['p99_ttft_ms']:,.0f} ms, SLOs met {s['request_goodput'] / s['request_throughput']:.1%}; "
                f"load {loadavg()}"
            )


if __name__ == "__main__":
    main()
