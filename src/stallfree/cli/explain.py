"""``stallfree explain``: the seed's long-prompt arrival, prefill-first vs chunked, one clock.

This module only parses and prints: the flags become an :class:`~stallfree.explain.options.
ExplainOptions` (its field defaults are the flags' defaults), :func:`~stallfree.explain.backends.
run_explain` runs it, and :func:`~stallfree.explain.report.format_explain` is the table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from dataclasses import fields
from typing import TYPE_CHECKING

from stallfree.cli.common import (
    ENGINE_MODELS,
    UsageError,
    add_dtype_arg,
    int_list,
    positive_float,
    positive_int,
)
from stallfree.cli.cost_args import (
    add_gpu_table_args,
    add_kv_link_arg,
    cost_model_arg,
)
from stallfree.cli.device import check_device
from stallfree.explain.options import ENGINES, EXPLAIN_COST_MODELS, ExplainOptions

if TYPE_CHECKING:
    from stallfree.explain import Explanation

DEFAULT = ExplainOptions()


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
    _add_engine_args(p)
    _add_scenario_args(p)
    _add_variant_args(p)
    _add_output_args(p)
    p.set_defaults(handler=run)


def _add_engine_args(p: argparse.ArgumentParser) -> None:
    """What runs the scenario and prices its steps: the engine, model, hardware and cost model."""
    add = p.add_argument
    add(
        "--engine",
        choices=ENGINES,
        default=DEFAULT.engine,
        help="roofline: step times from the cost model; torch: measured on the real engine (needs the engine extra)",
    )
    add(
        "--model",
        help="roofline: preset or HF config.json (default llama-3-70b); "
        f"torch: {ENGINE_MODELS} (default random:medium)",
    )
    add(
        "--hardware", default=DEFAULT.hardware, help="roofline: preset or hardware JSON (default %(default)s)"
    )
    add(
        "--tp",
        type=positive_int,
        default=DEFAULT.tp,
        help="roofline: tensor-parallel GPUs (default %(default)s)",
    )
    add(
        "--cost-model",
        type=cost_model_arg,
        choices=EXPLAIN_COST_MODELS,
        default=DEFAULT.cost_model,
        help="roofline: weights-only (alias seed) = the seed's arithmetic; full = + attention, KV traffic, "
        "LM head, TP all-reduce; measured = a --profile, or a GPU preset's measured tables (see "
        "--gpu-tables) (default %(default)s)",
    )
    add_gpu_table_args(p)
    add(
        "--profile",
        metavar="FILE",
        help="a `stallfree profile` file: steps priced by the measured model (with --engine torch: the run as "
        "measured and, beside it, the same scenario priced by the profile, predicted / measured)",
    )
    add("--device", help="torch: cpu or cuda (default: cuda when available)")
    add_dtype_arg(p, "torch: weights and KV dtype")


def _add_scenario_args(p: argparse.ArgumentParser) -> None:
    """The scenario: the arriving prompt, the streams decoding, and how chunked cuts the prompt."""
    add = p.add_argument
    add("--prompt-tokens", type=positive_int, help="the arriving prompt's length (default 16384; torch 2048)")
    add(
        "--streams",
        type=positive_int,
        default=DEFAULT.streams,
        help="streams already decoding (default %(default)s)",
    )
    add(
        "--context-tokens",
        type=positive_int,
        help="each stream's context when the prompt arrives (default 1024; torch 256)",
    )
    add(
        "--cached-prefix-tokens",
        type=int,
        default=0,
        metavar="N",
        help="the prompt's first N tokens are already in the prefix cache (earlier traffic shared them): "
        "only its tail is computed and chunked (default 0)",
    )
    add(
        "--cached-prefix-link",
        metavar="LINK",
        help="with --cached-prefix-tokens: that prefix sits in a KV tier below the GPU's cache, loaded over "
        "LINK first (host memory: pcie4, pcie5; a shared store: ib-200, ib-400, ...; or GB/s a GPU) while "
        "the streams run; the prompt's TTFT counts the load (default: in the GPU's cache)",
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


def _add_variant_args(p: argparse.ArgumentParser) -> None:
    """What is shown beside prefill-first and chunked: drafts, disaggregation, the chunk sweep."""
    add = p.add_argument
    add(
        "--speculative-tokens",
        type=int,
        default=0,
        metavar="K",
        help="add the streams verifying up to K draft tokens a step, in steps as large as chunked's "
        "(streams + chunk): a run under vLLM's rule (drafts take the budget before the prompt), one "
        "under SGLang's (prompts in steps of their own), and a sweep over 0..K drafts (default 0)",
    )
    add(
        "--acceptance-rate",
        default="0.7",
        metavar="RATE",
        help="with --speculative-tokens: the share of draft tokens accepted, each independently, or "
        "one rate a position as vLLM reports them (0.8,0.6,0.45,0.3) (default %(default)s)",
    )
    add(
        "--disaggregate",
        metavar="xPyD",
        help="add the prompt served disaggregated: x prefill and y decode groups of --tp GPUs each, the "
        "prompt's KV shipped over --kv-link to the streams' group (1P1D, 2P4D; the roofline or GPU tables)",
    )
    add_kv_link_arg(add, "with --disaggregate")
    add(
        "--sweep",
        type=int_list,
        metavar="C1,C2,...",
        help="chunk sizes to sweep (default 16..8192, powers of two; torch 16..512)",
    )


def _add_output_args(p: argparse.ArgumentParser) -> None:
    """How the result comes out: the table or JSON, figures, the interactive page."""
    add = p.add_argument
    add("--json", action="store_true", help="print one JSON object instead of the table")
    add("--plot", metavar="DIR", help="write the timeline and sweep figures (PNG + SVG) to DIR")
    add(
        "--html",
        metavar="FILE",
        help="write the interactive page as one self-contained file (its chunk slider steps through the sweep)",
    )


def run(args: argparse.Namespace) -> int:
    if args.html and args.engine != "roofline":
        raise UsageError("--html precomputes a chunk sweep on the roofline; it does not run --engine torch")
    options = explain_options(args)
    result = _run(options)
    out = result.to_json()
    if args.html:
        from stallfree.ui.export import write_html

        out["html"] = str(write_html(options, args.html))
    if args.plot:
        from stallfree.explain.plots import plot_explanation

        paths = plot_explanation(result, args.plot)
        out["figures"] = [str(p) for p in paths]
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        from stallfree.explain.report import format_explain

        print(format_explain(out))
    return 0


def explain_options(args: argparse.Namespace) -> ExplainOptions:
    """The parsed flags as options: one flag per field, same name, nothing decided here."""
    return ExplainOptions(**{f.name: getattr(args, f.name) for f in fields(ExplainOptions)})


def explanation(args: argparse.Namespace) -> Explanation:
    """What ``stallfree explain`` reports for parsed ``args``."""
    return _run(explain_options(args))


def _run(options: ExplainOptions) -> Explanation:
    from stallfree.explain.backends import run_explain

    if options.engine == "torch":
        # One line and exit 2, not a torch traceback from inside a kernel; with no torch at all,
        # run_explain says which extra to install.
        with contextlib.suppress(ImportError):
            check_device(options.device)
    return run_explain(options)
