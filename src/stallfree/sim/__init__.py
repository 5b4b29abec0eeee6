"""Simulator side: roofline step costs and a simulated clock. Imports core, specs and numpy, never torch."""

from stallfree.sim.api import SimulationResult, auto_cost_model, simulate
from stallfree.sim.cost_model import COST_MODEL_KINDS, CostModel, CostModelConfig, CostModelKind, StepCost

__all__ = [
    "COST_MODEL_KINDS",
    "CostModel",
    "CostModelConfig",
    "CostModelKind",
    "SimulationResult",
    "StepCost",
    "auto_cost_model",
    "simulate",
]
