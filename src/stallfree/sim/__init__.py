"""Simulator side: roofline step costs and a simulated clock. Imports core, specs and numpy, never torch."""

from stallfree.sim.api import SimulationResult, simulate
from stallfree.sim.cost_model import COST_MODEL_KINDS, CostModel, CostModelConfig, CostModelKind, StepCost
from stallfree.sim.costs import CostChoice, CostPick, pick_cost_model

__all__ = [
    "COST_MODEL_KINDS",
    "CostChoice",
    "CostModel",
    "CostModelConfig",
    "CostModelKind",
    "CostPick",
    "SimulationResult",
    "StepCost",
    "pick_cost_model",
    "simulate",
]
