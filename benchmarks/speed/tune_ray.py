"""``stallfree tune`` on a Ray cluster vs the local process pool: the same trials, the same answer,
and what Ray costs a trial.

A local Ray cluster of ``--nodes`` nodes (``ray.cluster_utils.Cluster``: a head and worker raylets,
each its own processes, ``--cpus-per-node`` task slots each) stands in for a real one; ``stallfree
tune --backend ray --address HEAD`` runs its trials there, as it would on a cluster started with
``ray start --head`` / ``ray start --address HEAD``. The same search also runs on the local pool
(``--backend local``, one worker a core). Both outputs must be equal but for wall time and the
backend; the wall times, the trials and the 1-minute load before each run are printed.

    .venv/bin/python benchmarks/speed/tune_ray.py                       # tune's default search (~2 min)
    .venv/bin/python benchmarks/speed/tune_ray.py --fleet               # + a fleet tune (--router)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TUNE = [
    "tune",
    "--model",
    "mistral-7b",
    "--hardware",
    "a100-80gb",
    "--lengths",
    "sharegpt",
    "--cost-model",
    "full",
]
FLEET = ["tune", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--cost-model", "full", "--lengths",
         "sharegpt", "--qps", "40", "--router", "round-robin,least-requests", "--budgets", "512,2048",
         "--slo-ttft-p99-ms", "2000", "--num-requests", "1000"]  # fmt: skip


def run(argv: list[str], *backend: str) -> tuple[dict[str, Any], float]:
    stallfree = str(Path(sys.executable).parent / "stallfree")
    started = time.perf_counter()
    done = subprocess.run(
        [stallfree, *argv, *backend, "--json", "--no-progress"], capture_output=True, text=True
    )
    wall_s = time.perf_counter() - started
    if done.returncode not in (0, 1):  # 1: no budget met the SLOs, still an answer
        raise SystemExit(f"stallfree {' '.join(argv)} {' '.join(backend)} failed:\n{done.stderr}")
    out: dict[str, Any] = json.loads(done.stdout)
    return out, wall_s


def answer(out: dict[str, Any]) -> str:
    """The output without what differs by design (wall time, the backend)."""
    kept = {k: v for k, v in out.items() if k not in ("wall_s", "backend")}
    return json.dumps(kept, sort_keys=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--cpus-per-node", type=int, default=1)
    parser.add_argument("--fleet", action="store_true", help="also a fleet tune (--qps 40 --router ...)")
    args = parser.parse_args()
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": args.cpus_per_node})
    for _ in range(args.nodes - 1):
        cluster.add_node(num_cpus=args.cpus_per_node)
    slots = args.nodes * args.cpus_per_node
    print(
        f"{os.cpu_count()} cores; Ray cluster of {args.nodes} nodes x {args.cpus_per_node} task slots at {cluster.address}"
    )
    try:
        for name, argv in (
            ("tune (default search)", TUNE),
            *((("tune --router (fleet)", FLEET),) if args.fleet else ()),
        ):
            rows = []
            outs = []
            for backend in (
                ["--backend", "local", "--workers", str(slots)],
                ["--backend", "ray", "--address", cluster.address],
            ):
                load = os.getloadavg()[0]
                out, wall_s = run(argv, *backend)
                outs.append(out)
                rows.append((backend[1], len(out["trials"]), wall_s, load))
            same = answer(outs[0]) == answer(outs[1])
            print(f"\n{name}: the same answer on both: {same}")
            for label, trials, wall_s, load in rows:
                print(
                    f"  {label:<6} {trials:>4} trials  {wall_s:6.1f} s wall  {1000 * wall_s / trials:6.1f} ms a trial  (load before {load:.2f})"
                )
            (_, _, local_s, _), (_, trials, ray_s, _) = rows
            print(f"  Ray's cost a trial over the local pool: {1000 * (ray_s - local_s) / trials:+.1f} ms")
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    main()
