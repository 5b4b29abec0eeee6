"""The fleet simulator checked against a real fleet: two replicas behind vllm-router, predicted per policy.

Two replicas serve ``random:medium`` (fp32, the folder ``stallfree save-model`` writes) with prefix
caching on and their default scheduler (2,048 tokens a step, 128 sequences): vLLM's CPU build
(``--server vllm``; each engine bound to a core of its own with ``VLLM_CPU_OMP_THREADS_BIND``) or
``stallfree serve`` (``--server stallfree``, one thread each). vLLM runs with ``--enable-scale-out``:
vllm-router's cache_aware matches the token ids it asks each worker for (``/v1/completions/render``,
which vLLM serves only with that flag; ``/tokenize`` where the route is absent, as on stallfree
serve); ``--no-scale-out`` starts vLLM without it, when the router gets no tokens and sends every
request to the replica with the fewest in flight, and predicts those runs with ``least-requests``.
One replica is profiled with
``stallfree profile --base-url`` (the other idle; both run the same build on a core of their own).
Then, per ``vllm-router --policy`` (round_robin, cache_aware), each through a fresh router:

(a) Poisson traffic: ``--num-requests`` 512-token prompts, 64 tokens out, at ``--load`` x twice
    the capacity the profile predicts for one replica;
(b) multi-turn chats: 8 sessions x 4 turns sharing a 1,024-token system prompt, 128-token
    messages, 32-token answers, sessions starting at 0.1/s, 2 s think time.

``stallfree validate --measured RESULT --replicas 2 --router R`` predicts the same requests
(median TTFT / TPOT / ITL, p99 ITL; the hit rate measured is the replicas' own prefix-cache
counters over the run) and ``simulate --replay`` says how many requests each replica gets. Every
run has its own seed, so no prompt finds an earlier run's blocks.

    make vllm router && .venv/bin/python benchmarks/fleet/fleet_check.py --server vllm        # ~40 min on 2 cores
    .venv/bin/python benchmarks/fleet/fleet_check.py --server vllm --no-scale-out --skip-profile
    .venv/bin/python benchmarks/fleet/fleet_check.py --server stallfree                      # ~30 min
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from stallfree.core.serving import ServingConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common/ and the groups
from common.host import loadavg as load
from common.host import machine
from common.servers import stallfree_serve, vllm_serve
from fidelity.vllm_side_by_side import (
    VLLM_DEFAULT,
    bench,
    capacity_qps,
    json_of,
    profile_server,
    saved_model,
    scheduler_flags,
)
from fleet.router_check import router

POLICIES = {"round_robin": "round-robin", "cache_aware": "cache-aware"}
KEYS = ("median_ttft_ms", "median_tpot_ms", "median_itl_ms", "p99_itl_ms")
SESSIONS = ["--scenario", "multi-turn", "--sessions", "8", "--turns", "4", "--system-prompt-tokens", "1024",
            "--lengths", "fixed:128,32", "--qps", "0.1", "--think-time-s", "2"]  # fmt: skip
STALLFREE_BLOCKS = 8192  # stallfree serve's KV blocks, fixed (vLLM's come from its log)


@contextlib.contextmanager
def replicas(server: str, model_dir: Path, out: Path, scale_out: bool) -> Iterator[tuple[list[str], int]]:
    """Two replicas of ``server``; yields their URLs and the KV blocks each has."""
    with contextlib.ExitStack() as stack:
        urls, blocks = [], []
        for core in (0, 1):
            if server == "vllm":
                env = {"VLLM_CPU_OMP_THREADS_BIND": str(core)}
                running = stack.enter_context(
                    vllm_serve(
                        model_dir,
                        ["--enable-scale-out"] if scale_out else [],
                        log=out / f"vllm-{core}.log",
                        env=env,
                    )
                )
                blocks.append((running.kv_cache_tokens or 0) // 16)
            else:
                args = ["--model", str(model_dir), "--dtype", "float32", "--device", "cpu", "--threads", "1",
                        "--token-budget", str(VLLM_DEFAULT[0]), "--max-num-seqs", str(VLLM_DEFAULT[1]),
                        "--num-blocks", str(STALLFREE_BLOCKS), "--enable-prefix-caching"]  # fmt: skip
                running = stack.enter_context(stallfree_serve(args))
                blocks.append(STALLFREE_BLOCKS)
            urls.append(running.url)
        yield urls, min(blocks)


def cell(metric: dict[str, Any], scale: float = 1.0, digits: int = 0) -> str:
    measured, predicted = metric["measured"], metric["predicted"]
    if measured is None or predicted is None:
        return "-"
    ratio = f" ({predicted / measured:.2f})" if measured else ""
    return f"{measured * scale:,.{digits}f} / {predicted * scale:,.{digits}f}{ratio}"


def check(
    base_url: str,
    out: Path,
    name: str,
    router_name: str,
    profile: Path,
    config: list[str],
    workload: list[str],
) -> dict[str, Any]:
    """One bench run through the router, then validate and simulate --replay on its requests."""
    result = out / f"bench-{name}.json"
    started, before = time.perf_counter(), load()
    measured = bench(base_url, result, *workload, "--temperature", "0")
    wall_s = time.perf_counter() - started
    fleet = ["--replicas", "2", "--router", router_name]
    body = json_of("validate", "--profile", str(profile), "--measured", str(result), *fleet, *config)
    sim = json_of("simulate", "--profile", str(profile), "--replay", str(result), *fleet, *config)
    split = [r["counters"]["requests"] if r["counters"] else None for r in measured["fleet"]["replicas"]]
    return {
        "name": name,
        "wall_s": wall_s,
        "load": f"{before} -> {load()}",
        "requests": len(measured["input_lens"]),
        "failed": measured.get("failed", 0),
        "metrics": body["policies"]["chunked"]["metrics"],
        "split_measured": split,
        "split_predicted": [r["completed"] for r in sim["policies"]["chunked"]["replicas"]],
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--server", choices=("vllm", "stallfree"), default="vllm")
    parser.add_argument("--out", type=Path, default=Path("out/fleet"))
    parser.add_argument("--model-dir", type=Path, help="the saved model (default: saved under --out)")
    parser.add_argument("--num-requests", type=int, default=60, help="(a)'s Poisson requests")
    parser.add_argument(
        "--load", type=float, default=0.65, help="(a): share of the fleet's predicted capacity"
    )
    parser.add_argument("--skip-profile", action="store_true", help="reuse the profile under --out")
    parser.add_argument("--workloads", default="poisson,sessions")
    parser.add_argument(
        "--no-scale-out", action="store_true",
        help="vLLM without --enable-scale-out: cache_aware predicted as least-requests (results under --out/vllm-plain)",
    )  # fmt: skip
    args = parser.parse_args()
    plain = args.no_scale_out and args.server == "vllm"
    out: Path = args.out / ("vllm-plain" if plain else args.server)
    out.mkdir(parents=True, exist_ok=True)
    model_dir = saved_model(argparse.Namespace(model_dir=args.model_dir, out=args.out))
    profile = args.out / args.server / "replica.profile.json"  # one profile for both vLLM setups
    profile.parent.mkdir(parents=True, exist_ok=True)
    rows = [f"machine: {machine()}, load {load()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
            f"two {args.server} replicas{' without --enable-scale-out' if plain else ''} of {model_dir} behind vllm-router"]  # fmt: skip
    runs: list[dict[str, Any]] = []
    with replicas(args.server, model_dir, out, scale_out=not plain) as (urls, num_blocks):
        if not (args.skip_profile and profile.exists()):
            profile_server(urls[0], profile, model_dir)
        settings = json.loads(profile.read_text())["settings"]
        rows.append(f"profile of replica 0: {settings['elapsed_s']:.0f} s, reference drift "
                    f"{settings.get('reference_drift')}; {num_blocks} KV blocks a replica")  # fmt: skip
        serving_config = ServingConfig(max_num_batched_tokens=VLLM_DEFAULT[0], max_num_seqs=VLLM_DEFAULT[1],
                                       num_blocks=num_blocks)  # fmt: skip
        config = [*scheduler_flags(serving_config), "--enable-prefix-caching"]
        qps = args.load * 2 * capacity_qps(profile, serving_config, "fixed:512,64")
        workloads = {
            "poisson": [
                "--scenario",
                "poisson",
                "--qps",
                f"{qps:.4f}",
                "--lengths",
                "fixed:512,64",
                "--num-requests",
                str(args.num_requests),
            ],
            "sessions": SESSIONS,
        }
        chosen = args.workloads.split(",")
        rows.append(f"(a) {' '.join(workloads['poisson'])}; (b) {' '.join(SESSIONS)}")
        for seed, (workload, policy) in enumerate((w, p) for w in chosen for p in POLICIES):
            with router(urls, policy) as base_url:
                predicted_as = "least-requests" if plain and policy == "cache_aware" else POLICIES[policy]
                entry = check(base_url, out, f"{workload}-{policy}", predicted_as, profile, config,
                              [*workloads[workload], "--seed", str(100 + seed)])  # fmt: skip
            entry |= {"workload": workload, "policy": policy, "predicted_as": predicted_as}
            runs.append(entry)
            print(json.dumps(entry), file=sys.stderr, flush=True)
    (out / "fleet-check.json").write_text(json.dumps(runs, indent=2))
    rows += [
        "",
        "| workload | policy (predicted as) | median TTFT ms (meas / pred) | median TPOT ms | median ITL ms | p99 ITL ms | "
        "hit rate % | requests per replica (meas / pred) | wall s | load |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        m = run["metrics"]
        hits = cell(m["prefix_cache_hit_rate"], 100, 1) if "prefix_cache_hit_rate" in m else "-"
        cells = [cell(m[k]) for k in KEYS]
        rows.append(f"| {run['workload']} | {run['policy']} ({run['predicted_as']}) | " + " | ".join(cells) + f" | {hits} | "
                    f"{run['split_measured']} / {run['split_predicted']} | {run['wall_s']:.0f} | {run['load']} |")  # fmt: skip
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
