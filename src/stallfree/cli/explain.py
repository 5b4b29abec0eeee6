"""``stallfree explain``: the seed's long-prompt arrival, prefill-first vs chunked, one clock."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from stallfree.cli.common import (
    COST_MODEL_CHOICES,
    ENGINE_MODELS,
    UsageError,
    add_dtype_arg,
    cost_model_arg,
    int_list,
    positive_float,
    positive_int,
)
from stallfree.cli.device import check_device
from stallfree.core.config import ceil_div

if TYPE_CHECKING:
    from stallfree.explain import Explanation, RooflineTimer, Scenario, StepTimer
    from stallfree.sim.cost_model import CostModelConfig

MEM_UTILIZATION = 0.9  # as simulate's default --gpu-memory-utilization

# The seed's scenario on the roofline; a CPU-sized one on the real engine.
DEFAULTS: dict[str, dict[str, Any]] = {
    "roofline": {
        "model": "llama-3.1-70b",
        "prompt_tokens": 16384,
        "context_tokens": 1024,
        "chunk_tokens": 256,
    },
    "torch": {"model": "random:medium", "prompt_tokens": 2048, "context_tokens": 256, "chunk_tokens": None},
}
ENGINE_SWEEP = (16, 32, 64, 128, 256, 512)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "explain",
        help="the seed's scenario: N streams decoding, a long prompt arrives; prefill-first vs chunked",
        description=(
            "N streams are decoding when a long prompt arrives. Prefill-first runs the prompt whole in a "
            "step of its own and every stream goes silent; chunked (stall-free) cuts it into chunks that "
            "ride inside the decode steps. Prints both on one clock, then a chunk-size sweep. Defaults "
            "reproduce the seed: Llama-3-70B on 4 x A100-40GB, 16 streams, a 16,384-token prompt, 256-token "
            "chunks. With --engine torch the same scenario runs on the real PyTorch engine and every step is "
            "measured on the wall clock (defaults: random:medium, 16 streams at 256 tokens, a 2,048-token "
            "prompt, chunks at this machine's measured ridge)."
        ),
    )
    add = p.add_argument
    add(
        "--engine",
        choices=("roofline", "torch"),
        default="roofline",
        help="roofline: step times from the cost model; torch: measured on the real engine (needs the engine extra)",
    )
    add(
        "--model",
        help="roofline: preset or HF config.json (default llama-3-70b); "
        f"torch: {ENGINE_MODELS} (default random:medium)",
    )
    add("--hardware", default="a100-40gb", help="roofline: preset or hardware JSON (default %(default)s)")
    add("--tp", type=positive_int, default=4, help="roofline: tensor-parallel GPUs (default %(default)s)")
    add(
        "--cost-model",
        type=cost_model_arg,
        choices=COST_MODEL_CHOICES,
        default="weights-only",
        help="roofline: weights-only (alias seed) = the seed's arithmetic; full = + attention, KV traffic, "
        "LM head, TP all-reduce (default %(default)s)",
    )
    add(
        "--profile",
        metavar="FILE",
        help="a `stallfree profile` file: steps priced by the measured model (with --engine torch: the run as "
        "measured and, beside it, the same scenario priced by the profile, predicted / measured)",
    )
    add("--device", help="torch: cpu or cuda (default: cuda when available)")
    add_dtype_arg(p, "torch: weights and KV dtype")
    add("--prompt-tokens", type=positive_int, help="the arriving prompt's length (default 16384; torch 2048)")
    add("--streams", type=positive_int, default=16, help="streams already decoding (default %(default)s)")
    add(
        "--context-tokens",
        type=positive_int,
        help="each stream's context when the prompt arrives (default 1024; torch 256)",
    )
    add(
        "--chunk-tokens",
        type=positive_int,
        help="prompt tokens per chunked step (default 256; torch: the measured ridge)",
    )
    add(
        "--step-budget-ms",
        type=positive_float,
        metavar="MS",
        help="chunked sizes its chunks by time: each step's predicted time stays within MS (chunks shrink "
        "along the prompt as attention over its earlier chunks grows); torch: needs --profile, the "
        "measured model that predicts",
    )
    add(
        "--sweep",
        type=int_list,
        metavar="C1,C2,...",
        help="chunk sizes to sweep (default 16..8192, powers of two; torch 16..512)",
    )
    add("--json", action="store_true", help="print one JSON object instead of the table")
    add("--plot", metavar="DIR", help="write the timeline and sweep figures (PNG + SVG) to DIR")
    add(
        "--html",
        metavar="FILE",
        help="write the interactive page as one self-contained file (its chunk slider steps through the sweep)",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.html and args.engine != "roofline":
        raise UsageError("--html precomputes a chunk sweep on the roofline; it does not run --engine torch")
    result = explanation(args)
    out = result.to_json()
    if args.html:
        from stallfree.ui.export import write_html

        out["html"] = str(write_html(args, args.html))
    if args.plot:
        from stallfree.explain.plots import plot_explanation

        paths = plot_explanation(result, args.plot)
        out["figures"] = [str(p) for p in paths]
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(format_table(out))
    return 0


def explanation(args: argparse.Namespace) -> Explanation:
    """What ``stallfree explain`` reports for parsed ``args`` (``stallfree ui`` calls it too)."""
    from stallfree.explain import DEFAULT_SWEEP, Scenario, explain

    if getattr(args, "step_budget_ms", None) and args.engine == "torch" and args.profile is None:
        # The engine's timer runs plans; a time budget needs a prediction before running one.
        raise UsageError(
            "--engine torch --step-budget-ms needs --profile FILE (a `stallfree profile` of this "
            "machine): its measured model predicts each candidate step"
        )
    measured = args.engine == "roofline" and (args.profile is not None or args.cost_model == "measured")
    # A profile is of the engine: the scenario defaults are --engine torch's, for a like-for-like run.
    defaults = DEFAULTS["torch" if measured else args.engine]
    model = args.model or defaults["model"]
    prompt = args.prompt_tokens or defaults["prompt_tokens"]
    context = args.context_tokens or defaults["context_tokens"]
    sweep = args.sweep or (DEFAULT_SWEEP if args.engine == "roofline" else ENGINE_SWEEP)
    roofline: RooflineTimer | None = None
    timer: StepTimer
    if measured:
        timer, echo = _measured(args)
    elif args.engine == "roofline":
        roofline, echo = _roofline(args, model)
        timer = roofline
    else:
        timer, echo = _torch(args, model, prompt, context, sweep)
    chunk = args.chunk_tokens or defaults["chunk_tokens"]
    if chunk is None:
        chunk = int(timer.ridge_tokens(args.streams, context))
    budget_ms = getattr(args, "step_budget_ms", None)
    scenario = Scenario(
        prompt, args.streams, context, chunk, step_budget_s=budget_ms / 1000 if budget_ms else None
    )
    warnings = _deployment_warnings(roofline.cost_model.config, scenario) if roofline else []
    if budget_ms:
        echo["step_budget_ms"] = budget_ms
    if args.engine != "torch" or args.profile is None:
        return explain(scenario, timer, sweep, echo, warnings=warnings)
    # A real run with a profile: the measured model plans a time budget's chunks, and prices the
    # same scenario beside the run (its error, in the same run).
    from dataclasses import replace

    from stallfree.explain.roofline import PricedTimer
    from stallfree.sim.measured import MeasuredCostModel

    cost = MeasuredCostModel.from_file(args.profile)
    echo["profile"] = args.profile
    run = explain(scenario, timer, sweep, echo, warnings=warnings, predictor=cost.step_time_s)
    priced = explain(scenario, PricedTimer(cost, cost.ridge_tokens), ())
    return replace(run, predicted=priced.runs)


def _roofline(args: argparse.Namespace, model_name: str) -> tuple[RooflineTimer, dict[str, Any]]:
    from stallfree.explain import RooflineTimer
    from stallfree.sim.cost_model import CostModel, CostModelConfig
    from stallfree.specs import load_hardware_spec, load_model_spec

    model = load_model_spec(model_name)
    hardware = load_hardware_spec(args.hardware)
    cost = CostModel(CostModelConfig(model, hardware, tp=args.tp, kind=args.cost_model))
    _check_weights_fit(cost.config)
    echo = {
        "model": model.name,
        "hardware": hardware.name,
        "tp": args.tp,
        "cost_model": args.cost_model,
        "engine": "roofline",
    }
    return RooflineTimer(cost), echo


def _measured(args: argparse.Namespace) -> tuple[StepTimer, dict[str, Any]]:
    from stallfree.cli.common import measured_profile
    from stallfree.explain.roofline import PricedTimer
    from stallfree.sim.measured import MeasuredCostModel

    path = measured_profile(args)
    assert path is not None
    cost = MeasuredCostModel.from_file(path)
    fp = cost.profile.fingerprint
    echo = {
        "model": str(fp.get("model")),
        "hardware": f"{fp.get('device')} ({fp.get('device_name')})",
        "tp": 1,
        "cost_model": "measured",
        "profile": path,
        "engine": "measured profile",
    }
    return PricedTimer(cost, cost.ridge_tokens), echo


def _check_weights_fit(config: CostModelConfig) -> None:
    """Refuse a deployment whose weights do not fit (as ``simulate`` does)."""
    model, hardware, tp = config.model, config.hardware, config.tp
    usable = hardware.mem_capacity_bytes * tp * MEM_UTILIZATION
    weights = model.weight_bytes(config.dtype_bytes)
    if weights >= usable:
        raise UsageError(
            f"{model.name}'s weights ({weights / 1e9:,.1f} GB) do not fit on {tp} x {hardware.name} "
            f"({usable / 1e9:,.1f} GB at utilisation {MEM_UTILIZATION}); raise --tp or pick larger hardware"
        )


def _deployment_warnings(config: CostModelConfig, scenario: Scenario) -> list[str]:
    """What a real server could not run as shown: the model's context, and each policy's KV memory."""
    from stallfree.sim.memory import kv_memory

    model, hardware, tp = config.model, config.hardware, config.tp
    prompt, context, streams = scenario.prompt_tokens, scenario.context_tokens, scenario.streams
    warnings = []
    limit = model.max_position_embeddings
    if context + prompt > limit:
        warnings.append(
            f"a {prompt:,}-token prompt beside {context:,}-token streams exceeds {model.name}'s "
            f"{limit:,}-token context: a real server would reject it"
        )
    # Each stream grows one token per step: lead and tail steps, plus the prompt's steps.
    prompt_steps = {"prefill-first": 1, "chunked": ceil_div(prompt, scenario.chunk_tokens)}
    step_tokens = {"prefill-first": prompt, "chunked": scenario.chunk_tokens + streams}
    for policy, steps in prompt_steps.items():
        needed = streams * (context + scenario.lead_steps + scenario.tail_steps + steps + 1) + prompt
        try:
            kv = kv_memory(
                model,
                hardware,
                tp=tp,
                gpu_memory_utilization=MEM_UTILIZATION,
                dtype_bytes=config.dtype_bytes,
                max_num_batched_tokens=step_tokens[policy],
            )
            held = kv.num_tokens
        except ValueError:
            held = 0
        if held < needed:
            warnings.append(
                f"{policy} needs {needed:,} KV-cache tokens; beside the weights and its "
                f"{step_tokens[policy]:,}-token step's activations, {tp} x {hardware.name} holds {held:,}: "
                "a real server would preempt or queue (the figures assume it does not)"
            )
    return warnings


def _torch(
    args: argparse.Namespace, model_name: str, prompt: int, context: int, sweep: Sequence[int]
) -> tuple[StepTimer, dict[str, Any]]:
    try:
        import torch

        from stallfree.engine.dtypes import choose_dtype
        from stallfree.explain.engine import EngineTimer
    except ImportError as exc:
        raise UsageError(
            f"--engine torch needs the engine extra (pip install -e '.[engine]'): {exc}"
        ) from None
    check_device(args.device)  # one line and exit 2, not a torch traceback from inside a kernel
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = choose_dtype(args.dtype, torch.device(device))
    if dtype.note:
        print(f"note: {dtype.note}", file=sys.stderr)
    smallest = min([*sweep, args.chunk_tokens or 8])
    # Streams grow by one token per step; a chunked run takes at most prompt / chunk steps.
    stream_tokens = context + ceil_div(prompt, smallest) + 32
    timer = EngineTimer(
        model_name,
        max_tokens=args.streams * stream_tokens + prompt + 64,
        max_seq_tokens=max(prompt + 1, stream_tokens),
        dtype=dtype.dtype,
        device=device,
    )
    hardware = (
        torch.cuda.get_device_name(device)
        if device.startswith("cuda")
        else f"{torch.get_num_threads()}-thread CPU"
    )
    echo = {
        "model": timer.model.spec.name,
        "hardware": hardware,
        "tp": 1,
        "cost_model": "measured",
        "engine": f"torch {dtype.name} on {device}",
    }
    return timer, echo


_CHUNK_NOTES = {
    "full": "  [attention over earlier chunks is charged]",
    "weights-only": "  [weights-only model: attention not charged; try --cost-model full]",
}
_RIDGE_NOTES = {"measured": " (measured: a mixed step costs <= 1.2x a decode step)"}


def _chunking(sc: dict[str, Any]) -> str:
    """How the chunked run cut the prompt: by a step-time target or a fixed chunk."""
    if sc.get("step_budget_ms"):
        return f"{sc['step_budget_ms']:g} ms steps"
    return f"{sc['chunk_tokens']}-token chunks"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms" if seconds < 1 else f"{seconds:,.2f} s"


def format_table(out: dict[str, Any]) -> str:
    """The human-readable report of an explain JSON object."""
    sc = out["scenario"]
    lines = [
        f"{sc['model']} on {sc['tp']} x {sc['hardware']} ({sc['engine']}, cost model: {sc['cost_model']})",
        f"{sc['streams']} streams decoding at {sc['context_tokens']:,} tokens of context; a {sc['prompt_tokens']:,}-token prompt arrives.",
        *(f"warning: {w}" for w in out.get("warnings", ())),
        "",
        f"  decode step ({sc['streams']} streams)   {_ms(out['decode_step_s'])}",
        f"  prompt prefill alone        {_ms(out['prefill_alone_s'])}",
        f"  ridge point                 {out['ridge_tokens']:,.0f} tokens per step"
        + _RIDGE_NOTES.get(sc["cost_model"], ""),
        "",
        f"  {'policy':<28}{'longest gap':>14}{'median gap':>14}{'prompt TTFT':>14}{'vs alone':>10}",
    ]
    for name, p in out["policies"].items():
        label = f"{name} ({_chunking(sc)})" if name == "chunked" else name
        lines.append(
            f"  {label:<28}{_ms(p['max_gap_s']):>14}{_ms(p['median_gap_s']):>14}{_ms(p['ttft_s']):>14}{p['ttft_vs_alone']:>9.3f}x"
        )
    if out.get("predicted"):
        lines += [
            "",
            f"  the same scenario priced by the profile {sc['profile']} (x predicted / measured):",
            f"  {'policy':<28}{'longest gap':>20}{'median gap':>20}{'prompt TTFT':>20}",
        ]
        for name, p in out["predicted"].items():
            label = f"{name} ({_chunking(sc)})" if name == "chunked" else name
            cells = (f"{_ms(m['predicted'])} x{m['ratio']:.2f}" for m in p.values())
            lines.append(f"  {label:<28}" + "".join(f"{c:>20}" for c in cells))
    pc = out["prompt_chunks"]
    lines += [
        "",
        f"  chunked: the prompt's {pc['num_steps']} chunk steps cost {_ms(pc['first_step_s'])} (first) to "
        f"{_ms(pc['last_step_s'])} (last): {pc['last_vs_first']:.2f}x"
        + _CHUNK_NOTES.get(sc["cost_model"], ""),
    ]
    if sc.get("step_budget_ms"):
        sizes = pc["chunk_tokens"]
        over = pc["num_steps_over_budget"]
        lines.append(
            f"  chunk sizes along the prompt: {sizes[0]:,} (first) to {sizes[-2] if len(sizes) > 1 else sizes[0]:,} "
            f"(last full one) tokens; longest step {_ms(pc['max_step_s'])}; "
            + (
                f"{over} step(s) over the {sc['step_budget_ms']:g} ms target"
                if over
                else "every step within the target"
            )
        )
    lines += [
        "",
        f"  chunk sweep (ridge ~{out['ridge_tokens']:,.0f} tokens):",
        f"  {'chunk':>8}{'longest gap':>14}{'prompt TTFT':>14}{'vs alone':>10}",
    ]
    ridge = out["ridge_tokens"]
    nearest = min(
        (row["chunk_tokens"] for row in out["sweep"]), key=lambda c: abs(math.log(c / ridge)), default=0
    )
    for row in out["sweep"]:
        mark = "  <- ridge" if row["chunk_tokens"] == nearest else ""
        lines.append(
            f"  {row['chunk_tokens']:>8,}{_ms(row['max_gap_s']):>14}{_ms(row['ttft_s']):>14}{row['ttft_vs_alone']:>9.3f}x{mark}"
        )
    if "figures" in out:
        lines += ["", "  figures: " + ", ".join(out["figures"])]
    if "html" in out:
        lines += ["", f"  page: {out['html']}"]
    return "\n".join(lines)
