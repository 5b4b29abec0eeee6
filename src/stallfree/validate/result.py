"""What a validation found, as frozen values: :class:`ValidationResult` and its parts.

One :class:`PolicyValidation` per policy holds both sides' :class:`RunScores` (measured, and
predicted by the simulator priced by the profile), the further predictions (``with_noise``: each
step varied as the profiled machine's steps varied; ``at_run_speed``: each kind of step priced at
the speed this run's steps ran, not a prediction but the simulator's check with the machine's
drift taken out), the per-step errors, the machine check and a time budget's engine predictor.
The command line prints it (:mod:`stallfree.validate.report`), ``plots/`` draws it, and
:meth:`ValidationResult.to_json` is ``stallfree validate --json``'s object (vLLM's metric keys).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from stallfree.core.serving import ServingConfig
from stallfree.metrics import ItlAccumulator, RequestRecord
from stallfree.validate.steps import StepErrors

METRICS: tuple[tuple[str, str], ...] = (
    ("TTFT median (ms)", "median_ttft_ms"),
    ("TTFT p99 (ms)", "p99_ttft_ms"),
    ("TPOT median (ms)", "median_tpot_ms"),
    ("TPOT p99 (ms)", "p99_tpot_ms"),
    ("ITL median (ms)", "median_itl_ms"),
    ("ITL p99 (ms)", "p99_itl_ms"),
    ("ITL max (ms)", "max_itl_ms"),
    ("sched delay p50 (ms)", "median_scheduling_delay_ms"),  # measured in process only
    ("output tokens/s", "output_throughput"),
    ("requests/s", "request_throughput"),
    ("duration (s)", "duration"),
    ("prefix cache hits", "prefix_cache_hit_rate"),  # with prefix caching only
)
"""The compared metrics: (the report's label, the summary key)."""

ORDERED_METRICS = ("median_ttft_ms", "p99_ttft_ms", "p99_itl_ms", "max_itl_ms")
"""The metrics on which policies must rank the same, measured and predicted."""

CLASS_METRICS: tuple[tuple[str, str], ...] = (
    ("TTFT median", "median_ttft_ms"),
    ("TPOT median", "median_tpot_ms"),
    ("ITL median", "median_itl_ms"),
    ("TTFT p99", "p99_ttft_ms"),
    ("TPOT p99", "p99_tpot_ms"),
    ("ITL p99", "p99_itl_ms"),
    ("goodput/s", "request_goodput"),  # with the class's SLOs only
)
"""The metrics compared per traffic class: (label, the class summary's key)."""


@dataclass(frozen=True, slots=True)
class RunScores:
    """One side of a run, scored by :mod:`stallfree.metrics`: its summary (vLLM's benchmark keys,
    and the simulator's own for a prediction), every completed request's TTFT, and every ITL;
    ``classes``: a classes run's scores per traffic class
    (:func:`~stallfree.workload.classes.class_summaries`), else None."""

    summary: Mapping[str, Any]
    ttft_s: tuple[float, ...]
    itl: ItlAccumulator
    classes: Mapping[str, Mapping[str, Any]] | None = None

    @classmethod
    def of(
        cls, summary: Mapping[str, Any], records: Iterable[RequestRecord], itl: ItlAccumulator
    ) -> RunScores:
        ttft = tuple(
            r.first_token_s - r.arrival_s for r in records if r.first_token_s is not None and r.is_completed
        )
        return cls(summary, ttft, itl)

    def get(self, key: str) -> Any:
        """The summary's ``key`` (None where it has none)."""
        return self.summary.get(key)

    def class_get(self, name: str, key: str) -> Any:
        """Traffic class ``name``'s ``key`` (None where it has none)."""
        return (self.classes or {}).get(name, {}).get(key)

    def class_order(self) -> tuple[str, ...]:
        """The traffic classes from the shortest median TTFT to the longest (a class with no
        completed request last)."""
        classes = self.classes or {}
        return tuple(sorted(classes, key=lambda c: _or_inf(classes[c].get("median_ttft_ms"))))


@dataclass(frozen=True, slots=True)
class ReferenceStep:
    """One of the profile's reference steps: its median when profiled and its time again on the
    idle engine after the run (``kind``: ``decode``, memory-bound; ``prompt``, compute-bound)."""

    kind: str
    profiled_s: float
    after_run_s: float


@dataclass(frozen=True, slots=True)
class EnginePredictor:
    """What a time-budgeted engine planned by at the end: the profile scaled by measured /
    predicted of its recent steps, and its steps' mean |error|."""

    final_scale: float
    mean_abs_error: float


@dataclass(frozen=True, slots=True)
class PolicyValidation:
    """One policy's run on both sides (see the module). ``serving`` is the configuration both
    ran with (in process: the engine's KV blocks and context length); ``run_step_scales`` the
    (decode-only, with prompt tokens) scales of ``at_run_speed``; ``per_step`` None: no steps were
    timed (a bench result without a step log), ``machine`` None: no check was possible."""

    serving: ServingConfig
    num_requests: int
    measured: RunScores
    predicted: RunScores
    with_noise: RunScores | None = None
    at_run_speed: RunScores | None = None
    run_step_scales: tuple[float, float] | None = None
    per_step: StepErrors | None = None
    machine: tuple[ReferenceStep, ...] | None = None
    engine_predictor: EnginePredictor | None = None

    @property
    def policy(self) -> str:
        return self.serving.policy

    @property
    def token_budget(self) -> int | None:
        """Chunked: the step's token budget (None with fixed chunks); else the whole-prompt batch cap."""
        if self.policy == "chunked":
            return self.serving.token_budget
        return self.serving.whole_prompt_cap(self.serving.max_model_len or 1 << 30)

    def extra_predictions(self) -> list[tuple[str, RunScores]]:
        """The further predictions made, by their JSON key: ``with_noise``, ``at_run_speed``."""
        extra = (("with_noise", self.with_noise), ("at_run_speed", self.at_run_speed))
        return [(name, scores) for name, scores in extra if scores is not None]

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "time_budget": self._time_budget_json(),
            "token_budget": self.token_budget,
            "max_num_seqs": self.serving.num_seqs_limit,
            "num_blocks": self.serving.num_blocks,
            "completed": {
                "measured": self.measured.get("completed"),
                "predicted": self.predicted.get("completed"),
                "requests": self.num_requests,
            },
            "metrics": {key: self._metric_json(key) for _, key in METRICS},
            "per_step": None if self.per_step is None else self.per_step.to_json(),
            "run_step_scales": None if self.run_step_scales is None else list(self.run_step_scales),
            "classes": self._classes_json(),
            "machine": None
            if self.machine is None
            else {s.kind: {"profiled_s": s.profiled_s, "after_run_s": s.after_run_s} for s in self.machine},
        }

    def _metric_json(self, key: str) -> dict[str, float | None]:
        extra = [(name, scores.get(key)) for name, scores in self.extra_predictions()]
        return _compared(self.measured.get(key), self.predicted.get(key), extra)

    def _classes_json(self) -> dict[str, Any] | None:
        """Per traffic class: its priority and each of :data:`CLASS_METRICS` measured, predicted
        (and by each further prediction), with ratios; and the classes' order by median TTFT."""
        measured = self.measured.classes
        if not measured:
            return None
        out: dict[str, Any] = {}
        for name, scores in measured.items():
            metrics = {}
            for _, key in CLASS_METRICS:
                extra = [(side, other.class_get(name, key)) for side, other in self.extra_predictions()]
                metrics[key] = _compared(scores.get(key), self.predicted.class_get(name, key), extra)
            out[name] = {
                "priority": scores["priority"],
                "completed": {
                    "measured": scores.get("completed"),
                    "predicted": self.predicted.class_get(name, "completed"),
                },
                "metrics": metrics,
            }
        return {
            "by_class": out,
            "order_by_median_ttft": {
                "measured": list(self.measured.class_order()),
                "predicted": list(self.predicted.class_order()),
            },
        }

    def _time_budget_json(self) -> dict[str, Any] | None:
        if self.serving.step_budget_ms is None:
            return None
        over = None if self.per_step is None else self.per_step.over_target
        predictor = self.engine_predictor
        return {
            "step_budget_ms": self.serving.step_budget_ms,
            "steps_over": {
                "measured": None if over is None else over.num_steps_over_target,
                "predicted": self.predicted.get("num_steps_over_budget"),
            },
            "num_steps": {
                "measured": None if self.per_step is None else self.per_step.all_steps.num_steps,
                "predicted": self.predicted.get("num_steps"),
            },
            "max_step_ms": {
                "measured": None if over is None else over.max_step_ms,
                "predicted": self.predicted.get("max_step_ms"),
            },
            "engine_predictor": None if predictor is None else asdict(predictor),
        }


@dataclass(frozen=True, slots=True)
class ValidationScenario:
    """What ran: the model, the workload (None for a bench result's own requests; ``sessions``,
    multi-turn sessions as ``8 sessions x 4 turns, system prompt 1024 tokens, a turn 2 s after
    the previous one arrived``), the sampler, and where the measured side came from (a bench
    result's path or ``engine in process``)."""

    model: str | None
    qps: float | None
    lengths: str | None
    num_requests: int
    seed: int
    sampling: str
    measured: str
    sessions: str | None = None
    fleet: str | None = None  # "2 replicas behind cache-aware"


@dataclass(frozen=True, slots=True)
class ValidationResult:
    """A whole validation: the profile, the scenario, one :class:`PolicyValidation` per policy,
    and with step noise the spread of its factors (p1, p10, median, p90, p99)."""

    profile: str  # the profile's one-line description
    scenario: ValidationScenario
    policies: tuple[PolicyValidation, ...]
    step_noise: tuple[float, ...] | None = None

    def ordering(self) -> dict[str, bool] | None:
        """Whether the policies rank the same, measured and predicted, on TTFT and the ITL tail
        (None with one policy)."""
        if len(self.policies) < 2:
            return None
        out = {}
        for key in ORDERED_METRICS:
            measured = [p.measured.get(key) or 0.0 for p in self.policies]
            predicted = [p.predicted.get(key) or 0.0 for p in self.policies]
            out[key] = bool(np.array_equal(np.argsort(measured), np.argsort(predicted)))
        return out

    def to_json(self, outputs: Sequence[str] | None = None) -> dict[str, Any]:
        """``stallfree validate --json``'s object; ``outputs``: the files written beside it."""
        body: dict[str, Any] = {
            "profile": self.profile,
            "scenario": asdict(self.scenario),
            "policies": {p.policy: p.to_json() for p in self.policies},
        }
        if self.step_noise is not None:
            body["step_noise"] = list(self.step_noise)
        ordering = self.ordering()
        if ordering is not None:
            body["ordering"] = ordering
        if outputs is not None:
            body["outputs"] = list(outputs)
        return body


def _compared(
    measured: float | None, predicted: float | None, extra: Iterable[tuple[str, float | None]]
) -> dict[str, float | None]:
    """One metric's JSON row: measured, predicted, their ratio, and each further prediction's."""
    row = {"measured": measured, "predicted": predicted, "ratio": ratio(predicted, measured)}
    for name, value in extra:
        row[name] = value
        row[f"{name}_ratio"] = ratio(value, measured)
    return row


def _or_inf(value: float | None) -> float:
    return float("inf") if value is None else float(value)


def ratio(predicted: float | None, measured: float | None) -> float | None:
    """predicted / measured (None when either is unknown or measured is 0)."""
    if predicted is None or measured is None or not measured:
        return None
    return float(predicted) / float(measured)
