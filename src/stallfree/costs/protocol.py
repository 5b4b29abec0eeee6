"""The one step-pricing protocol, in three widths.

:class:`~stallfree.core.step.StepCostModel` (``step_time_s``: one plan's price) lives in core,
where a time-budgeted scheduler predicts with it; :class:`SteadyCostModel` adds a steady run's
prices at once (what the simulator's driver needs); :class:`StepPricer` adds the yardsticks that
explain, specs and tune read (a decode step, a prompt alone, the ridge). Every cost model here
(roofline, profile, Vidur's and aiconfigurator's tables) is a :class:`StepPricer`.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import numpy.typing as npt

from stallfree.core.plan import StepPlan
from stallfree.core.step import StepCostModel

FloatArray = npt.NDArray[np.float64]


class SteadyCostModel(StepCostModel, Protocol):
    """A cost model that also prices a steady run (the same plan, contexts growing) at once."""

    def steady_durations(self, plan: StepPlan, num_steps: int) -> FloatArray: ...


class StepPricer(SteadyCostModel, Protocol):
    """What every cost model offers: a step's price, a steady run's, and the scenario's yardsticks."""

    def decode_step_s(self, num_seqs: int, context_len: int) -> float: ...

    def prefill_time_s(self, num_tokens: int) -> float: ...

    def ridge_tokens(self) -> float: ...
