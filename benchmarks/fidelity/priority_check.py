"""Priority scheduling checked on real servers: chats at priority 0 beside batch prompts at
priority 10, the server under ``--scheduling-policy fcfs`` and ``priority``, each class's medians
measured and predicted on the same requests. ``--server vllm`` (vLLM's CPU build; ``make vllm``
builds it in ``.venv-vllm``) or ``--server stallfree`` (``stallfree serve``, the engine, on one
thread as vLLM's CPU worker binds one core: on both of 2 cores the client and the HTTP path slow
its served steps well below the profile's).

1. saves a random-weight model (``--model``, fp32) and starts the server on it at ``--budget``
   tokens a step (512: a batch prompt's 1,536 tokens in three chunks) and vLLM's 128 sequences,
   with ``--scheduling-policy fcfs``;
2. profiles it as a black box (``stallfree profile --base-url``, decode points up to
   ``--profile-seqs`` streams; reused with ``--skip-profile``);
3. sizes the mix to ``--load`` x the highest rate the profile says it serves without a queue
   building up (the classes' rates scaled together). The default, 2, is a queue that grows all
   run, which is when the policy decides who waits, and where a price error moves the queue
   less than near capacity: at load L a step priced e% off moves the time spent queued by about
   L / (L - 1) x e%, 5x at 1.25 and 2x at 2;
4. for fcfs, then priority (vLLM restarted with ``--scheduling-policy priority``): ``stallfree bench
   --scenario classes`` (every request with its class's ``priority`` field, greedy, a fresh prompt
   text each run so vLLM's prefix cache holds none of it), then ``stallfree validate --measured``
   predicts the run per class: the same requests (arrivals, the lengths the server counted,
   priorities) simulated with the profile under the same policy (its report:
   ``validate-POLICY.txt``); ``stallfree serve`` keeps a step log of each run
   (``stallfree-POLICY.steps.jsonl``: ``validate --step-log`` gives the served steps' error);
5. prints, per policy and class, measured / predicted (ratio) of median TTFT, TPOT and ITL, and
   whether the order is right: which class waits longer under each policy, and which policy
   serves the chats sooner.

    make vllm && .venv/bin/python benchmarks/fidelity/priority_check.py     # ~7 min on 2 cores
    .venv/bin/python benchmarks/fidelity/priority_check.py --server stallfree --model random:medium \
        --num-requests 80 --out out/priority-check-sf                       # ~16 min
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

from stallfree.cli import build_parser
from stallfree.cli.validate import validation_options
from stallfree.core.serving import ServingConfig
from stallfree.costs import CostChoice
from stallfree.sim import Deployment, simulate
from stallfree.specs.step_profile import load_profile
from stallfree.validate import format_report, validate
from stallfree.workload.classes import TrafficClasses, parse_class

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common/ and the groups
from common.cli import stallfree
from common.host import loadavg as load
from common.host import machine
from common.servers import Server, stallfree_serve, vllm_serve
from fidelity.vllm_side_by_side import VLLM_DEFAULT, profile_server

KEYS = ("median_ttft_ms", "median_tpot_ms", "median_itl_ms")
POLICIES = ("fcfs", "priority")
STALLFREE_BLOCKS = 6000  # stallfree serve's KV cache, fixed (vLLM's is what its 2 GiB hold)


@contextlib.contextmanager
def served(args: argparse.Namespace, model_dir: Path, policy: str) -> Iterator[tuple[Server, int]]:
    """The server under ``policy``, and its KV cache's blocks of 16 tokens."""
    log = args.out / f"{args.server}-{policy}.log"
    budget, seqs = args.budget, VLLM_DEFAULT[1]
    if args.server == "vllm":
        flags = ["--scheduling-policy", policy, "--max-num-batched-tokens", str(budget)]
        with vllm_serve(model_dir, flags, log=log) as server:
            assert server.kv_cache_tokens is not None
            yield server, server.kv_cache_tokens // 16
        return
    steps = args.out / f"stallfree-{policy}.steps.jsonl"
    flags = ["--model", str(model_dir), "--dtype", "float32", "--scheduling-policy", policy,
             "--max-num-batched-tokens", str(budget), "--max-num-seqs", str(seqs),
             "--num-blocks", str(STALLFREE_BLOCKS), "--threads", "1",
             "--step-log", str(steps)]  # fmt: skip
    steps.unlink(missing_ok=True)  # serve appends: this run's steps alone
    with stallfree_serve(flags, log=log) as server:
        yield server, STALLFREE_BLOCKS


def classes_at(args: argparse.Namespace, scale: float) -> TrafficClasses:
    """The mix with both classes' rates times ``scale``."""
    chat = f"chat:lengths={args.chat_lengths},qps={args.chat_qps * scale:.6g},priority=0"
    batch = f"batch:lengths={args.batch_lengths},qps={args.batch_qps * scale:.6g},priority=10"
    return TrafficClasses((parse_class(chat), parse_class(batch)))


def serving(args: argparse.Namespace, policy: str, num_blocks: int) -> ServingConfig:
    return ServingConfig(
        max_num_batched_tokens=args.budget,
        max_num_seqs=VLLM_DEFAULT[1],
        num_blocks=num_blocks,
        scheduling_policy=policy,
    )


def sustained_scale(args: argparse.Namespace, costs: CostChoice, num_blocks: int) -> float:
    """The largest rate scale (x1.25 steps) at which the profile predicts the fcfs queue does not
    build up: the median scheduling delay stays under a second."""
    scale, best = 0.05, 0.05
    while scale < 50:
        deployment = Deployment(costs=costs, serving=serving(args, "fcfs", num_blocks))
        summary = simulate(classes_at(args, scale), deployment, num_requests=200, seed=args.seed).summary
        if (summary["median_scheduling_delay_ms"] or 0.0) > 1000:
            return best
        best, scale = scale, scale * 1.25
    return best


def validated(
    args: argparse.Namespace, profile: Path, result_path: Path, policy: str, num_blocks: int
) -> dict[str, Any]:
    """``stallfree validate --measured``'s per-class comparison of the run (its requests: arrival
    times, the lengths the server counted, priorities and classes, through the simulator under
    the same policy), as ``--json`` gives it; its report is saved beside the result. Run in
    process: one validation gives both."""
    argv = ["validate", "--profile", str(profile), "--measured", str(result_path),
            "--token-budget", str(args.budget), "--max-num-seqs", str(VLLM_DEFAULT[1]),
            "--num-blocks", str(num_blocks), "--scheduling-policy", policy]  # fmt: skip
    print("$ stallfree " + " ".join(argv), file=sys.stderr, flush=True)
    result = validate(validation_options(build_parser().parse_args(argv)))
    (args.out / f"validate-{policy}.txt").write_text(format_report(result) + "\n")
    return cast("dict[str, Any]", result.to_json()["policies"]["chunked"]["classes"])


def cell(measured: float | None, predicted: float | None) -> str:
    if measured is None or predicted is None:
        return "-"
    return f"{measured:,.0f} / {predicted:,.0f} ({predicted / measured:.2f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("out/priority-check"))
    parser.add_argument("--server", choices=("vllm", "stallfree"), default="vllm")
    parser.add_argument(
        "--model", default="random:small", help="a random-weight preset (default %(default)s)"
    )
    parser.add_argument("--chat-lengths", default="fixed:128,32")
    parser.add_argument("--batch-lengths", default="fixed:1536,8")
    parser.add_argument("--chat-qps", type=float, default=4.0, help="the chats' share of the mix")
    parser.add_argument("--batch-qps", type=float, default=1.0, help="the batch prompts' share")
    parser.add_argument(
        "--budget", type=int, default=512, help="the servers' tokens a step (default %(default)s)"
    )
    parser.add_argument("--load", type=float, default=2.0, help="share of the rate the profile sustains")
    parser.add_argument("--num-requests", type=int, default=120)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-profile", action="store_true", help="reuse the profile under --out")
    parser.add_argument(
        "--profile-seqs",
        type=int,
        default=64,
        help="streams the profile's decode points go up to (default %(default)s)",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model_dir = args.out / f"{args.model.split(':')[-1]}-fp32"
    if not (model_dir / "config.json").exists():
        stallfree("save-model", args.model, str(model_dir), "--dtype", "float32")
    profile = args.out / f"{args.server}.profile.json"
    rows = [
        f"{args.server}; machine: {machine()}, load {load()}; {args.budget} tokens a step; "
        f"{args.num_requests} requests a run, seed {args.seed}"
    ]
    body: dict[str, Any] = {"runs": {}}
    for policy in POLICIES:
        with served(args, model_dir, policy) as (server, num_blocks):
            if policy == "fcfs" and not (args.skip_profile and profile.exists()):
                profile_server(server.url, profile, model_dir, args.profile_seqs, args.budget)
            costs = CostChoice(kind="measured", profile=load_profile(profile))
            if policy == "fcfs":
                scale = args.load * sustained_scale(args, costs, num_blocks)
                classes = classes_at(args, scale)
                rows.append(
                    f"mix at {args.load:g} x the sustained rate: "
                    + ", ".join(f"{c.name} {c.qps:.3f} req/s" for c in classes.classes)
                )
            specs = [
                f"{c.name}:lengths={args.chat_lengths if c.name == 'chat' else args.batch_lengths},"
                f"qps={c.qps:.6g},priority={c.priority}"
                for c in classes.classes
            ]
            result_path = args.out / f"bench-{policy}.json"
            before, started = load(), time.perf_counter()
            stallfree("bench", "--base-url", server.url, "--scenario", "classes", "--classes", *specs,
                      "--num-requests", str(args.num_requests), "--seed", str(args.seed),
                      "--text-seed", str(args.seed + POLICIES.index(policy) + 1), "--temperature", "0",
                      "--save-result", str(result_path), "--no-progress")  # fmt: skip
            wall_s = time.perf_counter() - started
            body["runs"][policy] = validated(args, profile, result_path, policy, num_blocks) | {
                "wall_s": wall_s
            }
            rows.append(f"{policy}: {wall_s:.0f} s, load {before} -> {load()}")
    rows += [
        "",
        "| policy | class | median TTFT ms | median TPOT ms | median ITL ms |",
        "|---|---|---|---|---|",
    ]
    runs = body["runs"]
    for policy in POLICIES:
        for name in ("chat", "batch"):
            metrics = runs[policy]["by_class"][name]["metrics"]
            cells = [cell(metrics[k]["measured"], metrics[k]["predicted"]) for k in KEYS]
            rows.append(f"| {policy} | {name} | " + " | ".join(cells) + " |")
    rows.append("")
    for side in ("measured", "predicted"):
        ttft = {
            pol: {n: runs[pol]["by_class"][n]["metrics"]["median_ttft_ms"][side] for n in ("chat", "batch")}
            for pol in POLICIES
        }
        rows.append(
            f"{side}: chats' median TTFT fcfs {ttft['fcfs']['chat']:,.0f} ms -> priority "
            f"{ttft['priority']['chat']:,.0f} ms; batch {ttft['fcfs']['batch']:,.0f} -> "
            f"{ttft['priority']['batch']:,.0f} ms"
        )
    text = "\n".join(rows)
    print(text)
    (args.out / "priority-check.json").write_text(json.dumps(body, indent=2) + "\n")
    (args.out / "priority-check.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
