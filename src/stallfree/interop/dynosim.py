"""A stallfree run as a DynoSim command line, so it can be rerun on NVIDIA's tools.

``python -m stallfree.interop.dynosim DEPLOYMENT.yaml --trace TRACE --out DIR`` writes into DIR
the deployment's step prices as a mocker-format NPZ (:mod:`.dynosim_tables`), the engine-args
JSON (block size, KV blocks, token budget, max sequences, prefix caching, chunked prefill, the
NPZ), the trace as Mooncake JSON lines, and prints the ``python -m dynamo.replay`` command (for
``ai-dynamo`` 1.4.2) that replays it. Only what both simulate alike is translated: one kind of
replica, ``round-robin`` or ``cache-aware`` (DynoSim's ``kv_router``, a different rule: see
docs/dynosim.md), the chunked or prefill-first policy; anything else is a one-line error, exit 2.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shlex
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from stallfree.core import Request
from stallfree.interop.dynosim_tables import tables_from_pricer
from stallfree.sim.api import replica_kv_memory
from stallfree.sim.deployment import Deployment
from stallfree.workload.traces import MOONCAKE_BLOCK_TOKENS, load_trace, resolve_trace_path

ROUTER_MODES = {"round-robin": "round_robin", "cache-aware": "kv_router"}
DYNAMO_VERSION = "1.4.2"


def check_translatable(deployment: Deployment) -> None:
    """Raise a one-line ValueError for a part DynoSim's offline replay would run differently."""
    if deployment.disaggregate is not None or deployment.autoscale is not None:
        raise ValueError("disaggregated and autoscaled deployments are not translated (one pool, fixed size)")
    if deployment.fleet:
        raise ValueError("a fleet of replica groups is not translated (DynoSim's workers are all alike)")
    if deployment.speculation is not None or deployment.route_delay_ms:
        raise ValueError("drafts and a route delay are not translated")
    if deployment.router not in ROUTER_MODES:
        raise ValueError(f"router {deployment.router!r}: DynoSim routes round-robin or by KV (cache-aware)")
    if deployment.serving.policy not in ("chunked", "prefill-first"):
        raise ValueError(f"policy {deployment.serving.policy!r}: DynoSim schedules as vLLM (chunked)")
    if deployment.serving.chunk_tokens is not None or deployment.serving.step_budget_ms is not None:
        raise ValueError("fixed chunks and step-time budgets are not translated (a token budget is)")


def engine_args(deployment: Deployment, profile_npz: str | Path) -> dict[str, Any]:
    """The engine-args JSON (``--extra-engine-args``) of one replica of ``deployment``."""
    from stallfree.costs.choice import pick_once

    check_translatable(deployment)
    serving = deployment.serving
    pick = pick_once(deployment.costs)
    context = pick.model.max_position_embeddings
    kv = replica_kv_memory(pick, serving, deployment.gpu_memory_utilization)
    return {
        "engine_type": "vllm",
        "block_size": serving.block_size,
        "num_gpu_blocks": kv.num_blocks,
        "max_num_batched_tokens": serving.step_token_cap(context),
        "max_num_seqs": serving.num_seqs_limit,
        "max_model_len": serving.max_model_len or context,
        "enable_prefix_caching": serving.enable_prefix_caching,
        "enable_chunked_prefill": serving.policy == "chunked",
        "preemption_mode": "lifo",  # the newest running request, as stallfree and vLLM V1
        "planner_profile_data": str(profile_npz),
    }


def command_line(
    deployment: Deployment, trace: str | Path, args_json: str | Path, report_json: str | Path
) -> list[str]:
    """``python -m dynamo.replay`` with ``deployment``'s workers and router over a Mooncake trace."""
    check_translatable(deployment)
    return [
        "python", "-m", "dynamo.replay", str(trace),
        "--trace-format", "mooncake",
        "--trace-block-size", str(MOONCAKE_BLOCK_TOKENS),
        "--num-workers", str(deployment.replicas),
        "--router-mode", ROUTER_MODES[deployment.router],
        "--replay-mode", "offline",
        "--extra-engine-args", Path(args_json).read_text() if Path(args_json).exists() else str(args_json),
        "--report-json", str(report_json),
    ]  # fmt: skip


def write_profile(deployment: Deployment, path: str | Path, num_points: int = 64) -> None:
    """``deployment``'s step prices (its cost model) as a mocker-format NPZ covering its budget,
    its sequences, its model's context and one replica's KV cache."""
    from stallfree.costs.choice import pick_once

    pick = pick_once(deployment.costs)
    serving = deployment.serving
    context = serving.max_model_len or pick.model.max_position_embeddings
    kv = replica_kv_memory(pick, serving, deployment.gpu_memory_utilization)
    tables = tables_from_pricer(
        pick.pricer,
        max_prefill_tokens=serving.step_token_cap(pick.model.max_position_embeddings),
        max_num_seqs=serving.num_seqs_limit,
        max_context_len=context,
        max_kv_tokens=kv.num_blocks * serving.block_size,
        num_points=num_points,
    )
    tables.save(path)


def write_mooncake(requests: Iterable[Request], path: str | Path) -> int:
    """Requests as Mooncake JSON lines (ms timestamps, one hash id per 512 prompt tokens). A
    prompt's blocks become ids by content (the same tokens after the same prefix, the same id);
    a prompt without blocks gets ids of its own, shared with nothing. Returns the rows written."""
    known: dict[tuple[int, tuple[int, ...]], int] = {}
    rows = 0
    with Path(path).open("w") as out:
        for r in requests:
            ids = _block_ids(r, known)
            row = {
                "timestamp": r.arrival_time_s * 1000,
                "input_length": r.num_prompt_tokens,
                "output_length": r.max_tokens,
                "hash_ids": ids,
            }
            out.write(json.dumps(row) + "\n")
            rows += 1
    return rows


def _block_ids(r: Request, known: dict[tuple[int, tuple[int, ...]], int]) -> list[int]:
    count = -(-r.num_prompt_tokens // MOONCAKE_BLOCK_TOKENS)
    blocks = r.prompt_blocks
    if blocks is None:
        return [_new_id(known, (-1, (-1 - len(known),))) for _ in range(count)]
    per = blocks.tokens_per_id
    if MOONCAKE_BLOCK_TOKENS % per:
        raise ValueError(f"request {r.request_id}: prompt ids of {per} tokens do not make 512-token blocks")
    step = MOONCAKE_BLOCK_TOKENS // per
    prompt_ids = -(-r.num_prompt_tokens // per)
    out: list[int] = []
    parent = 0
    for k in range(count):
        content = blocks.ids[k * step : min((k + 1) * step, prompt_ids)]
        if len(content) < min(step, prompt_ids - k * step):  # ids stop short: the rest is its own
            content = (*content, -1 - len(known))
        parent = _new_id(known, (parent, tuple(content)))
        out.append(parent)
    return out


def _new_id(known: dict[tuple[int, tuple[int, ...]], int], key: tuple[int, tuple[int, ...]]) -> int:
    """The id of a block by (its parent's id, its content); a new content gets the next id."""
    return known.setdefault(key, len(known) + 1)


def plain_trace(trace: str, out_dir: Path) -> Path:
    """A Mooncake trace DynoSim can read: the file itself, or a gzipped one (a stallfree short
    name's) unpacked into ``out_dir``."""
    path = resolve_trace_path(trace)
    load_trace(path)  # a bad trace is one line here, not a Rust panic there
    if path.suffix != ".gz":
        if path.suffix != ".jsonl":
            raise ValueError(f"{trace}: DynoSim reads Mooncake JSON lines (.jsonl)")
        return path
    plain = out_dir / path.name.removesuffix(".gz")
    with gzip.open(path, "rb") as src:
        plain.write_bytes(src.read())
    return plain


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m stallfree.interop.dynosim",
        description="Write a stallfree deployment and a Mooncake trace as a DynoSim "
        f"(ai-dynamo {DYNAMO_VERSION}) replay: its prices as NPZ tables, its engine args, the command.",
    )
    parser.add_argument("deployment", help="a deployment YAML (stallfree simulate --deployment-out)")
    parser.add_argument("--trace", required=True, help="a Mooncake trace: a .jsonl(.gz) path or a short name")
    parser.add_argument("--out", default="dynosim-run", help="folder for the files (default dynosim-run)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    try:
        data = yaml.safe_load(Path(args.deployment).read_text())
        deployment = Deployment.from_dict(data if data is not None else {})
        check_translatable(deployment)
        out.mkdir(parents=True, exist_ok=True)
        trace = plain_trace(args.trace, out)
        profile = out / "perf_data.npz"
        write_profile(deployment, profile)
        args_json = out / "engine_args.json"
        args_json.write_text(json.dumps(engine_args(deployment, profile.resolve())))
        cmd = command_line(deployment, trace.resolve(), args_json, out.resolve() / "report.json")
    except (OSError, ValueError, yaml.YAMLError) as exc:
        message = str(exc).strip().splitlines()
        print(f"error: {message[0] if message else type(exc).__name__}", file=sys.stderr)
        return 2
    print(shlex.join(cmd))
    return 0


if __name__ == "__main__":
    sys.exit(main())
