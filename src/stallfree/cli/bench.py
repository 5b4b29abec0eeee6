"""``stallfree bench``: load any OpenAI-compatible server and score it with ``stallfree.metrics``."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import sys
from pathlib import Path
from typing import Any

from stallfree.cli.classes_args import add_classes_arg, classes_workload
from stallfree.cli.common import UsageError, check_writable, positive_float, positive_int
from stallfree.cli.workload_args import (
    add_agent_args,
    add_session_args,
    agent_workload,
    session_options,
    session_requests,
)

SCENARIOS = ("long-prompt", "poisson", "gamma", "trace", "multi-turn", "agents", "classes")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "bench",
        help="measure TTFT, inter-token gaps and throughput of any OpenAI-compatible server",
        description=(
            "Streams /v1/completions from any OpenAI-compatible server (stallfree, vLLM, SGLang) and stamps "
            "every chunk. Scenarios: long-prompt (N streams decode, one long prompt arrives: the streams' "
            "longest gap and the prompt's TTFT), poisson / gamma (arrivals at --qps, lengths from --lengths) "
            "trace (replayed arrival times), multi-turn (--sessions chats of --turns turns, each prompt "
            "the conversation so far: what a prefix cache serves) and agents (--agents coding agents, or "
            "a trace's agent sessions: each turn sent once the turns it waits for are back and the tool "
            "has run, its prompt the session so far). Prompts are random words sized to the requested token "
            "count by two calibration requests; real counts come from the server's usage."
        ),
    )
    _add_server_args(p)
    _add_sampling_args(p)
    _add_client_args(p)
    _add_long_prompt_args(p)
    _add_workload_args(p)
    m = p.add_argument_group(
        "multi-turn (sessions start at --qps, else all at once; --lengths or --prompt-tokens / "
        "--output-tokens: each turn's new message and answer)"
    )
    add_session_args(m)
    a = p.add_argument_group(
        "agents (agents start at --qps, else all at once; --lengths: each turn's tool output and answer; "
        "or --trace FILE --trace-format: a trace's agent sessions)"
    )
    add_agent_args(a)
    p.set_defaults(handler=run)


def _add_server_args(p: argparse.ArgumentParser) -> None:
    """The server and model asked, the scenario, its seeds, the server's context."""
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="server root (default %(default)s)")
    p.add_argument("--model", help="model to ask for (default: the first of /v1/models)")
    p.add_argument("--api-key", help="sent as 'Authorization: Bearer KEY'")
    p.add_argument("--scenario", choices=SCENARIOS, required=True)
    p.add_argument(
        "--seed",
        type=int,
        help="seed of arrivals, lengths and prompt text (default: a new one each run, so no server's "
        "prompt cache sees a repeated prompt; the seed used is in the result)",
    )
    p.add_argument(
        "--text-seed",
        type=int,
        help="seed of the prompt text alone (poisson and trace workloads; default: --seed): "
        "another run's arrivals and lengths (its --seed) with text no prompt cache holds",
    )
    p.add_argument(
        "--max-model-len",
        type=positive_int,
        help="the server's context in tokens (default: what /v1/models lists: max_model_len, or "
        "llama.cpp's meta.n_ctx)",
    )


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    """The "sampling" group: what every request asks of the sampler, and its max_tokens."""
    s = p.add_argument_group("sampling (sent with every request; default: the server's)")
    s.add_argument("--temperature", type=float, help="temperature")
    s.add_argument("--top-p", type=float, help="top_p")
    s.add_argument("--top-k", type=int, help="top_k (vLLM, SGLang, llama.cpp)")
    s.add_argument(
        "--max-tokens",
        type=positive_int,
        help="every request's max_tokens (poisson/gamma/trace: replaces the output lengths; long-prompt: "
        "the streams' --stream-max-tokens)",
    )


def _add_client_args(p: argparse.ArgumentParser) -> None:
    """How the client sends and reports: ignore_eos, calibration, timeout, result file, progress."""
    p.add_argument(
        "--no-ignore-eos",
        dest="ignore_eos",
        action="store_false",
        help="do not send vLLM's ignore_eos hint (for servers that reject unknown fields)",
    )
    p.add_argument(
        "--chars-per-token", type=positive_float, help="skip calibration: prompt characters per token"
    )
    p.add_argument(
        "--timeout", type=positive_float, default=600.0, help="seconds per request (default %(default)s)"
    )
    p.add_argument("--save-result", metavar="FILE", help="write the result JSON (vLLM's keys) to FILE")
    p.add_argument(
        "--no-progress", dest="progress", action="store_false", help="no progress bar (never drawn off a TTY)"
    )


def _add_long_prompt_args(p: argparse.ArgumentParser) -> None:
    """The "long-prompt" group: the streams decoding and the long prompt that arrives."""
    g = p.add_argument_group("long-prompt")
    g.add_argument("--streams", type=positive_int, help="streams decoding (default 16)")
    g.add_argument(
        "--prompt-tokens",
        type=positive_int,
        help="long-prompt: the long prompt's tokens (default 4096); poisson/gamma: fixed prompt length",
    )
    g.add_argument(
        "--stream-prompt-tokens", type=positive_int, default=32, help="each stream's prompt (default 32)"
    )
    g.add_argument(
        "--stream-max-tokens", type=positive_int, default=512, help="each stream's max_tokens (default 512)"
    )
    g.add_argument(
        "--prompt-max-tokens", type=positive_int, default=8, help="the long prompt's max_tokens (default 8)"
    )


def _add_workload_args(p: argparse.ArgumentParser) -> None:
    """The "poisson / gamma / trace" group: arrivals, lengths, prompts, caps and goodput SLOs."""
    w = p.add_argument_group("poisson / gamma / trace")
    w.add_argument("--qps", type=float, help="mean requests per second")
    w.add_argument("--burstiness", type=float, help="gamma shape (1 = Poisson, < 1 burstier)")
    w.add_argument("--lengths", help="trace name or CSV path, fixed:P,O, uniform:..., lognormal:...")
    w.add_argument("--output-tokens", type=positive_int, help="fixed output length (with --prompt-tokens)")
    w.add_argument("--num-requests", type=positive_int, help="requests to send (trace: default all rows)")
    w.add_argument("--trace", help="trace: name or CSV path whose arrived_at column is replayed")
    w.add_argument("--time-scale", type=positive_float, default=1.0, help="trace: stretch arrival times")
    w.add_argument("--sampling", help="how trace lengths are drawn (with-replacement, in-order, ...)")
    w.add_argument(
        "--prompts-file",
        metavar="JSONL",
        help='poisson/gamma: your own prompts, one JSON object a line ({"prompt": "..."}), request i '
        "sending line i (cycling); their lengths are theirs (set only the outputs: --output-tokens or "
        "--max-tokens)",
    )
    w.add_argument("--max-prompt-tokens", type=positive_int, help="cap prompt lengths")
    w.add_argument(
        "--max-total-tokens",
        type=positive_int,
        help="cap prompt + output (default: 95%% of the server's context if /v1/models lists it)",
    )
    w.add_argument(
        "--goodput", nargs="+", metavar="METRIC:MS", help="SLOs for goodput, e.g. ttft:500 tpot:50"
    )
    add_classes_arg(
        p.add_argument_group(
            "classes (--num-requests shared by rate; each request sends its class's priority)"
        )
    )


def run(args: argparse.Namespace) -> int:
    from stallfree.bench.report import format_result, interrupted_text

    if args.save_result:
        check_writable(Path(args.save_result), "--save-result")
    spec = _spec(args)  # bad options fail before any I/O
    result = asyncio.run(_run(spec, args.progress and sys.stderr.isatty()))
    interrupted = result.get("interrupted")
    print(format_result(result))
    if args.save_result:
        path = Path(args.save_result)
        path.write_text(json.dumps(result, indent=2) + "\n")
        print(f"saved {path}", file=sys.stderr)
    if interrupted:
        print(f"stallfree bench: interrupted; {interrupted_text(interrupted)}", file=sys.stderr)
        return 130
    return 0 if result["completed"] else 1


def _spec(args: argparse.Namespace) -> Any:
    from stallfree.bench.run import BenchSpec
    from stallfree.bench.scenarios import LongPromptOptions
    from stallfree.metrics.io import parse_goodput

    if args.scenario != "long-prompt" and args.streams is not None:
        raise UsageError("--streams applies only to the long-prompt scenario")
    prompts = _prompts_file(args) if args.prompts_file else None
    seed = random.SystemRandom().randrange(2**31) if args.seed is None else args.seed
    agents = _agents(args, seed)
    classes = _classes(args)
    workload = None if args.scenario in ("long-prompt", "agents", "classes") else _workload(args)
    long_prompt = LongPromptOptions(
        streams=args.streams or 16,
        prompt_tokens=args.prompt_tokens or 4096,
        context_tokens=args.stream_prompt_tokens,
        stream_max_tokens=args.max_tokens if workload is None and args.max_tokens else args.stream_max_tokens,
        prompt_max_tokens=args.prompt_max_tokens,
    )
    sampling: dict[str, Any] = {"ignore_eos": True} if args.ignore_eos else {}
    sampling |= {
        k: getattr(args, k) for k in ("temperature", "top_p", "top_k") if getattr(args, k) is not None
    }
    return BenchSpec(
        base_url=args.base_url,
        scenario=args.scenario,
        seed=seed,
        text_seed=args.text_seed,
        model=args.model,
        api_key=args.api_key,
        max_model_len=args.max_model_len,
        sampling=sampling,
        chars_per_token=args.chars_per_token,
        timeout_s=args.timeout,
        long_prompt=long_prompt,
        workload=workload,
        num_requests=args.num_requests,
        max_tokens=args.max_tokens if workload is not None else None,
        request_rate=args.qps,
        burstiness=args.burstiness,
        goodput=parse_goodput(args.goodput) if args.goodput else None,
        prompt_texts=prompts,
        agents=agents,
        classes=classes,
    )


async def _run(spec: Any, progress: bool) -> dict[str, Any]:
    """The run, Ctrl-C keeping what was measured once the scenario has begun (calibrating, it
    interrupts as anywhere else)."""
    from tqdm import tqdm

    from stallfree.bench.run import run_bench

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    total = spec.num_requests or (spec.workload.max_num_requests() if spec.workload else None)
    if spec.agents is not None:
        total = len(spec.agents)
    shown = progress and (spec.workload is not None or spec.agents is not None or spec.classes is not None)
    with tqdm(total=total, disable=not shown, unit="req", file=sys.stderr) as bar:
        return await run_bench(
            spec, stop, on_done=bar.update, started=lambda: loop.add_signal_handler(signal.SIGINT, stop.set)
        )


def _classes(args: argparse.Namespace) -> Any:
    """The classes scenario's classes (None for another scenario, which refuses --classes)."""
    if args.scenario != "classes":
        if args.classes:
            raise UsageError("--classes applies to the classes scenario only")
        return None
    if not args.classes:
        raise UsageError("the classes scenario needs --classes NAME:lengths=L,qps=R[,priority=P] ...")
    if args.num_requests is None:
        raise UsageError("the classes scenario needs --num-requests")
    classes = classes_workload(args)
    sessions = [c.name for c in classes.classes if c.workload.sessions is not None] if classes else []
    if sessions:
        raise UsageError(
            f"--classes: class {sessions[0]} has turns=: bench sends each turn once the answer before it is "
            "back (--scenario multi-turn); classes of sessions are simulate's and tune's"
        )
    return classes


def _agents(args: argparse.Namespace, seed: int) -> Any:
    """The agents scenario's turns (None for another scenario, whose agent flags are refused)."""
    if args.scenario != "agents":
        given = [f for f in ("agents", "trace_format") if getattr(args, f) is not None]
        if given:
            raise UsageError(f"--{given[0].replace('_', '-')} applies to the agents scenario only")
        agent_workload(args)  # refuses the shaping flags without --agents
        return None
    if args.agents is None and args.trace_format is None:
        raise UsageError("the agents scenario needs --agents N (or --trace FILE --trace-format FORMAT)")
    for flag in (
        "prompt_tokens",
        "output_tokens",
        "max_tokens",
        "max_prompt_tokens",
        "max_total_tokens",
        "prompts_file",
    ):
        if getattr(args, flag) is not None:
            raise UsageError(f"--{flag.replace('_', '-')} does not apply to the agents scenario")
    args.seed = seed
    return agent_workload(args)


def _prompts_file(args: argparse.Namespace) -> tuple[str, ...]:
    """``--prompts-file``'s prompts; the workload then samples only arrivals and output lengths."""
    if args.scenario not in ("poisson", "gamma"):
        raise UsageError("--prompts-file applies to the poisson and gamma scenarios")
    for flag, value in (("--lengths", args.lengths), ("--prompt-tokens", args.prompt_tokens)):
        if value is not None:
            raise UsageError(f"--prompts-file gives the prompts: not with {flag}")
    if args.output_tokens is None and args.max_tokens is None:
        raise UsageError("--prompts-file needs the outputs' length: --output-tokens N (or --max-tokens N)")
    path = Path(args.prompts_file)
    try:
        lines = [line for line in path.read_text().splitlines() if line.strip()]
        prompts = tuple(str(json.loads(line)["prompt"]) for line in lines)
    except OSError as exc:
        raise UsageError(f"--prompts-file {path}: {exc.strerror or exc}") from None
    except (ValueError, KeyError, TypeError):
        raise UsageError(f'--prompts-file {path}: every line must be a JSON object with a "prompt"') from None
    if not prompts:
        raise UsageError(f"--prompts-file {path}: no prompts in it")
    # The sampled prompt lengths stand in only where a server reports no usage: say "1" and let
    # the server count.
    args.prompt_tokens, args.output_tokens = 1, args.output_tokens or args.max_tokens
    return prompts


def _workload(args: argparse.Namespace) -> Any:
    from stallfree.workload import WorkloadOptions, workload_from_options

    if args.scenario == "multi-turn":
        args.num_requests = session_requests(args)
    elif args.sessions is not None or args.turns is not None:
        raise UsageError("--sessions and --turns apply to the multi-turn scenario only")
    if args.scenario == "trace" and args.trace is None:
        raise UsageError("the trace scenario needs --trace (a name or a CSV with an arrived_at column)")
    if args.scenario in ("poisson", "gamma") and args.num_requests is None:
        raise UsageError(f"the {args.scenario} scenario needs --num-requests")
    if args.qps is not None and not args.qps > 0:
        raise UsageError(f"--qps must be positive, got {args.qps}")
    arrival = args.scenario
    if arrival == "multi-turn":
        arrival = "poisson" if args.qps is not None else "all-at-once"
    options = WorkloadOptions(
        arrival=arrival,
        qps=args.qps,
        burstiness=args.burstiness,
        trace=args.trace,
        time_scale=args.time_scale,
        lengths=args.lengths,
        prompt_tokens=args.prompt_tokens,
        output_tokens=args.output_tokens,
        sampling=args.sampling,
        max_prompt_tokens=args.max_prompt_tokens,
        max_total_tokens=args.max_total_tokens,
        **session_options(args),
    )
    return workload_from_options(options)
