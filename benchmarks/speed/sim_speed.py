"""Speed and memory of ``stallfree simulate``: the arXiv trace at QPS 2 (Poisson, seed 0),
Llama-3-8B on one A100-80GB, chunked with a 512-token budget, full cost model (the recorded
figures' model; ``--cost-model measured`` times the GPU measured model on the same run).

Each size runs in a fresh Python process, so its peak RSS (``resource.getrusage``) is its own.
Prints one row per size: process wall time (interpreter start to exit), the wall and CPU time
inside ``simulate()`` (sampling the workload, simulating, summarising; CPU time is the honest
figure when other processes share the cores), peak RSS, steps, ITL entries kept, p99 and max ITL.

    .venv/bin/python benchmarks/speed/sim_speed.py                 # 10,000 and 100,000 requests
    .venv/bin/python benchmarks/speed/sim_speed.py --sizes 10000 --policy prefill-first
    .venv/bin/python benchmarks/speed/sim_speed.py --step-by-step  # the slow reference path
    .venv/bin/python benchmarks/speed/sim_speed.py --sizes 10000 --cost-model measured  # Vidur's A100 tables
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

STARTED = time.perf_counter()


def one(
    num_requests: int, policy: str, fast: bool, cost_model: str, prefix_caching: bool = True
) -> dict[str, float]:
    import resource

    from stallfree.core.serving import ServingConfig
    from stallfree.costs import CostChoice
    from stallfree.sim import Deployment, simulate
    from stallfree.workload import TraceLengths, Workload, poisson

    workload = Workload(poisson(2.0), TraceLengths("arxiv"))
    began = time.perf_counter()
    began_cpu = time.process_time()
    result = simulate(
        workload,
        Deployment(
            costs=CostChoice(model="llama-3-8b", hardware="a100-80gb", kind=cost_model),
            serving=ServingConfig(policy=policy, enable_prefix_caching=prefix_caching),
        ),
        num_requests=num_requests,
        seed=0,
        fast=fast,
    )
    simulate_s = time.perf_counter() - began
    simulate_cpu_s = time.process_time() - began_cpu
    s = result.summary
    return {
        "num_requests": num_requests,
        "simulate_s": simulate_s,
        "simulate_cpu_s": simulate_cpu_s,
        "process_s": time.perf_counter() - STARTED,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "num_steps": s["num_steps"],
        "completed": s["completed"],
        "p99_itl_ms": s["p99_itl_ms"],
        "max_itl_ms": s["max_itl_ms"],
        "p99_ttft_ms": s["p99_ttft_ms"],
        "itl_entries": result.itl.num_entries,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="10000,100000", help="comma list of request counts")
    parser.add_argument("--policy", default="chunked")
    parser.add_argument("--step-by-step", action="store_true", help="schedule every step (no steady runs)")
    parser.add_argument(
        "--cost-model",
        choices=("full", "weights-only", "measured", "auto"),
        default="full",
        help="default full",
    )
    parser.add_argument(
        "--no-enable-prefix-caching",
        dest="prefix_caching",
        action="store_false",
        help="simulate without the prefix cache (on by default, as in vLLM; arXiv prompts share nothing)",
    )
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(
            json.dumps(
                one(args.child, args.policy, not args.step_by_step, args.cost_model, args.prefix_caching)
            )
        )
        return
    print(
        "| requests | process wall (s) | simulate() wall (s) | simulate() CPU (s) | peak RSS (MB) | steps "
        "| ITL entries | p99 ITL (ms) | max ITL (ms) |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for size in (int(x) for x in args.sizes.split(",")):
        cmd = [sys.executable, __file__, "--child", str(size), "--policy", args.policy]
        cmd += ["--cost-model", args.cost_model]
        if args.step_by_step:
            cmd.append("--step-by-step")
        if not args.prefix_caching:
            cmd.append("--no-enable-prefix-caching")
        began = time.perf_counter()
        row = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        wall_s = time.perf_counter() - began
        print(
            f"| {size:,} | {wall_s:.2f} | {row['simulate_s']:.2f} | {row['simulate_cpu_s']:.2f} "
            f"| {row['peak_rss_mb']:.0f} | {row['num_steps']:,} "
            f"| {row['itl_entries']:,} | {row['p99_itl_ms']:.2f} | {row['max_itl_ms']:.1f} |"
        )


if __name__ == "__main__":
    main()
