"""One validation, start to end: :func:`validate` turns :class:`ValidationOptions` into a
:class:`ValidationResult`.

For each policy: the measured side (:mod:`.measured`), every timed step priced by the profile
(:mod:`.steps`), then the predictions on the same requests and the same configuration
(:mod:`.pricing`): the plain one; with ``step_noise``, each step varied as the profiled machine's
steps varied; where steps were timed, each kind of step at the speed this run's steps ran.
"""

from __future__ import annotations

import numpy as np

from stallfree.core.serving import ServingConfig
from stallfree.specs.step_profile import load_profile
from stallfree.validate.measured import measure
from stallfree.validate.options import ValidationOptions
from stallfree.validate.pricing import ProfileCosts
from stallfree.validate.result import PolicyValidation, ValidationResult, ValidationScenario
from stallfree.validate.steps import step_errors

NOISE_PERCENTILES = (1, 10, 50, 90, 99)
"""The spread of the step-noise factors a result reports."""


def validate(options: ValidationOptions) -> ValidationResult:
    """Run ``options``: each policy measured and predicted on the same requests."""
    profile = load_profile(options.profile)
    sampling = options.sampling_mode  # reads a bench run's file: once
    costs = ProfileCosts.of(profile, sampling)
    policies = tuple(_policy(options, serving, costs) for serving in options.servings)
    noise = None
    if options.step_noise:
        noise = tuple(float(q) for q in np.percentile(costs.model.step_noise(), NOISE_PERCENTILES))
    model = options.model or profile.fingerprint.get("model")
    scenario = ValidationScenario(
        model=None if model is None else str(model),
        # a bench result brings its own requests and arrival times
        qps=None if options.measured else options.qps,
        lengths=None if options.measured else options.lengths,
        num_requests=policies[0].num_requests if options.measured else options.num_requests,
        seed=options.seed,
        sampling=sampling,
        measured=options.measured or "engine in process",
        sessions=_sessions(options),
        fleet=f"{options.replicas} replicas behind {options.router}" if options.replicas > 1 else None,
    )
    return ValidationResult(profile.describe(), scenario, policies, noise)


def _sessions(options: ValidationOptions) -> str | None:
    if options.turns is None:
        return None
    return (
        f"{options.num_requests // options.turns} sessions x {options.turns} turns, system prompt "
        f"{options.system_prompt_tokens} tokens, a turn {options.think_time_s:g} s after the previous "
        "one arrived"
    )


def _policy(options: ValidationOptions, serving: ServingConfig, costs: ProfileCosts) -> PolicyValidation:
    run = measure(options, serving, costs.model)
    per_step = None
    if run.steps is not None:
        per_step = step_errors(costs.model, run.steps, run.serving.step_budget_s)
    deployment = costs.deployment(run.serving, (options.replicas, options.router), options.acceptance)
    classes = run.classes
    predicted = costs.predict(run.requests, deployment, classes=classes)
    with_noise = None
    if options.step_noise:
        with_noise = costs.predict(
            run.requests, deployment, step_noise=True, seed=options.seed, classes=classes
        )
    # Each kind of step priced at the speed this run's steps ran (1 / (1 + median error)): what
    # the simulator gives when the step prices are right, the machine's drift taken out.
    scales = None if per_step is None else per_step.run_step_scales
    at_run_speed = None
    if scales is not None:
        at_run_speed = costs.predict(run.requests, deployment, step_scales=scales, classes=classes)
    return PolicyValidation(
        serving=run.serving,
        num_requests=len(run.requests),
        measured=run.scores,
        predicted=predicted,
        with_noise=with_noise,
        at_run_speed=at_run_speed,
        run_step_scales=scales,
        per_step=per_step,
        machine=run.machine,
        engine_predictor=run.engine_predictor,
    )
