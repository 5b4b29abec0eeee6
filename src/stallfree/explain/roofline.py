"""A cost model as explain's :class:`~stallfree.explain.scenario.StepTimer`: steps are priced, not run."""

from __future__ import annotations

from stallfree.core import CacheConfig, Executor, StepPlan
from stallfree.core.step import priced_executor
from stallfree.sim.cost_model import CostModel


class RooflineTimer:
    """Step durations from :class:`CostModel`; the KV cache is unbounded (the seed's picture)."""

    def __init__(self, cost_model: CostModel) -> None:
        self.cost_model = cost_model

    def step_time_s(self, plan: StepPlan) -> float:
        return self.cost_model.step_time_s(plan)

    def new_executor(self) -> Executor:
        return priced_executor(self.cost_model)

    def ridge_tokens(self, num_seqs: int, context_len: int) -> float:
        return self.cost_model.ridge_tokens()  # a property of the weights, not of the batch

    def cache_config(self) -> CacheConfig:
        return CacheConfig()
