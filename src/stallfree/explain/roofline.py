"""Cost models as explain's :class:`~stallfree.explain.scenario.StepTimer`: steps are priced, not run."""

from __future__ import annotations

from collections.abc import Callable

from stallfree.core import CacheConfig, Executor, StepCostModel, StepPlan
from stallfree.core.step import priced_executor
from stallfree.costs.roofline import CostModel


class PricedTimer:
    """Step durations from any cost model; the KV cache is unbounded (the seed's picture).

    ``ridge_tokens(num_seqs, context_len)`` is the cost model's answer to "how many prompt tokens
    ride almost free" (the roofline's ridge, or a measured model's tolerance search).
    """

    def __init__(self, cost_model: StepCostModel, ridge_tokens: Callable[[int, int], float]) -> None:
        self.cost_model = cost_model
        self._ridge_tokens = ridge_tokens

    def step_time_s(self, plan: StepPlan) -> float:
        return self.cost_model.step_time_s(plan)

    def new_executor(self) -> Executor:
        return priced_executor(self.cost_model)

    def ridge_tokens(self, num_seqs: int, context_len: int) -> float:
        return self._ridge_tokens(num_seqs, context_len)

    def cache_config(self) -> CacheConfig:
        return CacheConfig()


class RooflineTimer(PricedTimer):
    """The roofline :class:`CostModel`; its ridge is a property of the weights, not of the batch."""

    cost_model: CostModel

    def __init__(self, cost_model: CostModel) -> None:
        super().__init__(cost_model, lambda num_seqs, context_len: cost_model.ridge_tokens())
