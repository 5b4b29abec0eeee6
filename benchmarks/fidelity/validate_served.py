"""The measured cost model against a served run: ``stallfree serve`` + ``stallfree bench``.

``validate_cpu.py`` checks the simulator against the engine in process. This is the same check
through HTTP, as a user checks a prediction against their own server: profile the engine with
the thread count the server gives it (``serve --threads``; here every core but one, so that
the client and the event loop have a core and the served steps run as the profile measured them:
with both of 2 cores they ran 1.7x slower than profiled alone), start
``stallfree serve`` with one scheduler configuration, drive it with ``stallfree bench`` (Poisson
arrivals, 512-token prompts, 64-token outputs, greedy, ``--save-result``), then ``stallfree
validate --measured RESULT.json`` replays the recorded requests (arrival times and the lengths
the server counted) through the simulator with the profile, and prices every served step of the
server's ``--step-log`` (per-step error; the steps' share of the run's wall time says how much the
server path adds around them); ``--step-noise`` adds the prediction with each step varied as
the profiled machine's steps varied (the ratios after ``noise``), and the ratios after ``run
speed`` are the simulation with each kind of step priced at the speed the served steps ran (a
check of the simulator with the machine's drift taken out, not a prediction). Per policy, at ``--load`` x
the capacity the profile predicts for the slower policy. Run on a quiet machine.

    .venv/bin/python benchmarks/fidelity/validate_served.py                    # ~10 min on 2 cores
    .venv/bin/python benchmarks/fidelity/validate_served.py --skip-profile --num-requests 60
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common/ and the groups
from common.cli import stallfree
from common.host import loadavg as load
from common.servers import stallfree_serve
from fidelity.validate_cpu import BUDGET, DTYPES, LENGTHS, capacity_qps

NUM_BLOCKS = 6000  # the in-process engine's sizing for random:medium, fixed on both sides
KEYS = ("median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "median_itl_ms", "p99_itl_ms", "max_itl_ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("out/validate-served"))
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    parser.add_argument("--num-requests", type=int, default=150)
    parser.add_argument("--load", type=float, default=0.65, help="share of the predicted capacity")
    parser.add_argument("--qps", type=float, help="offered load (default: --load x the predicted capacity)")
    parser.add_argument("--threads", type=int, default=max(1, len(os.sched_getaffinity(0)) - 1))
    parser.add_argument("--policies", default="chunked,prefill-first")
    parser.add_argument("--skip-profile", action="store_true", help="reuse the profile under --out")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    profile = args.out / f"medium-{args.dtype}-{args.threads}t.profile.json"
    rows = [f"machine: {os.cpu_count()} CPUs, engine threads {args.threads}, load {load()}"]
    if not (args.skip_profile and profile.exists()):
        started = time.perf_counter()
        stallfree("profile", "--model", "random:medium", "--dtype", DTYPES[args.dtype],
                  "--threads", str(args.threads), "--out", str(profile), "--no-progress")  # fmt: skip
        rows.append(f"profile: {time.perf_counter() - started:.0f} s, load now {load()}")
    policies = args.policies.split(",")
    capacity = min(capacity_qps(profile, p, 60) for p in policies)
    qps = args.qps or round(args.load * capacity, 3)
    rows.append(f"predicted capacity {capacity:.3f} req/s; offered {qps} QPS, {args.num_requests} requests")
    for policy in policies:
        budget = ["--token-budget", str(BUDGET)] if policy == "chunked" else []
        scheduler = [
            "--policy",
            policy,
            *budget,
            "--max-num-seqs",
            str(BUDGET),
            "--num-blocks",
            str(NUM_BLOCKS),
        ]
        result = args.out / f"bench-{policy}.json"
        steps = args.out / f"steps-{policy}.jsonl"
        steps.unlink(missing_ok=True)
        before, started = load(), time.perf_counter()
        serve_args = ["--model", "random:medium", "--dtype", DTYPES[args.dtype], "--device", "cpu",
                      "--threads", str(args.threads), *scheduler, "--step-log", str(steps)]  # fmt: skip
        with stallfree_serve(serve_args) as server:
            stallfree("bench", "--base-url", server.url, "--scenario", "poisson", "--qps", str(qps),
                      "--lengths", LENGTHS, "--num-requests", str(args.num_requests), "--seed", "0",
                      "--temperature", "0", "--save-result", str(result), "--no-progress")  # fmt: skip
        bench_s = time.perf_counter() - started
        out = stallfree("validate", "--profile", str(profile), "--measured", str(result), *scheduler,
                        "--step-log", str(steps), "--step-noise", "--json", capture=True)  # fmt: skip
        body: dict[str, Any] = json.loads(out)
        body["bench"] = {"qps": qps, "capacity_qps": capacity, "load_before": before, "load_after": load(),
                         "wall_s": bench_s}  # fmt: skip
        (args.out / f"validate-{policy}.json").write_text(json.dumps(body, indent=2))
        r = body["policies"][policy]
        m, ps = r["metrics"], r["per_step"]
        rows.append(
            f"| {args.dtype} | {policy} | {r['completed']['measured']} | "
            + " | ".join(
                f"{m[k]['measured']:.1f} / {m[k]['predicted']:.1f} ({m[k]['ratio']:.2f}; noise "
                f"{m[k]['with_noise_ratio']:.2f}; run speed {m[k]['at_run_speed_ratio']:.2f})"
                for k in KEYS
            )
            + f" | {ps['median_abs_error']:.1%} / {ps['p90_abs_error']:.1%} ({ps['median_error']:+.1%}) "
            f"| steps {ps['measured_step_s_total']:.1f} s of {m['duration']['measured']:.1f} s "
            f"| {bench_s:.0f} s, load {before} -> {load()} |"
        )
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
