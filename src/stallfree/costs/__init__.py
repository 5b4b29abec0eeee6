"""Step pricing: how long a step plan takes, from a roofline, a profile of an engine or a server,
Vidur's GPU tables or aiconfigurator-core's. One protocol (:mod:`.protocol`), one factory
(:func:`pick_cost_model` over a :class:`CostChoice`). Imports core and specs, never a driver
(sim, engine) and never torch."""

from stallfree.costs.choice import CostChoice, CostPick, pick_cost_model
from stallfree.costs.protocol import SteadyCostModel, StepPricer
from stallfree.costs.roofline import COST_MODEL_KINDS, CostModel, CostModelConfig, CostModelKind, StepCost

__all__ = [
    "COST_MODEL_KINDS",
    "CostChoice",
    "CostModel",
    "CostModelConfig",
    "CostModelKind",
    "CostPick",
    "SteadyCostModel",
    "StepCost",
    "StepPricer",
    "pick_cost_model",
]
