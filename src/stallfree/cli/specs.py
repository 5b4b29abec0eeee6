"""``stallfree specs``: list the model and hardware presets, or print a pair's derived figures."""

from __future__ import annotations

import argparse
import json
from typing import Any

from stallfree.cli.common import (
    positive_int,
)
from stallfree.cli.cost_args import (
    ROOFLINE_DTYPE_BYTES,
    add_roofline_args,
    add_roofline_dtype_arg,
    gpu_tables_of,
    measured_profile,
)

_DESCRIPTION = """\
Without options: list the model and hardware presets.
With --model and/or --hardware: print what follows from them. For a model: parameter
count, weight bytes and KV-cache bytes per token. For a pair: also the KV-cache capacity
in tokens at 90% memory utilisation after the weights, decode step times for 1/16/64
streams, prefill throughput, and the ridge point (tokens per step at which compute time
equals the weight-read time), from the roofline cost model. --cost-model measured with no
--profile, on an a100-*/h100-* preset: the same figures from Vidur's shipped GPU tables, with
what is measured and what is modelled, and achieved figures by tokens per step.
--profile FILE: the CPU profile's fitted measured model instead.
"""

_EPILOG = """\
examples:
  stallfree specs
  stallfree specs --model llama-3-70b --hardware a100-40gb --tp 4
  stallfree specs --model llama-3-8b --hardware a100-80gb --cost-model measured
  stallfree specs --model path/to/config.json --hardware my-gpu.json --json
hardware JSON fields: name, peak_flops_per_s, mem_bandwidth_bytes_per_s, mem_capacity_bytes,
  interconnect_bandwidth_bytes_per_s, interconnect_latency_s (optional)
"""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "specs",
        help="list model/hardware presets, or show a pair's derived figures",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_roofline_args(parser, model=None, hardware=None, cost_model="weights-only")
    add_roofline_dtype_arg(parser, "bf16")
    parser.add_argument(
        "--context-tokens",
        type=positive_int,
        default=2048,
        help="cached tokens per decoding stream, for --cost-model full or measured (default 2048)",
    )
    parser.add_argument(
        "--prompt-tokens",
        type=positive_int,
        default=16384,
        help="prompt length for the prefill throughput figure (default 16384)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.set_defaults(handler=run)


def _presets(as_json: bool) -> str:
    """Every model and hardware preset: a table, or one JSON object."""
    from stallfree.costs.specs_report import hardware_figures, model_figures, presets_table
    from stallfree.specs import HARDWARE_PRESETS, MODEL_PRESETS, load_model_spec

    models = [load_model_spec(name) for name in MODEL_PRESETS]
    hardware = list(HARDWARE_PRESETS.values())
    if not as_json:
        return presets_table(models, hardware)
    figures = {
        "models": [model_figures(m, 2) for m in models],
        "hardware": [hardware_figures(h) for h in hardware],
    }
    return json.dumps(figures, indent=2)


def run(args: argparse.Namespace) -> int:
    from stallfree.costs.choice import resolve_model
    from stallfree.costs.specs_report import (
        hardware_figures,
        kv_capacity_tokens,
        model_figures,
        report_text,
        step_figures,
    )
    from stallfree.specs import load_hardware_spec

    profile = measured_profile(args, gpu_tables=True)
    if profile is not None:
        from stallfree.costs.measured import MeasuredCostModel
        from stallfree.costs.measured_report import format_parameters

        params = MeasuredCostModel.from_file(profile).parameters()
        print(json.dumps(params, indent=2) if args.json else format_parameters(params))
        return 0
    if args.model is None and args.hardware is None:
        print(_presets(args.json))
        return 0

    report: dict[str, Any] = {"dtype": args.dtype}
    dtype_bytes = ROOFLINE_DTYPE_BYTES[args.dtype]
    model = resolve_model(args.model) if args.model is not None else None
    hw = load_hardware_spec(args.hardware) if args.hardware is not None else None
    if model is not None:
        report["model"] = model_figures(model, dtype_bytes)
    if hw is not None:
        report["hardware"] = hardware_figures(hw)
    if model is not None and hw is not None:
        kv_tokens = kv_capacity_tokens(model, hw, args.tp, dtype_bytes)
        figures = (args.tp, kv_tokens, args.context_tokens, args.prompt_tokens)
        from stallfree.costs.aiconfigurator import AicCostModel
        from stallfree.costs.choice import CostChoice, pick_cost_model
        from stallfree.costs.vidur import GpuMeasuredCostModel

        def choice(kind: str) -> CostChoice:
            return CostChoice(kind, model, hw, args.tp, dtype_bytes=dtype_bytes, **gpu_tables_of(args))

        # no --profile here: measured is a GPU preset's tables, shown beside the full roofline
        pick = pick_cost_model(choice(args.cost_model))
        if isinstance(pick.pricer, GpuMeasuredCostModel | AicCostModel):
            report["measured"] = {
                **step_figures(pick.pricer, "measured", *figures),
                **pick.pricer.describe(),
            }
            pick = pick_cost_model(choice("full"))
        report["roofline"] = step_figures(pick.pricer, pick.kind, *figures)
        report["roofline"]["expert_parallel"] = args.expert_parallel
    print(json.dumps(report, indent=2) if args.json else report_text(report))
    return 0
