"""``stallfree tune`` as a library: a deployment, a workload and SLOs in (:class:`TuneRequest`,
resolved by :func:`plan_tune` before any trial or worker starts); :func:`advise` runs the plan and
returns the capacity per (policy, budget), the best budget and the launch flags as the JSON object
the command prints (:func:`stallfree.tune.report.format_tune` renders it).

The decisions ``tune`` makes beyond the search live here: the budget candidates (``auto``: around
the cost model's ridge), Sarathi-Serve's strict P99 TBT SLO when none is given
(:func:`strict_tbt_p99_ms`), step-time targets (``auto``: fractions of that SLO) and, for the best
of them, the fixed budget that comes closest (:func:`closest_fixed_budget`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from stallfree.costs.choice import CostChoice, pick_once
from stallfree.sim.deployment import Speculation
from stallfree.specs.step_profile import machine_label
from stallfree.tune.candidates import TILE_TOKENS, budget_candidates
from stallfree.tune.capacity import TuneConfig, TuneInterrupted, time_budget_commands, tune
from stallfree.tune.pools import TrialPool
from stallfree.tune.slo import STRICT_TBT_BATCH, STRICT_TBT_CONTEXT, STRICT_TBT_MULTIPLE, Slos
from stallfree.tune.trial import TrialSpec, decode_step_ms, full_step_ms, ridge_tokens

STEP_BUDGET_FRACTIONS = (0.5, 0.75, 1.0)  # of the P99 TBT SLO, for ``step_budgets_ms="auto"``


@dataclass(frozen=True, slots=True)
class TuneRequest:
    """What to tune. ``budgets`` None: :func:`budget_candidates` around the ridge; ``slos`` without
    ``tbt_p99_ms``: the strict one; ``step_budgets_ms`` ``"auto"``: fractions of the P99 TBT SLO."""

    base: TrialSpec
    policies: tuple[str, ...] = ("chunked", "prefill-first")
    budgets: tuple[int, ...] | None = None
    slos: Mapping[str, float] = field(default_factory=lambda: {"sched_delay_p50_s": 2.0})
    max_num_seqs: int = 256
    precision: float = 0.05
    qps_start: float | None = None
    step_budgets_ms: tuple[float, ...] | str = ()
    cost_model_note: str | None = None  # why auto picked the cost model's kind, echoed
    speculative_tokens: tuple[int, ...] = ()  # draft lengths to try with chunked (base: its rule)
    speculation: Speculation | None = None  # how their drafts fare


def strict_tbt_p99_ms(costs: CostChoice) -> tuple[float, str]:
    """Sarathi-Serve's strict P99 TBT SLO for this cost model, and how it was derived."""
    step_ms = decode_step_ms(costs, STRICT_TBT_BATCH, STRICT_TBT_CONTEXT)
    note = (
        f"strict: {STRICT_TBT_MULTIPLE} x a {STRICT_TBT_BATCH}-sequence decode step at "
        f"{STRICT_TBT_CONTEXT:,} tokens of context ({step_ms:.1f} ms)"
    )
    return round(STRICT_TBT_MULTIPLE * step_ms, 1), note


def closest_fixed_budget(costs: CostChoice, step_budget_ms: float) -> int:
    """The largest tile-multiple token budget whose full step, with no earlier context, fits the
    target: the fixed budget nearest a time budget (its later chunks of a long prompt do not)."""
    low, high = 1, 16384 // TILE_TOKENS
    while low < high:
        mid = (low + high + 1) // 2
        fits = full_step_ms(costs, mid * TILE_TOKENS) <= step_budget_ms
        low, high = (mid, high) if fits else (low, mid - 1)
    return low * TILE_TOKENS


@dataclass(frozen=True, slots=True)
class TunePlan:
    """A :class:`TuneRequest` with its defaults resolved: the searches' config, the cost model's
    ridge, and how a default SLO was derived (``slo_notes``)."""

    request: TuneRequest
    config: TuneConfig
    ridge_tokens: float
    slo_notes: Mapping[str, str]


def plan_tune(request: TuneRequest) -> TunePlan:
    """Resolve ``request``'s defaults (no trial runs); ValueError, one line, for a request that
    cannot run."""
    costs = request.base.costs
    ridge = ridge_tokens(costs)
    budgets = request.budgets or budget_candidates(ridge)
    limits, notes = dict(request.slos), {}
    if "tbt_p99_ms" not in limits:
        strict, notes["tbt_p99_ms"] = strict_tbt_p99_ms(costs)
        limits = {"tbt_p99_ms": strict, **limits}
    step_budgets = request.step_budgets_ms
    if step_budgets == "auto":
        step_budgets = tuple(round(f * limits["tbt_p99_ms"], 1) for f in STEP_BUDGET_FRACTIONS)
    assert not isinstance(step_budgets, str)
    if step_budgets and "chunked" not in request.policies:
        raise ValueError("step budgets are chunked candidates: include chunked in the policies")
    config = TuneConfig(
        base=request.base,
        policies=request.policies,
        budgets=tuple(budgets),
        slos=Slos.from_mapping(limits),
        max_num_seqs=request.max_num_seqs,
        precision=request.precision,
        qps_start=request.qps_start,
        step_budgets_ms=step_budgets,
        speculative_tokens=request.speculative_tokens,
        speculation=request.speculation,
    )
    return TunePlan(request, config, ridge, notes)


def advise(
    plan: TunePlan, pool: TrialPool, *, progress: bool = False
) -> tuple[dict[str, Any], TuneInterrupted | None]:
    """Run ``plan``'s searches on ``pool``; the result as JSON and, after a Ctrl-C (or SIGTERM),
    the interruption (the JSON then holds what finished, ``partial: true``)."""
    request, config, costs = plan.request, plan.config, plan.request.base.costs
    started = time.perf_counter()
    interrupted: TuneInterrupted | None = None
    try:
        result = tune(config, pool, progress=progress)
    except TuneInterrupted as error:
        interrupted, result = error, error.result
    out = result.to_json()
    if interrupted is not None:
        out["partial"] = True
        out["interrupted"] = {
            "searches_finished": len(result.points),
            "searches": interrupted.num_searches,
            "unfinished": [search.to_json() for search in interrupted.unfinished],
        }
    measured = pick_once(costs).measured
    if measured is not None:  # steps priced as the profiled machine ran them, not on the preset
        out["hardware"] = machine_label(measured.profile.fingerprint)
    out["cost_model_note"] = request.cost_model_note
    out["prefix_caching"] = request.base.serving.enable_prefix_caching
    out["ridge_tokens"] = plan.ridge_tokens
    out["full_step_ms"] = {str(b): full_step_ms(costs, b) for b in config.budgets}
    out["slo_notes"] = dict(plan.slo_notes)
    best_time = out.get("time_budget", {}).get("best_step_budget_ms")
    if best_time is not None:
        closest = closest_fixed_budget(costs, best_time)
        out["time_budget"]["closest_fixed_budget"] = closest
        out["time_budget"]["commands"] = time_budget_commands(
            str(costs.model), costs.tp, best_time, closest, request.max_num_seqs
        )
    out["wall_s"] = time.perf_counter() - started
    return out, interrupted
