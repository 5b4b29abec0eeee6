"""Where validation prices steps: the profile's measured cost model, as the one cost-model factory
picks it, and every simulation a prediction runs.

This is the only module of :mod:`stallfree.validate` that builds a cost model or calls
:func:`stallfree.sim.simulate`: a change to either is a change to :class:`ProfileCosts` alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from stallfree.core import Request
from stallfree.core.serving import ServingConfig
from stallfree.costs import CostChoice
from stallfree.costs.measured import MeasuredCostModel
from stallfree.sim import Deployment, Speculation, simulate
from stallfree.sim.speculative import Acceptance
from stallfree.specs.step_profile import StepProfile
from stallfree.validate.result import RunScores
from stallfree.workload.classes import ScoredClass, class_summaries, classes_of


@dataclass(frozen=True, slots=True)
class ProfileCosts:
    """The profile's measured model (it prices the real steps, and a time budget's chunks on the
    engine) and the factory's pick of it (it prices every simulated step)."""

    model: MeasuredCostModel
    choice: CostChoice

    @classmethod
    def of(cls, profile: StepProfile, sampling: str) -> ProfileCosts:
        """Every sampled row paying ``sampling``'s price."""
        model = MeasuredCostModel(profile, sampling=sampling)
        return cls(model, CostChoice(kind="measured", profile=model))

    def deployment(
        self,
        serving: ServingConfig,
        fleet: tuple[int, str] = (1, "round-robin"),
        acceptance: Acceptance | None = None,
    ) -> Deployment:
        """Replicas priced by the profile, scheduled by ``serving``: ``fleet`` (replicas, router);
        ``acceptance``: how their drafts fare (speculative decoding)."""
        return Deployment(
            costs=self.choice,
            serving=serving,
            replicas=fleet[0],
            router=fleet[1],
            speculation=Speculation(acceptance) if acceptance and serving.num_speculative_tokens else None,
        )

    def predict(
        self,
        requests: Sequence[Request],
        deployment: Deployment,
        *,
        step_noise: bool = False,
        step_scales: tuple[float, float] | None = None,
        seed: int = 0,
        classes: Sequence[ScoredClass] = (),
    ) -> RunScores:
        """``requests`` simulated as served by ``deployment`` (:meth:`deployment`); ``step_noise``
        varies each step as the profiled machine's steps varied (drawn from ``seed``),
        ``step_scales`` prices the decode-only steps and those with prompt tokens at those multiples;
        ``classes``: the requests' traffic classes, each scored too."""
        sim = simulate(requests, deployment, step_noise=step_noise, step_scales=step_scales, seed=seed)
        scores = RunScores.of(sim.summary, sim.records, sim.itl)
        if not classes:
            return scores
        per_class = class_summaries(
            classes, classes_of(requests), sim.records, sim.class_itl, sim.summary["duration"]
        )
        return replace(scores, classes=per_class)
