"""Argument helpers shared by the subcommands (parsing only, no behaviour)."""

from __future__ import annotations

import argparse
from typing import Any


class UsageError(Exception):
    """Bad input from the command line: printed as one line, exit code 2."""


def _whole_number(text: str, minimum: int, rule: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{rule}, got {value}")
    return value


def positive_int(text: str) -> int:
    return _whole_number(text, 1, "must be positive")


def non_negative_int(text: str) -> int:
    return _whole_number(text, 0, "must be >= 0")


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def int_list(text: str) -> list[int]:
    """``16,32,64`` -> [16, 32, 64], each positive."""
    return [positive_int(part) for part in text.split(",") if part.strip()]


def add_roofline_args(
    parser: argparse._ActionsContainer, *, model: str | None, hardware: str | None, cost_model: str
) -> None:
    """``--model --hardware --tp --cost-model``, as every roofline command takes them.

    ``None`` defaults leave the option unset (the command decides what that means).
    """

    def default(value: str | None) -> str:
        return f" (default {value})" if value is not None else ""

    parser.add_argument(
        "--model",
        default=model,
        help="preset name, a HF config.json, or a folder holding one" + default(model),
    )
    parser.add_argument(
        "--hardware", default=hardware, help="preset name or a hardware JSON file" + default(hardware)
    )
    parser.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel GPUs (default 1)")
    parser.add_argument(
        "--cost-model",
        type=cost_model_arg,
        choices=COST_MODEL_CHOICES,
        default=cost_model,
        help="weights-only (alias seed): the seed explainer's arithmetic; full: + attention FLOPs, KV-cache "
        "reads and writes, LM head, TP all-reduce; measured: fitted to a `stallfree profile` file "
        f"(--profile) of the real engine (default {cost_model})",
    )
    parser.add_argument(
        "--profile",
        metavar="FILE",
        help="step profile from `stallfree profile` (implies --cost-model measured)",
    )


COST_MODEL_CHOICES = ("weights-only", "full", "measured")


def measured_profile(args: argparse.Namespace) -> str | None:
    """The profile file of ``--cost-model measured`` (``--profile`` alone implies it), else None."""
    if args.profile is not None:
        args.cost_model = "measured"
    elif args.cost_model == "measured":
        raise UsageError("--cost-model measured needs --profile FILE (write one with `stallfree profile`)")
    return str(args.profile) if args.profile is not None else None


def cost_model_arg(text: str) -> str:
    """``--cost-model`` with its aliases resolved (``seed`` is ``weights-only``)."""
    from stallfree.sim.cost_model import cost_model_kind

    return cost_model_kind(text)


ENGINE_OPTIONS = (
    "dtype",
    "device",
    "policy",
    "token_budget",
    "chunk_tokens",
    "max_num_seqs",
    "max_model_len",
    "num_blocks",
    "block_size",
)


def add_engine_args(parser: argparse._ActionsContainer) -> None:
    """The PyTorch engine's options (``--model`` and :data:`ENGINE_OPTIONS`), for generate and serve."""
    from stallfree.core import POLICIES

    parser.add_argument(
        "--model", default="random:small", help="random:<preset> or a local HF folder (default %(default)s)"
    )
    parser.add_argument(
        "--dtype", default="auto", help="auto, float32, bfloat16 or float16 (default %(default)s)"
    )
    parser.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    parser.add_argument(
        "--policy", choices=POLICIES, default="chunked", help="scheduling policy (default %(default)s)"
    )
    parser.add_argument("--token-budget", type=positive_int, help="tokens per step (chunked default 512)")
    parser.add_argument(
        "--chunk-tokens", type=positive_int, help="chunked: prompt tokens per step instead of a budget"
    )
    parser.add_argument(
        "--max-num-seqs",
        type=positive_int,
        default=256,
        help="running requests at most (default %(default)s)",
    )
    parser.add_argument("--max-model-len", type=positive_int, help="context length (default: the model's)")
    parser.add_argument(
        "--num-blocks", type=positive_int, help="KV-cache blocks (default: sized from free memory)"
    )
    parser.add_argument(
        "--block-size", type=positive_int, default=16, help="tokens per KV block (default 16)"
    )


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """:data:`ENGINE_OPTIONS` from parsed ``args``, as ``LLMEngine`` keyword arguments."""
    return {name: getattr(args, name) for name in ENGINE_OPTIONS}
