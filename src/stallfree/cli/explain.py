"""``stallfree explain``: the seed's long-prompt arrival, prefill-first vs chunked, one clock."""

from __future__ import annotations

import argparse
import json
from typing import Any

from stallfree.cli.common import int_list, positive_int

DEFAULTS = {"model": "llama-3-70b", "hardware": "a100-40gb", "tp": 4}


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "explain",
        help="the seed's scenario: N streams decoding, a long prompt arrives; prefill-first vs chunked",
        description=(
            "N streams are decoding when a long prompt arrives. Prefill-first runs the prompt whole in a "
            "step of its own and every stream goes silent; chunked (stall-free) cuts it into chunks that "
            "ride inside the decode steps. Prints both on one clock, then a chunk-size sweep. Defaults "
            "reproduce the seed: Llama-3-70B on 4 x A100-40GB, 16 streams, a 16,384-token prompt, 256-token chunks."
        ),
    )
    p.add_argument(
        "--model",
        default=DEFAULTS["model"],
        help="preset name or path to a HF config.json (default %(default)s)",
    )
    p.add_argument(
        "--hardware",
        default=DEFAULTS["hardware"],
        help="preset name or path to a hardware JSON (default %(default)s)",
    )
    p.add_argument(
        "--tp", type=positive_int, default=DEFAULTS["tp"], help="tensor-parallel GPUs (default %(default)s)"
    )
    p.add_argument(
        "--prompt-tokens",
        type=positive_int,
        default=16384,
        help="the arriving prompt's length (default %(default)s)",
    )
    p.add_argument(
        "--decoders", type=positive_int, default=16, help="streams already decoding (default %(default)s)"
    )
    p.add_argument(
        "--context-tokens",
        type=positive_int,
        default=1024,
        help="each stream's context when the prompt arrives (default %(default)s)",
    )
    p.add_argument(
        "--chunk-tokens",
        type=positive_int,
        default=256,
        help="prompt tokens per chunked step (default %(default)s)",
    )
    p.add_argument(
        "--cost-model",
        choices=("seed", "full"),
        default="seed",
        help="seed: weights-only roofline, the seed's arithmetic; full: + attention, KV traffic, LM head, TP all-reduce (default %(default)s)",
    )
    p.add_argument(
        "--sweep",
        type=int_list,
        default=None,
        metavar="C1,C2,...",
        help="chunk sizes to sweep (default 16..8192, powers of two)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--plot", metavar="DIR", help="write the timeline and sweep figures (PNG + SVG) to DIR")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from stallfree.explain import DEFAULT_SWEEP, Scenario, explain
    from stallfree.sim.backend import CostModelBackend
    from stallfree.sim.cost_model import CostModel, CostModelConfig
    from stallfree.specs import load_hardware_spec, load_model_spec

    model = load_model_spec(args.model)
    hardware = load_hardware_spec(args.hardware)
    cost = CostModel(CostModelConfig(model, hardware, tp=args.tp, kind=args.cost_model))
    scenario = Scenario(args.prompt_tokens, args.decoders, args.context_tokens, args.chunk_tokens)
    echo = {
        "model": model.name,
        "hardware": hardware.name,
        "tp": args.tp,
        "cost_model": args.cost_model,
        "engine": "roofline",
    }
    result = explain(scenario, CostModelBackend(cost), args.sweep or DEFAULT_SWEEP, echo)
    out = result.to_json()
    if args.plot:
        from stallfree.plots.explain import plot_explanation

        paths = plot_explanation(result, args.plot)
        out["figures"] = [str(p) for p in paths]
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(format_table(out))
    return 0


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms" if seconds < 1 else f"{seconds:,.2f} s"


def format_table(out: dict[str, Any]) -> str:
    """The human-readable report of an explain JSON object."""
    sc = out["scenario"]
    lines = [
        f"{sc['model']} on {sc['tp']} x {sc['hardware']} ({sc['engine']}, cost model: {sc['cost_model']})",
        f"{sc['decoders']} streams decoding at {sc['context_tokens']:,} tokens of context; a {sc['prompt_tokens']:,}-token prompt arrives.",
        "",
        f"  decode step ({sc['decoders']} streams)   {_ms(out['decode_step_s'])}",
        f"  prompt prefill alone        {_ms(out['prefill_alone_s'])}",
        f"  ridge point                 {out['ridge_tokens']:,.0f} tokens per step",
        "",
        f"  {'policy':<28}{'longest gap':>14}{'median gap':>14}{'prompt TTFT':>14}{'vs alone':>10}",
    ]
    for name, p in out["policies"].items():
        label = f"{name} ({sc['chunk_tokens']}-token chunks)" if name == "chunked" else name
        lines.append(
            f"  {label:<28}{_ms(p['max_gap_s']):>14}{_ms(p['median_gap_s']):>14}{_ms(p['ttft_s']):>14}{p['ttft_vs_alone']:>9.3f}x"
        )
    pc = out["prompt_chunks"]
    lines += [
        "",
        f"  chunked: the prompt's {pc['num_steps']} chunk steps cost {_ms(pc['first_step_s'])} (first) to "
        f"{_ms(pc['last_step_s'])} (last): {pc['last_vs_first']:.2f}x"
        + (
            "  [attention over earlier chunks is charged]"
            if sc["cost_model"] == "full"
            else "  [seed model: attention not charged; try --cost-model full]"
        ),
        "",
        f"  chunk sweep (ridge ~{out['ridge_tokens']:,.0f} tokens):",
        f"  {'chunk':>8}{'longest gap':>14}{'prompt TTFT':>14}{'vs alone':>10}",
    ]
    ridge = out["ridge_tokens"]
    for row in out["sweep"]:
        mark = "  <- ridge" if row["chunk_tokens"] / 2 < ridge <= row["chunk_tokens"] else ""
        lines.append(
            f"  {row['chunk_tokens']:>8,}{_ms(row['max_gap_s']):>14}{_ms(row['ttft_s']):>14}{row['ttft_vs_alone']:>9.3f}x{mark}"
        )
    if "figures" in out:
        lines += ["", "  figures: " + ", ".join(out["figures"])]
    return "\n".join(lines)
