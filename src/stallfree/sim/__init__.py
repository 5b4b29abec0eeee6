"""Simulator side: the one driver (an event loop with a clock seam) and its runs. Prices steps
through :mod:`stallfree.costs`; imports core, costs, specs and numpy, never torch or the engine."""

from stallfree.sim.api import SimulationResult, simulate
from stallfree.sim.deployment import Deployment, ReplicaGroup, Speculation

__all__ = ["Deployment", "ReplicaGroup", "SimulationResult", "Speculation", "simulate"]
