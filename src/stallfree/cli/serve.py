"""``stallfree serve``: the engine behind an OpenAI-compatible HTTP API."""

from __future__ import annotations

import argparse
import contextlib
import socket
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from stallfree.cli.classes_args import add_shed_args, shed_rule
from stallfree.cli.common import UsageError, check_writable, positive_float, positive_int
from stallfree.cli.cost_args import add_gpu_table_args, cost_model_arg
from stallfree.cli.deployment_args import add_deployment_file_arg, read_deployment
from stallfree.cli.device import check_device
from stallfree.cli.serving_args import (
    acceptance_arg,
    add_acceptance_arg,
    add_engine_args,
    engine_config,
    serving_config,
)
from stallfree.costs.choice import DEFAULT_HARDWARE

if TYPE_CHECKING:
    from fastapi import FastAPI

    from stallfree.server.launch import ServerThread
    from stallfree.server.virtual import ServedTokenizer
    from stallfree.sim.deployment import Deployment

ENGINE_MODEL = "random:small"  # --model's default: the engine's, not a model to price
_DTYPE_BYTES = {"auto": None, "float32": 4, "bfloat16": 2, "float16": 2}
# Flags of the real engine that a virtual replica has no use for, with their defaults.
_ENGINE_ONLY = {"device": None, "quantization": None, "threads": None, "prompt_lookup_min": None}


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions)",
        description=(
            "Load a model into the PyTorch engine and serve /v1/completions, /v1/chat/completions (streaming "
            "or not), /v1/models, /health and Prometheus /metrics. One engine thread steps the shared "
            "scheduler; a client that disconnects mid-stream frees its KV blocks at once."
        ),
    )
    add_engine_args(p)
    p.add_argument(
        "--served-model-name",
        metavar="NAME",
        help="the name clients ask for, in /v1/models, answers and metric labels (default: the "
        "model's own name: a GGUF file's general.name, else its stem; an HF folder's name; "
        "random:<preset> and smollm2 as given)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of random weights and unseeded sampling")
    p.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default %(default)s: this machine only)"
    )
    p.add_argument("--port", type=int, default=8000, help="port (default %(default)s; 0 picks a free one)")
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on /v1 routes")
    p.add_argument(
        "--max-waiting-requests",
        type=positive_int,
        default=256,
        help="requests waiting for a first token before new ones get 429 (default %(default)s)",
    )
    add_shed_args(p)
    p.add_argument(
        "--threads",
        type=positive_int,
        help="torch threads for the engine (default: every core up to 4 cores, every core but one above)",
    )
    p.add_argument(
        "--step-log",
        metavar="FILE",
        help="append a JSON line per engine step (its plan and wall time) to FILE, for "
        "`stallfree validate --measured RESULT --step-log FILE`",
    )
    p.add_argument(
        "--log-level",
        default="info",
        choices=("critical", "error", "warning", "info", "debug"),
        help="uvicorn logs",
    )
    _add_virtual_args(p.add_argument_group("virtual replica (--simulate)"))
    p.set_defaults(handler=run)


def _add_virtual_args(g: argparse._ArgumentGroup) -> None:
    """``--simulate`` and what prices its steps (``--model`` and ``--profile`` then name the model
    and profile to price, as in `stallfree simulate`)."""
    g.add_argument(
        "--simulate",
        action="store_true",
        help="serve a virtual replica: the same API and metrics (named vllm:), the engine replaced by the "
        "scheduler with its steps taking the time the cost model prices them at (no model runs, no torch "
        "needed): --model a preset or HF id, --hardware, --tp, --cost-model, --profile, --framework",
    )
    g.add_argument(
        "--hardware", default=DEFAULT_HARDWARE, help=f"GPU preset or JSON file (default {DEFAULT_HARDWARE})"
    )
    g.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel GPUs (default 1)")
    g.add_argument(
        "--cost-model",
        type=cost_model_arg,
        choices=("weights-only", "full", "measured", "auto"),
        default="auto",
        help="how steps are priced, as `stallfree simulate --cost-model` (default auto)",
    )
    add_gpu_table_args(g)
    g.add_argument(
        "--gpu-memory-utilization",
        type=positive_float,
        default=0.9,
        help="share of GPU memory for weights, activations and KV cache (default %(default)s)",
    )
    add_acceptance_arg(g, draft=True)
    add_deployment_file_arg(g, flags_win=False)
    g.add_argument(
        "--tokenizer",
        metavar="DIR",
        help="count tokens with this Hugging Face tokenizer folder (needs .[engine]); default: an estimate, "
        "a word's leading space and up to 4 characters a token",
    )
    g.add_argument(
        "--time-scale",
        type=positive_float,
        default=1.0,
        metavar="K",
        help="run the replica's clock K times faster (tests; latencies are then wall time / K) (default 1)",
    )
    g.add_argument(
        "--replicas",
        type=positive_int,
        default=1,
        help="virtual replicas in this process, replica i on --port + i (default 1)",
    )


def run(args: argparse.Namespace) -> int:
    from stallfree.server.launch import bind, build_server, serve

    if not 0 <= args.port <= 65535:
        raise ValueError(f"port must be in 0..65535, got {args.port}")
    if args.simulate:
        return _run_virtual(args)
    for flag in ("hardware", "tp", "cost_model", "replicas", "time_scale", "tokenizer", "deployment"):
        default = {
            "hardware": DEFAULT_HARDWARE,
            "tp": 1,
            "cost_model": "auto",
            "replicas": 1,
            "time_scale": 1.0,
        }
        if getattr(args, flag) != default.get(flag):
            raise UsageError(f"--{flag.replace('_', '-')} applies with --simulate (a virtual replica)")
    check_device(args.device)
    if args.step_log:
        check_writable(Path(args.step_log), "--step-log")
    sock = bind(args.host, args.port)  # before loading the model: a busy port fails fast
    try:
        app = build_server(
            engine_config(args, seed=args.seed),
            served_model_name=args.served_model_name,
            api_key=args.api_key,
            max_waiting_requests=args.max_waiting_requests,
            shed=shed_rule(args),
            num_threads=args.threads,
            step_log=args.step_log,
        )
        host, port = sock.getsockname()[:2]
        engine = app.state.engine_thread.engine
        print(
            f"stallfree serve: {app.state.served_model_name} (context {engine.max_model_len}, "
            f"{engine.scheduler.block_manager.num_blocks} KV blocks, prefix caching "
            f"{'on' if engine.serving.enable_prefix_caching else 'off'}, "
            f"{app.state.engine_thread.num_threads} engine threads) on http://{host}:{port}\n"
            f"  {engine.describe_budget()}\n  {engine.describe_format()}",
            file=sys.stderr,
            flush=True,
        )
        serve(app, sock, args.log_level)
    finally:
        sock.close()
    return 0


def virtual_deployment(args: argparse.Namespace) -> Deployment:
    """The virtual replica's deployment: ``--deployment FILE``, else the flags."""
    from stallfree.costs.choice import CostChoice
    from stallfree.sim.deployment import Deployment, Speculation

    if args.deployment is not None:
        return read_deployment(args.deployment)
    acceptance = acceptance_arg(args)
    try:
        return Deployment(
            costs=CostChoice(
                args.cost_model,
                None if args.model == ENGINE_MODEL else args.model,
                args.hardware,
                args.tp,
                args.profile,
                _DTYPE_BYTES[args.dtype],
                gpu_tables=args.gpu_tables,
                framework=args.framework,
                framework_version=args.framework_version,
                expert_parallel=args.expert_parallel,
            ),
            serving=serving_config(args),
            gpu_memory_utilization=args.gpu_memory_utilization,
            speculation=None if acceptance is None else Speculation(acceptance, args.draft),
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _run_virtual(args: argparse.Namespace) -> int:
    """``serve --simulate``: ``--replicas`` virtual replicas, replica i on ``--port`` + i."""
    from stallfree.server.launch import ServerThread, bind, build_virtual_server, serve

    for flag, default in _ENGINE_ONLY.items():
        if getattr(args, flag) != default:
            raise UsageError(f"--{flag.replace('_', '-')} is the engine's: a virtual replica runs no model")
    if args.step_log:
        check_writable(Path(args.step_log), "--step-log")
    deployment = virtual_deployment(args)
    tokenizer = _tokenizer(args.tokenizer) if args.tokenizer else None
    if args.port and args.port + args.replicas - 1 > 65535:
        raise UsageError(f"--port {args.port} + {args.replicas} replicas passes port 65535")
    socks = [bind(args.host, args.port + i if args.port else 0) for i in range(args.replicas)]
    try:
        apps = [
            build_virtual_server(
                deployment,
                served_model_name=args.served_model_name,
                api_key=args.api_key,
                max_waiting_requests=args.max_waiting_requests,
                shed=shed_rule(args) or deployment.shed,
                tokenizer=tokenizer,
                time_scale=args.time_scale,
                seed=args.seed + i,
            )
            for i in range(args.replicas)
        ]
        for app, sock in zip(apps, socks, strict=True):
            _announce(app, sock)
        if len(apps) == 1:
            serve(apps[0], socks[0], args.log_level)
        else:
            _serve_all(
                [
                    ServerThread(app, log_level=args.log_level, sock=s)
                    for app, s in zip(apps, socks, strict=True)
                ]
            )
    finally:
        for sock in socks:
            sock.close()
    return 0


def _announce(app: FastAPI, sock: socket.socket) -> None:
    engine = app.state.engine_thread.engine
    host, port = sock.getsockname()[:2]
    print(
        f"stallfree serve --simulate: {app.state.served_model_name} on http://{host}:{port}\n  {engine.describe()}",
        file=sys.stderr,
        flush=True,
    )


def _serve_all(servers: list[ServerThread]) -> None:
    """Every replica's server on a thread of its own until Ctrl-C / SIGTERM."""
    import signal

    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    with contextlib.ExitStack() as stack:
        for server in servers:
            stack.enter_context(server)
        done.wait()


def _tokenizer(folder: str) -> ServedTokenizer:
    try:
        from stallfree.engine.tokenizer import Tokenizer
    except ImportError:
        raise UsageError("--tokenizer needs the engine's extra: pip install 'stallfree[engine]'") from None
    try:
        return Tokenizer.from_folder(Path(folder))
    except (OSError, ValueError) as exc:
        raise UsageError(f"--tokenizer {folder}: {exc}") from None
