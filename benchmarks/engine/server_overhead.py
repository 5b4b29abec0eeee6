"""Server overhead per token, and the seed's long-prompt experiment through HTTP.

Part 1 (overhead): N streams (16, 64) of ``--max-tokens`` tokens each, run twice on the same
engine configuration: by :class:`LLMEngine` alone in this process (add, step until done), and
through ``stallfree serve`` in a subprocess with the benchmark client streaming every token over
HTTP. Overhead per token = (HTTP wall time - engine wall time) / tokens: SSE framing, JSON,
the event loop, the engine thread's hand-off, incremental detokenization, and the client.

Part 2 (the seed's experiment): ``stallfree serve`` with each policy, then the bench client's
long-prompt scenario: 16 streams decode, one long prompt arrives; the streams' longest and
median gap and the prompt's TTFT (alone and with the streams), side by side.

    .venv/bin/python benchmarks/engine/server_overhead.py            # both parts, ~3 minutes on 2 cores
    .venv/bin/python benchmarks/engine/server_overhead.py --part overhead --streams 16

Numbers are wall-clock on a shared CPU machine. The in-process engine uses ``--threads`` torch
threads (default 1: with two cores shared with other jobs, multi-threaded kernels stall badly when
descheduled), the server ``--server-threads`` (default: the same), passed as ``serve --threads``.
Single-stream ITL served vs in process (the issue's "the server does not slow the engine down"):

    .venv/bin/python benchmarks/engine/server_overhead.py --part overhead --streams 1 --dtype bfloat16 \
        --model PATH --threads 2 --server-threads 1 --max-tokens 64
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import torch

from stallfree.bench import client as bc
from stallfree.bench.prompts import calibrate
from stallfree.bench.scenarios import LongPromptOptions, run_long_prompt
from stallfree.core import SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common/
from common.servers import stallfree_serve


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class EngineAlone:
    """The same engine configuration as the server, stepped directly in this process."""

    def __init__(self, args: argparse.Namespace) -> None:
        from stallfree.engine.engine import LLMEngine

        self.engine = LLMEngine(args.model, dtype=args.dtype, device="cpu", token_budget=args.token_budget)
        self.args = args
        self.rng = random.Random(0)

    def run(self, num_streams: int) -> tuple[float, float, int]:
        """Wall seconds, CPU seconds and steps to finish ``num_streams`` requests added at once."""
        engine, vocab = self.engine, self.engine.model.spec.vocab_size
        params = SamplingParams(max_tokens=self.args.max_tokens, ignore_eos=True)
        for _ in range(num_streams):
            ids = [self.rng.randrange(3, vocab) for _ in range(self.args.prompt_tokens)]
            engine.add_request(prompt_token_ids=ids, sampling_params=params)
        start_s, start_cpu_s = time.perf_counter(), time.process_time()
        steps = 0
        while engine.has_unfinished_requests():
            engine.step()
            steps += 1
        return time.perf_counter() - start_s, time.process_time() - start_cpu_s, steps


@dataclass(frozen=True, slots=True)
class HttpRun:
    wall_s: float
    server_cpu_s: float
    client_cpu_s: float
    chunks: int
    median_itl_s: float


async def http_once(
    http: httpx.AsyncClient, base_url: str, pid: int, args: argparse.Namespace, n: int
) -> HttpRun:
    """``n`` streams sent at once through HTTP; CPU seconds of the server and of this client."""
    model, _ = await bc.discover(http, base_url, None, None)
    endpoint = bc.Endpoint(
        base_url=base_url, model=model, extra_body={"ignore_eos": True}, max_model_len=2048
    )
    sizer = await calibrate(http, endpoint)
    rng = random.Random(0)
    prompts = [sizer.prompt(args.prompt_tokens, rng) for _ in range(n)]
    start_s, start_server_s, start_client_s = time.perf_counter(), cpu_s(pid), time.process_time()
    results = await asyncio.gather(
        *(bc.stream_completion(http, endpoint, p, args.max_tokens) for p in prompts)
    )
    wall_s = time.perf_counter() - start_s
    server_s, client_s = cpu_s(pid) - start_server_s, time.process_time() - start_client_s
    gaps = sorted(b - a for r in results for a, b in itertools.pairwise(r.chunk_times_s))
    return HttpRun(
        wall_s, server_s, client_s, sum(len(r.chunk_times_s) for r in results), gaps[len(gaps) // 2]
    )


def part_overhead(args: argparse.Namespace) -> None:
    serve_args = ["--model", args.model, "--dtype", args.dtype, "--device", "cpu"]
    serve_args += ["--token-budget", str(args.token_budget), "--threads", str(args.server_threads)]
    alone = EngineAlone(args)
    rows = []
    with stallfree_serve(serve_args) as server:
        base_url, pid = server.url, server.pid

        async def http_run(n: int) -> HttpRun:
            async with bc.client() as http:
                return await http_once(http, base_url, pid, args, n)

        for n in args.streams:
            alone.run(n)  # warm-up, both sides
            asyncio.run(http_run(n))
            # Interleaved, fastest of each kept: the machine is shared, and noise only adds time.
            alone_runs, http_runs = [], []
            for _ in range(args.repeats):
                alone_runs.append(alone.run(n))
                http_runs.append(asyncio.run(http_run(n)))
            rows.append((n, min(alone_runs), min(http_runs, key=lambda r: r.server_cpu_s)))
    print(
        f"\n{args.model}, prompt {args.prompt_tokens} tokens, {args.max_tokens} output tokens per stream, "
        f"CPU {args.dtype}, {args.threads} threads in process, {args.server_threads} in the server"
    )
    print(
        "| streams | engine alone: CPU ms/step | server: CPU ms/step | server overhead per token: CPU us "
        "| client CPU us/token | engine alone: wall ms/step | HTTP: wall ms/step | HTTP median ITL (ms) |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n, (alone_s, alone_cpu_s, steps), run in rows:
        tokens = n * args.max_tokens
        if run.chunks != tokens:
            print(f"warning: {run.chunks} chunks for {tokens} tokens", file=sys.stderr)
        print(
            f"| {n} | {alone_cpu_s / steps * 1e3:.1f} | {run.server_cpu_s / steps * 1e3:.1f} "
            f"| {(run.server_cpu_s - alone_cpu_s) / tokens * 1e6:.0f} | {run.client_cpu_s / tokens * 1e6:.0f} "
            f"| {alone_s / steps * 1e3:.1f} | {run.wall_s / steps * 1e3:.1f} | {run.median_itl_s * 1e3:.1f} |"
        )


def part_long_prompt(args: argparse.Namespace) -> None:
    results: dict[str, dict[str, Any]] = {}
    configs = [("prefill-first", [])] + [
        (f"chunked, budget {b}", ["--token-budget", str(b)]) for b in args.budgets
    ]
    for name, extra in configs:
        policy = name.split(",")[0]
        serve_args = [
            "--model",
            args.model,
            "--dtype",
            args.dtype,
            "--device",
            "cpu",
            "--threads",
            str(args.server_threads),
            "--policy",
            policy,
            *extra,
        ]
        with stallfree_serve(serve_args) as server:
            results[name] = asyncio.run(_long_prompt(server.url, args))
    print(
        f"\n{args.model}: {args.long_streams} streams decoding, then one "
        f"{results['prefill-first']['long_prompt_tokens']}-token prompt"
    )
    print(
        "| policy | streams' longest gap (ms) | streams' median gap (ms) | prompt TTFT (ms) | prompt TTFT alone (ms) |"
    )
    print("|---|---:|---:|---:|---:|")
    for policy, r in results.items():
        print(
            f"| {policy} | {r['streams_max_itl_ms']:.0f} | {r['streams_median_itl_ms']:.1f} "
            f"| {r['long_prompt_ttft_ms']:.0f} | {r['long_prompt_alone_ttft_ms']:.0f} |"
        )


async def _long_prompt(base_url: str, args: argparse.Namespace) -> dict[str, Any]:
    async with bc.client() as http:
        model, _ = await bc.discover(http, base_url, None, None)
        endpoint = bc.Endpoint(base_url=base_url, model=model, extra_body={"ignore_eos": True})
        sizer = await calibrate(http, endpoint)
        options = LongPromptOptions(
            streams=args.long_streams,
            prompt_tokens=args.long_prompt_tokens,
            stream_max_tokens=args.stream_max_tokens,
        )
        run = await run_long_prompt(http, endpoint, sizer, options)
    return run.extra


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--part", choices=("overhead", "long-prompt", "both"), default="both")
    parser.add_argument("--model", default="random:small")
    parser.add_argument("--streams", type=lambda s: [int(x) for x in s.split(",")], default=[16, 64])
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--token-budget", type=int, default=256)
    parser.add_argument(
        "--repeats", type=int, default=3, help="overhead runs per setting (the fastest is kept)"
    )
    parser.add_argument(
        "--budgets",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[64, 256],
        help="chunked token budgets",
    )
    parser.add_argument("--long-streams", type=int, default=16)
    parser.add_argument("--long-prompt-tokens", type=int, default=1536)
    parser.add_argument("--stream-max-tokens", type=int, default=480)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads in this process (default 1: stable when shared)",
    )
    parser.add_argument("--server-threads", type=int, help="serve --threads (default: --threads)")
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    args.server_threads = args.server_threads or args.threads
    torch.set_num_threads(args.threads)
    if args.part in ("overhead", "both"):
        part_overhead(args)
    if args.part in ("long-prompt", "both"):
        part_long_prompt(args)


if __name__ == "__main__":
    main()
