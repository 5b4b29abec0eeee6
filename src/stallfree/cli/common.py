"""Argument helpers shared by the subcommands (parsing only, no behaviour)."""

from __future__ import annotations

import argparse


class UsageError(Exception):
    """Bad input from the command line: printed as one line, exit code 2."""


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


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
        choices=("seed", "full"),
        default=cost_model,
        help="seed: weights only, the seed explainer's arithmetic; full: + attention FLOPs, KV-cache "
        f"reads and writes, LM head, TP all-reduce (default {cost_model})",
    )
