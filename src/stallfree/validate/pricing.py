"""Where validation prices steps: the profile's measured cost model, as the one cost-model factory
picks it, and every simulation a prediction runs.

This is the only module of :mod:`stallfree.validate` that builds a cost model or calls
:func:`stallfree.sim.simulate`: a change to either is a change to :class:`ProfileCosts` alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from stallfree.core import Request
from stallfree.core.serving import ServingConfig
from stallfree.costs import CostChoice, CostPick, pick_cost_model
from stallfree.costs.measured import MeasuredCostModel
from stallfree.sim import simulate
from stallfree.sim.speculative import Acceptance
from stallfree.specs.step_profile import StepProfile
from stallfree.validate.result import RunScores


@dataclass(frozen=True, slots=True)
class ProfileCosts:
    """The profile's measured model (it prices the real steps, and a time budget's chunks on the
    engine) and the factory's pick of it (it prices every simulated step)."""

    model: MeasuredCostModel
    pick: CostPick

    @classmethod
    def of(cls, profile: StepProfile, sampling: str) -> ProfileCosts:
        """Every sampled row paying ``sampling``'s price."""
        model = MeasuredCostModel(profile, sampling=sampling)
        return cls(model, pick_cost_model(CostChoice(kind="measured", profile=model)))

    def predict(
        self,
        requests: Sequence[Request],
        serving: ServingConfig,
        *,
        step_noise: bool = False,
        step_scales: tuple[float, float] | None = None,
        seed: int = 0,
        fleet: tuple[int, str] = (1, "round-robin"),
        acceptance: Acceptance | None = None,
    ) -> RunScores:
        """``requests`` simulated as ``serving`` schedules them; ``step_noise`` varies each step as
        the profiled machine's steps varied (drawn from ``seed``), ``step_scales`` prices the
        decode-only steps and those with prompt tokens at those multiples; ``fleet``: (replicas,
        router), each replica as the profile; ``acceptance``: the drafts' (speculative decoding)."""
        sim = simulate(
            requests,
            self.pick,
            serving,
            step_noise=step_noise,
            step_scales=step_scales,
            seed=seed,
            replicas=fleet[0],
            router=fleet[1],
            acceptance=acceptance if serving.num_speculative_tokens else None,
        )
        return RunScores.of(sim.summary, sim.records, sim.itl)
