"""The text ``stallfree validate`` prints for a :class:`ValidationResult`: per policy, measured vs
predicted vs ratio for each metric (and a column per further prediction), the per-step error,
the time budget's steps over target and the machine check; then whether the policies rank the
same. Reads the result only."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stallfree.validate.result import (
    CLASS_METRICS,
    METRICS,
    PolicyValidation,
    ReferenceStep,
    ValidationResult,
    ratio,
)
from stallfree.validate.steps import ErrorSpread, StepErrors

EXTRA_LABELS = {"with_noise": "with noise", "at_run_speed": "at run speed"}
"""The column label of each further prediction."""


def format_report(result: ValidationResult, outputs: Sequence[str] = ()) -> str:
    """The report; ``outputs``: the files written beside it (figures)."""
    sc = result.scenario
    if sc.qps is None:
        workload = "the measured run's arrivals and lengths"
    elif sc.sessions is None:
        workload = f"poisson {sc.qps:g} QPS, lengths {sc.lengths}"
    else:
        workload = (
            f"{sc.sessions} (sessions start at {sc.qps:g}/s; each turn's message and answer {sc.lengths})"
        )
    lines = [
        f"validate: {sc.model}, {sc.num_requests} requests, {workload}, "
        f"sampling {sc.sampling}; measured: {sc.measured}",
        f"profile: {result.profile}" + (f"; {sc.fleet}, each as profiled" if sc.fleet else ""),
    ]
    if result.step_noise:
        q = result.step_noise
        lines.append(
            "with noise: each step's time x a factor drawn from how the profiled machine's steps varied "
            f"(p1 {q[0]:.2f}, p10 {q[1]:.2f}, median {q[2]:.2f}, p90 {q[3]:.2f}, p99 {q[4]:.2f})"
        )
    for policy in result.policies:
        lines += ["", *_policy_lines(policy)]
    ordering = result.ordering()
    if ordering is not None:
        same = ", ".join(f"{k}: {'same' if v else 'DIFFERENT'}" for k, v in ordering.items())
        lines += ["", f"policy ordering, measured vs predicted: {same}"]
    if outputs:
        lines += ["", "wrote: " + ", ".join(outputs)]
    return "\n".join(lines)


def machine_summary(machine: Sequence[ReferenceStep]) -> str:
    """``decode 48.3 ms after the run vs 46.1 profiled (+5%), prompt ...``"""
    return ", ".join(
        f"{s.kind} {s.after_run_s * 1e3:.1f} ms after the run vs {s.profiled_s * 1e3:.1f} profiled"
        f" ({s.after_run_s / s.profiled_s - 1:+.0%})"
        for s in machine
    )


def _policy_lines(r: PolicyValidation) -> list[str]:
    serving = r.serving
    if serving.step_budget_ms is not None:
        budget = f"time budget {serving.step_budget_ms:g} ms, token cap {r.token_budget}"
    elif serving.chunk_tokens is not None:
        budget = f"{serving.chunk_tokens}-token chunks"
    else:
        budget = f"token budget {r.token_budget}" if r.policy == "chunked" else f"batch cap {r.token_budget}"
    if serving.scheduling_policy != "fcfs":
        budget += f", {serving.scheduling_policy} scheduling"
    extra = r.extra_predictions()
    lines = [
        f"{r.policy} ({budget}, max {serving.num_seqs_limit} seqs, {serving.num_blocks} KV blocks); "
        f"completed {r.measured.get('completed')} measured, {r.predicted.get('completed')} predicted",
        f"  {'':<20}{'measured':>12}{'predicted':>12}{'ratio':>8}"
        + "".join(f"{EXTRA_LABELS[name]:>14}{'ratio':>8}" for name, _ in extra),
    ]
    for label, key in METRICS:
        measured, predicted = r.measured.get(key), r.predicted.get(key)
        if measured is None and predicted is None:
            continue  # a metric this run has not (the prefix cache's, with caching off)
        line = f"  {label:<20}{_num(measured):>12}{_num(predicted):>12}{_ratio(predicted, measured):>8}"
        for _, scores in extra:
            line += f"{_num(scores.get(key)):>14}{_ratio(scores.get(key), measured):>8}"
        lines.append(line)
    lines += _class_lines(r)
    if r.per_step is not None:
        lines += _step_lines(r.per_step)
    if r.run_step_scales is not None:
        decode, prompt = r.run_step_scales
        lines.append(
            f"  at run speed: the same simulation with decode-only steps x{decode:.2f} and steps with "
            f"prompt tokens x{prompt:.2f} (this run's per-step bias): not a prediction, the simulator "
            "checked with the machine's drift taken out"
        )
    lines += _target_lines(r)
    if r.machine:
        lines.append(f"  machine: the profile's reference steps took {machine_summary(r.machine)}")
    return lines


_CLASS_MEDIANS = CLASS_METRICS[:3]
"""The per-class table's columns: the medians of TTFT, TPOT and ITL."""


def _class_lines(r: PolicyValidation) -> list[str]:
    """A classes run: each class's medians measured vs predicted, and the classes' order."""
    classes = r.measured.classes
    if not classes:
        return []
    lines = [
        "  per class, medians (ms): measured, predicted, ratio",
        f"  {'':<12}{'priority':>9}{'completed':>11}"
        + "".join(f"{label:>29}" for label, _ in _CLASS_MEDIANS),
    ]
    for name, c in classes.items():
        done = f"{c.get('completed')}/{r.predicted.class_get(name, 'completed')}"
        line = f"  {name:<12}{c['priority']:>9}{done:>11}"
        for _, key in _CLASS_MEDIANS:
            measured, predicted = c.get(key), r.predicted.class_get(name, key)
            line += f"{_num(measured):>11}{_num(predicted):>11}{_ratio(predicted, measured):>7}"
        lines.append(line)
    measured_order, predicted_order = r.measured.class_order(), r.predicted.class_order()
    verdict = "same" if measured_order == predicted_order else "DIFFERENT"
    lines.append(
        f"  classes by median TTFT: measured {' < '.join(measured_order)}, predicted "
        f"{' < '.join(predicted_order)} ({verdict})"
    )
    return lines


def _step_lines(steps: StepErrors) -> list[str]:
    every = steps.all_steps
    lines = [
        f"  per-step error over {every.num_steps} engine steps: {_spread(every)}; step time summed "
        f"{steps.predicted_step_s_total:.1f} s predicted vs {steps.measured_step_s_total:.1f} s"
    ]
    for name, part in (("decode only", steps.decode_only), ("with prompt tokens", steps.with_prompt_tokens)):
        if part.num_steps:
            lines.append(f"    {name:<20} {part.num_steps:>6} steps: {_spread(part)}")
    return lines


def _spread(s: ErrorSpread) -> str:
    if s.median_abs_error is None or s.p90_abs_error is None or s.median_error is None:
        return "no steps"
    return f"median {s.median_abs_error:.1%}, p90 {s.p90_abs_error:.1%} (bias {s.median_error:+.1%})"


def _target_lines(r: PolicyValidation) -> list[str]:
    """A time-budgeted run: the steps that took longer than the target, measured and predicted."""
    target_ms = r.serving.step_budget_ms
    if target_ms is None:
        return []
    steps = r.per_step
    over = None if steps is None else steps.over_target
    line = f"  steps over the {target_ms:g} ms target: "
    if steps is not None and over is not None:
        line += (
            f"measured {over.num_steps_over_target} of {steps.all_steps.num_steps} "
            f"(longest {over.max_step_ms:.1f} ms), "
        )
    predicted = r.predicted
    line += (
        f"predicted {predicted.get('num_steps_over_budget')} of {predicted.get('num_steps')} "
        f"(longest {predicted.get('max_step_ms'):.1f} ms)"
    )
    lines = [line]
    if over is not None:
        lines.append(
            f"    the model priced {over.num_predicted_over_target} of the real steps over the target"
        )
    calibrated = r.engine_predictor
    if calibrated is not None:
        lines.append(
            f"    the engine planned by the profile x {calibrated.final_scale:.2f} at the end (measured / "
            f"predicted of its recent steps); its steps' mean |error| {calibrated.mean_abs_error:.1%}"
        )
    return lines


def _ratio(predicted: Any, measured: Any) -> str:
    value = ratio(predicted, measured)
    return "-" if value is None else f"{value:.2f}"


def _num(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:,.1f}" if abs(value) >= 10 else f"{value:,.3f}"
