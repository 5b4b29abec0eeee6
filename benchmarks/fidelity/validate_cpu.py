"""Profile the engine on this machine and check the measured cost model against real runs.

For each dtype (bf16, fp32): ``stallfree profile --model random:medium``, then
``stallfree validate`` (the real engine in process vs the simulator with the profile) on
Poisson arrivals with 512-token prompts and 64-token outputs, chunked (budget 64) and
prefill-first (its prompts batched up to the context, not the budget; both at most 64 running
requests), at ``--load`` (default 0.65) x the capacity the measured model predicts for
the slower policy (all requests at once: completed / duration). Prints per-step errors and
end-to-end ratios as markdown rows, with the machine's load average around each phase, and
keeps every JSON under ``--out``. Run on a quiet machine: timings are the measurement.

    .venv/bin/python benchmarks/fidelity/validate_cpu.py                       # ~25-35 min on 2 cores
    .venv/bin/python benchmarks/fidelity/validate_cpu.py --dtypes bf16 --num-requests 60
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from stallfree.core.serving import ServingConfig
from stallfree.costs.choice import CostChoice
from stallfree.plots.validate import plot_validation
from stallfree.validate import ValidationOptions, machine_summary, validate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common/
from common.cli import stallfree
from common.host import loadavg as load

DTYPES = {"bf16": "bfloat16", "fp32": "float32"}
LENGTHS = "fixed:512,64"
BUDGET = 64


def serving(policy: str) -> ServingConfig:
    """Chunked at a budget of ``BUDGET`` tokens; the whole-prompt policies batch prompts up to the
    context; both run at most ``BUDGET`` requests."""
    budget = BUDGET if policy == "chunked" else None
    return ServingConfig(policy=policy, max_num_batched_tokens=budget, max_num_seqs=BUDGET)


def capacity_qps(profile: Path, policy: str, num_requests: int) -> float:
    """Requests per second the measured model says the engine sustains, all arriving at once."""
    from stallfree.sim import Deployment, simulate
    from stallfree.workload import WorkloadOptions, workload_from_options

    workload = workload_from_options(WorkloadOptions(arrival="all-at-once", lengths=LENGTHS))
    result = simulate(
        workload,
        Deployment(costs=CostChoice(kind="full", profile=str(profile)), serving=serving(policy)),
        num_requests=num_requests,
    )
    return float(result.summary["request_throughput"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("out/validate-cpu"))
    parser.add_argument("--dtypes", default="bf16,fp32")
    parser.add_argument("--num-requests", type=int, default=150, help="bf16 run (fp32 runs a third)")
    parser.add_argument("--load", type=float, default=0.65, help="share of the predicted capacity")
    parser.add_argument("--skip-profile", action="store_true", help="reuse the profiles under --out")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[str] = []
    for dtype in args.dtypes.split(","):
        profile = args.out / f"medium-{dtype}.profile.json"
        before = load()
        started = time.perf_counter()
        if not (args.skip_profile and profile.exists()):
            stallfree(
                "profile",
                "--model",
                "random:medium",
                "--dtype",
                DTYPES[dtype],
                "--out",
                str(profile),
                "--no-progress",
            )
        profile_s = time.perf_counter() - started
        rows.append(f"profile {dtype}: {profile_s:.0f} s, load {before} -> {load()}")
        capacity = min(capacity_qps(profile, p, 60) for p in ("chunked", "prefill-first"))
        qps = round(args.load * capacity, 3)
        num_requests = args.num_requests if dtype == "bf16" else max(20, args.num_requests // 3)
        before = load()
        started = time.perf_counter()
        # In process, through the library: one `stallfree validate --token-budget` would cap
        # prefill-first's prompt batches at the chunked budget too.
        options = ValidationOptions(
            profile=str(profile), servings=(serving("chunked"), serving("prefill-first")), qps=qps,
            lengths=LENGTHS, num_requests=num_requests, step_noise=True,
        )  # fmt: skip
        print(
            f"validate: {profile}, {qps} QPS, {num_requests} requests, in process",
            file=sys.stderr,
            flush=True,
        )
        result = validate(options)
        validate_s = time.perf_counter() - started
        plots = [str(path) for path in plot_validation(result, args.out / f"plots-{dtype}")]
        body: dict[str, Any] = result.to_json(plots)
        body["bench"] = {"capacity_qps": capacity, "qps": qps, "load_before": before, "load_after": load(),
                         "wall_s": validate_s}  # fmt: skip
        (args.out / f"validate-{dtype}.json").write_text(json.dumps(body, indent=2))
        rows.append(
            f"validate {dtype}: predicted capacity {capacity:.3f} req/s, run at {qps} QPS, "
            f"{num_requests} requests, {validate_s:.0f} s, load {before} -> {load()}"
        )
        for policy_run in result.policies:
            policy = policy_run.policy
            r = body["policies"][policy]
            s, m = r["per_step"], r["metrics"]
            rows.append(
                f"| {dtype} | {policy} | {s['num_steps']} | {s['median_abs_error']:.1%} | {s['p90_abs_error']:.1%} "
                f"| {s['median_error']:+.1%} | "
                + " | ".join(
                    f"{m[k]['measured']:.1f} / {m[k]['predicted']:.1f} ({m[k]['ratio']:.2f}; noise "
                    f"{m[k]['with_noise_ratio']:.2f}; run speed {m[k]['at_run_speed_ratio']:.2f})"
                    for k in ("median_ttft_ms", "median_tpot_ms", "p99_itl_ms", "max_itl_ms")
                )
                + " |"
            )
            if policy_run.machine:  # the profile's reference steps after this run vs when profiled
                rows.append(f"  reference steps, {policy}: {machine_summary(policy_run.machine)}")
        if "ordering" in body:
            rows.append(f"ordering {dtype}: {body['ordering']}")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
