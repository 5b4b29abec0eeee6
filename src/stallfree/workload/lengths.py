"""Length distributions of a workload: how many prompt tokens each request has, and its ``max_tokens``.

Each distribution is a frozen value with ``sample(num_requests, rng) -> (prompts, outputs)``,
two int64 arrays of positive lengths. :func:`parse_lengths` reads the command-line form and
:func:`cap_lengths` applies a workload's caps. Used through :mod:`stallfree.workload`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from stallfree.workload.traces import load_trace, resolve_trace_path

IntArray = npt.NDArray[np.int64]

SAMPLING_MODES = ("with-replacement", "without-replacement", "in-order")


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
            raise ValueError(f"{name} must be a positive whole number, got {value!r}")


@dataclass(frozen=True, slots=True)
class FixedLengths:
    """Every request has the same prompt and output length."""

    num_prompt_tokens: int
    num_output_tokens: int

    def __post_init__(self) -> None:
        _check_positive(num_prompt_tokens=self.num_prompt_tokens, num_output_tokens=self.num_output_tokens)

    def sample(self, num_requests: int, rng: np.random.Generator) -> tuple[IntArray, IntArray]:
        del rng  # nothing random here
        return (
            np.full(num_requests, self.num_prompt_tokens, dtype=np.int64),
            np.full(num_requests, self.num_output_tokens, dtype=np.int64),
        )


@dataclass(frozen=True, slots=True)
class UniformLengths:
    """Prompt and output lengths uniform over whole numbers in inclusive ranges."""

    min_prompt_tokens: int
    max_prompt_tokens: int
    min_output_tokens: int
    max_output_tokens: int

    def __post_init__(self) -> None:
        _check_positive(
            min_prompt_tokens=self.min_prompt_tokens,
            max_prompt_tokens=self.max_prompt_tokens,
            min_output_tokens=self.min_output_tokens,
            max_output_tokens=self.max_output_tokens,
        )
        if self.min_prompt_tokens > self.max_prompt_tokens:
            raise ValueError(f"prompt range {self.min_prompt_tokens}-{self.max_prompt_tokens} is empty")
        if self.min_output_tokens > self.max_output_tokens:
            raise ValueError(f"output range {self.min_output_tokens}-{self.max_output_tokens} is empty")

    def sample(self, num_requests: int, rng: np.random.Generator) -> tuple[IntArray, IntArray]:
        prompts = rng.integers(
            self.min_prompt_tokens, self.max_prompt_tokens, size=num_requests, endpoint=True
        )
        outputs = rng.integers(
            self.min_output_tokens, self.max_output_tokens, size=num_requests, endpoint=True
        )
        return prompts.astype(np.int64), outputs.astype(np.int64)


@dataclass(frozen=True, slots=True)
class LognormalLengths:
    """Lognormal lengths with the given medians and log-space ``sigma``, rounded and clipped to [1, max]."""

    median_prompt_tokens: int
    median_output_tokens: int
    sigma: float = 1.0
    max_prompt_tokens: int = 8192
    max_output_tokens: int = 2048

    def __post_init__(self) -> None:
        _check_positive(
            median_prompt_tokens=self.median_prompt_tokens,
            median_output_tokens=self.median_output_tokens,
            max_prompt_tokens=self.max_prompt_tokens,
            max_output_tokens=self.max_output_tokens,
        )
        if not (np.isfinite(self.sigma) and self.sigma >= 0):
            raise ValueError(f"sigma must be a number >= 0, got {self.sigma}")
        if self.median_prompt_tokens > self.max_prompt_tokens:
            raise ValueError(
                f"median prompt {self.median_prompt_tokens} is above its max {self.max_prompt_tokens}"
            )
        if self.median_output_tokens > self.max_output_tokens:
            raise ValueError(
                f"median output {self.median_output_tokens} is above its max {self.max_output_tokens}"
            )

    def sample(self, num_requests: int, rng: np.random.Generator) -> tuple[IntArray, IntArray]:
        def draw(median: int, maximum: int) -> IntArray:
            values = rng.lognormal(np.log(median), self.sigma, size=num_requests)
            return np.clip(np.rint(values), 1, maximum).astype(np.int64)

        prompts = draw(self.median_prompt_tokens, self.max_prompt_tokens)
        return prompts, draw(self.median_output_tokens, self.max_output_tokens)


@dataclass(frozen=True, slots=True)
class TraceLengths:
    """(prompt, output) pairs taken from a trace's rows.

    ``sampling``: ``with-replacement`` (any number of requests), ``without-replacement`` (a random
    subset, at most the trace's rows) or ``in-order`` (its first rows, as when replaying arrivals;
    :func:`parse_lengths`' default for a trace with prefix-block hashes).
    """

    trace: str  # a path, or one of TRACE_NAMES
    sampling: str = "with-replacement"

    def __post_init__(self) -> None:
        if self.sampling not in SAMPLING_MODES:
            raise ValueError(f"unknown sampling {self.sampling!r}; choose from {', '.join(SAMPLING_MODES)}")

    def sample(self, num_requests: int, rng: np.random.Generator) -> tuple[IntArray, IntArray]:
        trace = load_trace(self.trace)
        rows = self.rows(num_requests, rng)
        return trace.num_prompt_tokens[rows], trace.num_output_tokens[rows]

    def rows(self, num_requests: int, rng: np.random.Generator) -> IntArray:
        """The trace rows :meth:`sample` takes (the same ``rng`` draws)."""
        num_rows = len(load_trace(self.trace))
        if self.sampling == "with-replacement":
            rows = rng.integers(0, num_rows, size=num_requests)
        elif num_requests > num_rows:
            raise ValueError(
                f"trace {self.trace} has {num_rows} rows; cannot take {num_requests} {self.sampling}"
            )
        elif self.sampling == "without-replacement":
            rows = rng.choice(num_rows, size=num_requests, replace=False)
        else:
            rows = np.arange(num_requests)
        return rows


Lengths = FixedLengths | UniformLengths | LognormalLengths | TraceLengths


def parse_lengths(text: str, sampling: str | None = None) -> Lengths:
    """``fixed:P,O``, ``uniform:PMIN-PMAX,OMIN-OMAX``, ``lognormal:PMEDIAN,OMEDIAN[,SIGMA]``, else a trace."""
    kind, _, spec = text.partition(":")
    if kind in ("fixed", "uniform", "lognormal") and spec:
        if sampling is not None:
            raise ValueError("sampling applies only to lengths from a trace")
        parts = [part.strip() for part in spec.split(",")]
        try:
            if kind == "fixed" and len(parts) == 2:
                return FixedLengths(int(parts[0]), int(parts[1]))
            if kind == "uniform" and len(parts) == 2:
                (p_min, p_max), (o_min, o_max) = (_int_range(part) for part in parts)
                return UniformLengths(p_min, p_max, o_min, o_max)
            if kind == "lognormal" and len(parts) in (2, 3):
                sigma = float(parts[2]) if len(parts) == 3 else 1.0
                return LognormalLengths(int(parts[0]), int(parts[1]), sigma)
        except ValueError as error:
            raise ValueError(f"bad lengths {text!r}: {error}") from None
        forms = {
            "fixed": "fixed:P,O",
            "uniform": "uniform:PMIN-PMAX,OMIN-OMAX",
            "lognormal": "lognormal:PMEDIAN,OMEDIAN[,SIGMA]",
        }
        raise ValueError(f"bad lengths {text!r}; expected {forms[kind]}")
    resolve_trace_path(text)  # a missing file fails here, naming it
    return TraceLengths(text, sampling or default_sampling(text))


def default_sampling(trace: str) -> str:
    """``with-replacement``, but ``in-order`` for a trace whose rows carry prefix-block hashes: its
    prompts share with the rows around them (a conversation's turns), and drawing rows at random
    would instead repeat whole prompts, each a full hit."""
    return "in-order" if load_trace(trace).hash_ids is not None else "with-replacement"


def _int_range(text: str) -> tuple[int, int]:
    low, sep, high = text.partition("-")
    if not sep:
        raise ValueError(f"expected a range MIN-MAX, got {text!r}")
    return int(low), int(high)


def cap_lengths(
    prompts: IntArray, outputs: IntArray, max_prompt_tokens: int | None, max_total_tokens: int | None
) -> tuple[IntArray, IntArray]:
    """Shorten, never drop: prompts to ``max_prompt_tokens``; then, to fit ``max_total_tokens``,
    outputs first (down to 1 token) and prompts only when a single output token would not fit."""
    if max_prompt_tokens is not None:
        prompts = np.minimum(prompts, max_prompt_tokens)
    if max_total_tokens is not None:
        prompts = np.minimum(prompts, max_total_tokens - 1)
        outputs = np.minimum(outputs, max_total_tokens - prompts)
    return prompts, outputs
