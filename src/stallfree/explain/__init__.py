"""``stallfree explain``: the seed's scenario (N streams decoding, one long prompt arrives) on one
clock, prefill-first vs chunked, with a chunk sweep and figures.

- :mod:`.options` — :class:`ExplainOptions`, everything ``stallfree explain`` can be asked;
- :mod:`.backends` — :func:`run_explain`: the options -> a clock (roofline, profile, engine) -> an
  :class:`Explanation`; the command line and the page both call it;
- :mod:`.scenario` — the scenario, its runs and the sweep, on any :class:`StepTimer`;
- :mod:`.roofline` — steps priced by a cost model, roofline or measured (no torch);
- :mod:`.engine` — steps measured on the real engine (imports torch; import it yourself);
- :mod:`.report` — the table ``stallfree explain`` prints;
- :mod:`.plots` — the timeline and sweep figures (matplotlib).

The simulator and the engine know nothing of explain; it stands on both.
"""

from stallfree.explain.backends import run_explain
from stallfree.explain.options import SCENARIO_DEFAULTS, ExplainOptions
from stallfree.explain.report import format_explain
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
    "SCENARIO_DEFAULTS",
    "ExplainOptions",
    "Explanation",
    "PolicyRun",
    "PricedTimer",
    "RooflineTimer",
    "Scenario",
    "StepTimer",
    "SweepPoint",
    "explain",
    "format_explain",
    "run_explain",
    "run_scenario",
]
