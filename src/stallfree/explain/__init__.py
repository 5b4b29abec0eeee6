"""``stallfree explain``: the seed's scenario (N streams decoding, one long prompt arrives) on one
clock, prefill-first vs chunked, with a chunk sweep and figures.

- :mod:`.scenario` — the scenario, its runs and the sweep, on any :class:`StepTimer`;
- :mod:`.roofline` — steps priced by a cost model, roofline or measured (no torch);
- :mod:`.engine` — steps measured on the real engine (imports torch; import it yourself);
- :mod:`.plots` — the timeline and sweep figures (matplotlib).

The simulator and the engine know nothing of explain; it stands on both.
"""

from stallfree.explain.roofline import PricedTimer, RooflineTimer
from stallfree.explain.scenario import (
    DEFAULT_SWEEP,
    PROMPT_ID,
    Explanation,
    PolicyRun,
    Scenario,
    StepTimer,
    SweepPoint,
    explain,
    run_scenario,
)

__all__ = [
    "DEFAULT_SWEEP",
    "PROMPT_ID",
    "Explanation",
    "PolicyRun",
    "PricedTimer",
    "RooflineTimer",
    "Scenario",
    "StepTimer",
    "SweepPoint",
    "explain",
    "run_scenario",
]
