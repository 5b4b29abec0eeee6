"""``stallfree serve``: the engine behind an OpenAI-compatible HTTP API."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from stallfree.cli.common import check_writable, positive_int
from stallfree.cli.device import check_device
from stallfree.cli.serving_args import add_engine_args, engine_config


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
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from stallfree.server.launch import bind, build_server, serve

    if not 0 <= args.port <= 65535:
        raise ValueError(f"port must be in 0..65535, got {args.port}")
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
