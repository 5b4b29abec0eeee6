"""``stallfree validate``: predicted vs measured on the same requests, above the simulator and the engine.

The same requests (arrival times, lengths) and the same scheduler configuration run through the
real engine (or are read from a measured run) and through the simulator priced by a step profile;
both are scored by :mod:`stallfree.metrics`.

- :mod:`.options` — :class:`ValidationOptions`, everything ``stallfree validate`` can be asked;
- :mod:`.run` — :func:`validate`: the options -> a :class:`ValidationResult`;
- :mod:`.measured` — the measured side: the engine in process, or a bench result and step log;
- :mod:`.pricing` — the profile's cost model and every simulation (the one place that builds
  either);
- :mod:`.steps` — every timed step priced by the model against its wall time;
- :mod:`.result` — the frozen result, and ``--json``'s object (:meth:`ValidationResult.to_json`);
- :mod:`.report` — the text the command prints.

Its figures are :mod:`stallfree.plots.validate`'s. The simulator and the engine know nothing of
validate; torch is imported only when the engine runs.
"""

from stallfree.validate.options import SAMPLINGS, ValidationOptions
from stallfree.validate.report import format_report, machine_summary
from stallfree.validate.result import (
    METRICS,
    EnginePredictor,
    PolicyValidation,
    ReferenceStep,
    RunScores,
    ValidationResult,
    ValidationScenario,
)
from stallfree.validate.run import validate
from stallfree.validate.steps import ErrorSpread, StepErrors, StepsOverTarget, step_errors

__all__ = [
    "METRICS",
    "SAMPLINGS",
    "EnginePredictor",
    "ErrorSpread",
    "PolicyValidation",
    "ReferenceStep",
    "RunScores",
    "StepErrors",
    "StepsOverTarget",
    "ValidationOptions",
    "ValidationResult",
    "ValidationScenario",
    "format_report",
    "machine_summary",
    "step_errors",
    "validate",
]
