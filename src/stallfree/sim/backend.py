"""The cost model as an ``explain`` backend: step durations from the roofline."""

from __future__ import annotations

from collections.abc import Callable

from stallfree.core import CacheConfig
from stallfree.core.plan import StepPlan, StepResult
from stallfree.sim.cost_model import CostModel


class CostModelBackend:
    """Adapts :class:`CostModel` to :class:`stallfree.explain.Backend`."""

    def __init__(self, cost_model: CostModel) -> None:
        self.cost_model = cost_model

    def new_executor(self) -> Callable[[StepPlan], StepResult]:
        step_time_s = self.cost_model.step_time_s
        return lambda plan: StepResult(duration_s=step_time_s(plan))

    def decode_step_s(self, num_seqs: int, context_len: int) -> float:
        return self.cost_model.decode_step_s(num_seqs, context_len)

    def prefill_time_s(self, num_tokens: int) -> float:
        return self.cost_model.prefill_time_s(num_tokens)

    def ridge_tokens(self, num_seqs: int, context_len: int) -> float:
        return self.cost_model.ridge_tokens()

    def cache_config(self) -> CacheConfig:
        return CacheConfig()  # the seed's picture ignores KV memory
