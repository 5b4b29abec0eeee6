"""Argument helpers shared by the subcommands (parsing only, no behaviour)."""

from __future__ import annotations

import argparse
from pathlib import Path


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


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (value >= 0 and value < float("inf")):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {value}")
    return value


def int_list(text: str) -> list[int]:
    """``16,32,64`` -> [16, 32, 64], each positive."""
    return [positive_int(part) for part in text.split(",") if part.strip()]


# stallfree.engine.dtypes.DTYPE_CHOICES, spelled out so that parsing never imports torch.
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")


def add_dtype_arg(parser: argparse._ActionsContainer, what: str = "weights and KV dtype") -> None:
    """``--dtype``: every engine entry point's, with the one ``auto`` rule (stallfree.engine.dtypes)."""
    parser.add_argument(
        "--dtype",
        choices=DTYPE_CHOICES,
        default="auto",
        help=f"{what}; auto: bfloat16 on CUDA; on a CPU with AVX512-BF16, bf16 weights through the "
        "compiled kernels with float32 activations and KV cache (--quantization bf16); else bfloat16 on "
        "AVX-512, float32 on AVX2 (default %(default)s)",
    )


# stallfree.engine.model.QUANTIZATIONS, spelled out so that parsing never imports torch.
QUANTIZATIONS = ("q8_0", "bf16")


def add_quantization_arg(parser: argparse._ActionsContainer) -> None:
    """``--quantization``: how the engine stores its matmul weights."""
    parser.add_argument(
        "--quantization",
        choices=QUANTIZATIONS,
        help="q8_0: the matmul weights as llama.cpp's Q8_0 (int8 in blocks of 32, one scale each; "
        "a Q8_0 GGUF's own blocks, bit for bit); bf16: the matmul weights in bf16 (a bf16 "
        "checkpoint's own values); either with fp32 activations and KV cache, on the CPU "
        "(default: the weights in --dtype)",
    )


ENGINE_MODELS = "random:<preset>, a GGUF file (a .gguf path or a short name: smollm2) or a local HF folder"
"""The models the PyTorch engine loads (stallfree.engine.weights.load_model), as help text says it."""


def check_writable(path: Path, flag: str) -> None:
    """Fail now, not after minutes of work, if ``flag``'s file cannot be written at ``path``."""
    if path.is_dir():
        raise UsageError(f"{flag} {path} is a directory")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        existed = path.exists()
        with path.open("a"):
            pass
        if not existed:
            path.unlink()
    except OSError as error:
        raise UsageError(f"{flag} {path}: {error.strerror or error}") from None
