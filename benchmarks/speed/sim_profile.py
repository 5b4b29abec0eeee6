"""Where a simulation's time goes: cProfile over three runs, its own time grouped by part.

1. 10,000 arXiv requests, Llama-3-8B on one A100 priced by Vidur's tables (``--cost-model
   measured``), chunked 512, QPS 2 (the run `vidur_side_by_side.py` times);
2. 1,000 Mooncake conversation requests with the prefix cache (llama-3.1-8b, H100 x TP 8, QPS 5);
3. a fleet: 16 replicas of llama-3.1-8b on H100 (aiconfigurator's vLLM tables), cache-aware
   router, 3,000 Mooncake conversation requests at QPS 40.

Each part is the functions of some modules (their own time, callees excluded, built-ins such as
``dict.get`` charged to their callers): the scheduler
(core: policy, plan building, steady runs), the KV blocks and prefix cache (core.block_manager),
step pricing (costs), the driver and records (sim), numpy (called by any of them), start-up
(imports, reading traces and tables) and the rest. cProfile charges every Python call, so the
Python-heavy parts look larger than they are; the whole-run wall time is printed beside it.

    .venv/bin/python benchmarks/speed/sim_profile.py
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import sys
import time

from stallfree.cli import main

RUNS = {
    "10K arXiv, A100, Vidur's tables": [
        "--model", "llama-3-8b", "--hardware", "a100-80gb", "--cost-model", "measured",
        "--lengths", "arxiv", "--qps", "2", "--num-requests", "10000", "--token-budget", "512",
        "--max-num-seqs", "128",
    ],
    "1K Mooncake, prefix cache": [
        "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--tp", "8", "--lengths",
        "mooncake-conversation", "--qps", "5", "--num-requests", "1000", "--enable-prefix-caching",
    ],
    "16-replica fleet, 3K Mooncake": [
        "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--cost-model", "measured", "--framework",
        "vllm", "--lengths", "mooncake-conversation", "--qps", "40", "--num-requests", "3000",
        "--replicas", "16", "--router", "cache-aware",
    ],
}  # fmt: skip

PARTS = [  # (part, path fragments of its modules), first match wins
    ("KV blocks, prefix cache", ("stallfree/core/block_manager",)),
    ("scheduler", ("stallfree/core/",)),
    ("step pricing", ("stallfree/costs/",)),
    ("driver, records", ("stallfree/sim/", "stallfree/metrics")),
    ("numpy", ("numpy",)),
    ("start-up", ("<frozen", "importlib", "stallfree/workload", "stallfree/cli", "json", "csv", "gzip")),
]


def part_of(filename: str) -> str:
    return next((part for part, where in PARTS if any(w in filename for w in where)), "rest")


def profile(argv: list[str]) -> tuple[float, float, dict[str, float]]:
    """Wall time of the plain run, the profiled run's total, and its own time by part."""
    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        main(["simulate", *argv])
    wall_s = time.perf_counter() - started
    profiler = cProfile.Profile()
    with contextlib.redirect_stdout(io.StringIO()):
        profiler.runcall(main, ["simulate", *argv])
    parts: dict[str, float] = {}
    for (filename, _, _), row in pstats.Stats(profiler).stats.items():  # type: ignore[attr-defined]
        if filename != "~":
            parts[part_of(filename)] = parts.get(part_of(filename), 0.0) + row[2]
            continue
        for (caller, _, _), calls in row[4].items():  # a built-in (dict.get, len): its callers' part
            parts[part_of(caller)] = parts.get(part_of(caller), 0.0) + calls[2]
    return wall_s, sum(parts.values()), parts


def report() -> int:
    names = [p for p, _ in PARTS] + ["rest"]
    print("| run | wall (s) | profiled (s) | " + " | ".join(names) + " |")
    print("|---|---:|---:|" + "---:|" * len(names))
    for label, argv in RUNS.items():
        wall_s, total_s, parts = profile(argv)
        shares = " | ".join(f"{100 * parts.get(n, 0.0) / total_s:.0f}%" for n in names)
        print(f"| {label} | {wall_s:.2f} | {total_s:.2f} | {shares} |", flush=True)
    return 0


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()  # no options: --help
    sys.exit(report())
