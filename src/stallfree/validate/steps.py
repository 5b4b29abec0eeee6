"""Per-step errors: every real step's plan priced by the profile's model against its measured time.

:func:`step_errors` takes the steps a run timed (the engine's in process, or a server's
``--step-log``) and says how far the model's prices fell from them, as relative errors
``predicted / measured - 1``: over all steps, over the decode-only ones and over those with prompt
tokens (the two kinds run at different speeds: memory-bound and compute-bound). Invariant: an
:class:`ErrorSpread` of no steps has no spreads (None), and its ``to_json`` says only the count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from stallfree.core.step import StepCostModel, TimedStep


@dataclass(frozen=True, slots=True)
class ErrorSpread:
    """How far the prices of some steps fell from their measured times: the median relative
    |error|, its p90, and the median error (the bias: negative when the model prices low)."""

    num_steps: int
    median_abs_error: float | None = None
    p90_abs_error: float | None = None
    median_error: float | None = None

    def to_json(self) -> dict[str, float | int | None]:
        if not self.num_steps:
            return {"num_steps": 0}
        return {
            "num_steps": self.num_steps,
            "median_abs_error": self.median_abs_error,
            "p90_abs_error": self.p90_abs_error,
            "median_error": self.median_error,
        }


@dataclass(frozen=True, slots=True)
class StepsOverTarget:
    """A step-time target (``--step-budget-ms``) against the real steps: how many ran longer,
    how many the model priced longer, and the longest real step."""

    num_steps_over_target: int
    num_predicted_over_target: int
    max_step_ms: float


@dataclass(frozen=True, slots=True)
class StepErrors:
    """Every real step priced by the model against its measured wall time (see the module)."""

    all_steps: ErrorSpread
    decode_only: ErrorSpread
    with_prompt_tokens: ErrorSpread
    measured_step_s_total: float
    predicted_step_s_total: float
    over_target: StepsOverTarget | None = None  # with a step-time target only

    @property
    def run_step_scales(self) -> tuple[float, float]:
        """Decode-only steps and steps with prompt tokens priced at the speed these steps ran
        (``1 / (1 + median error)``; 1 for a kind that did not run)."""
        return (_speed(self.decode_only), _speed(self.with_prompt_tokens))

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            **self.all_steps.to_json(),
            "measured_step_s_total": self.measured_step_s_total,
            "predicted_step_s_total": self.predicted_step_s_total,
            "decode_only": self.decode_only.to_json(),
            "with_prompt_tokens": self.with_prompt_tokens.to_json(),
        }
        if self.over_target is not None:
            body["num_steps_over_target"] = self.over_target.num_steps_over_target
            body["num_predicted_over_target"] = self.over_target.num_predicted_over_target
            body["max_step_ms"] = self.over_target.max_step_ms
        return body


def step_errors(
    model: StepCostModel, steps: Sequence[TimedStep], target_s: float | None = None
) -> StepErrors:
    """Each real step's plan priced by ``model`` against its measured wall time (and, with a
    step-time ``target_s``, how many real steps took longer than it)."""
    measured = np.array([s.duration_s for s in steps])
    predicted = np.array([model.step_time_s(s.plan) for s in steps])
    errors = predicted / measured - 1
    decode_only = np.array([s.plan.num_prefill_tokens == 0 for s in steps], dtype=bool)
    over = None
    if target_s is not None:
        over = StepsOverTarget(
            num_steps_over_target=int((measured > target_s).sum()),
            num_predicted_over_target=int((predicted > target_s).sum()),
            max_step_ms=float(measured.max(initial=0.0)) * 1000,
        )
    return StepErrors(
        all_steps=_spread(errors, np.ones(len(steps), dtype=bool)),
        decode_only=_spread(errors, decode_only),
        with_prompt_tokens=_spread(errors, ~decode_only),
        measured_step_s_total=float(measured.sum()),
        predicted_step_s_total=float(predicted.sum()),
        over_target=over,
    )


def _spread(errors: npt.NDArray[np.float64], mask: npt.NDArray[np.bool_]) -> ErrorSpread:
    if not mask.any():
        return ErrorSpread(num_steps=0)
    abs_errors = np.abs(errors[mask])
    return ErrorSpread(
        num_steps=int(mask.sum()),
        median_abs_error=float(np.median(abs_errors)),
        p90_abs_error=float(np.percentile(abs_errors, 90)),
        median_error=float(np.median(errors[mask])),
    )


def _speed(spread: ErrorSpread) -> float:
    if spread.median_error is None:  # no step of this kind ran
        return 1.0
    return 1 / (1 + spread.median_error)
