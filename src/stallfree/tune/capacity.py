"""``stallfree tune``'s core: a capacity search per (policy, budget), the curve, the best budget.

:func:`tune` turns a :class:`TuneConfig` into one :class:`~stallfree.tune.jobs.Job` per
(policy, budget), runs them on a pool and returns a :class:`TuneResult`: every trial, each
(policy, budget)'s capacity, the best budget per policy and, when no budget meets the SLOs,
the trial that came closest. ``step_budgets_ms`` adds chunked candidates sized by time (each a
step-time target with the default token cap); the result compares the best of them with the
best fixed budget and names the closest vLLM / SGLang flags (:func:`time_budget_commands`). Invariant: for the same config the result is the same on every
pool (see :mod:`stallfree.tune.jobs`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from stallfree.core import DEFAULT_STEP_TOKEN_CAP
from stallfree.core.serving import ServingConfig
from stallfree.costs.aiconfigurator import AIC_SHORT_NAMES
from stallfree.sim.deployment import Deployment, Speculation
from stallfree.specs.model_presets import HF_REPOS
from stallfree.tune.jobs import Job, JobsInterrupted, TrialRecord, run_jobs
from stallfree.tune.pools import TrialPool
from stallfree.tune.search import CapacitySearch, SearchConfig
from stallfree.tune.slo import Slos
from stallfree.tune.trial import TrialSpec, check_spec, estimate_qps

# The search brackets within this factor either side of its starting QPS (2^7: 7 doublings).
QPS_RANGE_FACTOR = 128.0


@dataclass(frozen=True, slots=True)
class TuneConfig:
    """``base`` fixes the deployment and workload; its policy, budget and QPS are replaced.

    Each candidate runs at most ``max_num_seqs`` sequences, fewer under a smaller chunked budget
    (:meth:`~stallfree.core.serving.ServingConfig.at_most_seqs`).
    """

    base: TrialSpec
    policies: tuple[str, ...]
    budgets: tuple[int, ...]
    slos: Slos
    max_num_seqs: int = 256
    precision: float = 0.05
    qps_start: float | None = None  # None: estimated per budget from the roofline
    step_budgets_ms: tuple[float, ...] = ()  # chunked candidates sized by time
    speculative_tokens: tuple[int, ...] = ()  # chunked candidates verifying this many drafts (base's rule)
    speculation: Speculation | None = None  # how those drafts fare

    def __post_init__(self) -> None:
        if not self.policies:
            raise ValueError("give at least one policy")
        if not self.budgets:
            raise ValueError("give at least one token budget")
        if len(set(self.policies)) != len(self.policies) or len(set(self.budgets)) != len(self.budgets):
            raise ValueError("policies and budgets must not repeat")
        if len(set(self.step_budgets_ms)) != len(self.step_budgets_ms):
            raise ValueError("step budgets must not repeat")
        if self.step_budgets_ms and "chunked" not in self.policies:
            raise ValueError("step budgets are chunked candidates: include the chunked policy")
        if len(set(self.speculative_tokens)) != len(self.speculative_tokens):
            raise ValueError("draft lengths must not repeat")
        if any(k < 0 for k in self.speculative_tokens):
            raise ValueError("draft lengths must be >= 0")
        if any(self.speculative_tokens) and "chunked" not in self.policies:
            raise ValueError("draft lengths are chunked candidates: include the chunked policy")
        if any(self.speculative_tokens) and self.speculation is None:
            raise ValueError("draft lengths need acceptance rates")


@dataclass(frozen=True, slots=True)
class CapacityPoint:
    """One (policy, budget)'s search outcome; ``capacity_qps`` 0 means no QPS tried met the SLOs."""

    policy: str
    token_budget: int
    max_num_seqs: int
    capacity_qps: float
    hit_qps_max: bool
    num_trials: int
    step_budget_ms: float | None = None  # a time-budgeted chunked candidate (token_budget: its cap)
    num_speculative_tokens: int = 0  # drafts each decode verifies


def tune_searches(config: TuneConfig) -> list[tuple[TrialSpec, CapacitySearch]]:
    """One capacity search per (policy, budget) and per step budget, checked before anything runs."""
    base, seqs = config.base, config.max_num_seqs
    drafts = config.speculative_tokens or (0,)
    specs = [
        _candidate(
            base.with_serving(seqs, policy=policy, max_num_batched_tokens=budget, step_budget_ms=None),
            k,
            config.speculation,
        )
        for policy in config.policies
        for budget in config.budgets
        for k in (drafts if policy == "chunked" else (0,))
    ]
    specs += [
        base.with_serving(
            seqs, policy="chunked", max_num_batched_tokens=DEFAULT_STEP_TOKEN_CAP, step_budget_ms=step_ms
        )
        for step_ms in config.step_budgets_ms
    ]
    searches = []
    for spec in specs:
        check_spec(spec)
        start = config.qps_start if config.qps_start is not None else estimate_qps(spec)
        searches.append((spec, capacity_search(start, config.precision)))
    return searches


def _candidate(spec: TrialSpec, k: int, speculation: Speculation | None) -> TrialSpec:
    """``spec`` verifying ``k`` drafts a decode (none: ``spec`` itself)."""
    if not k:
        return spec
    return spec.with_deployment(
        serving=replace(spec.serving, num_speculative_tokens=k), speculation=speculation
    )


def capacity_search(start_qps: float, precision: float) -> CapacitySearch:
    """A search for the highest QPS meeting the SLOs, from ``start_qps`` and within
    :data:`QPS_RANGE_FACTOR` of it either way."""
    return CapacitySearch(
        SearchConfig(
            qps_start=start_qps,
            precision=precision,
            qps_min=start_qps / QPS_RANGE_FACTOR,
            qps_max=start_qps * QPS_RANGE_FACTOR,
        )
    )


@dataclass(frozen=True, slots=True)
class UnfinishedSearch:
    """A (policy, budget)'s search cut short: its capacity lies in ``[passed_qps, failed_qps)``
    as far as its trials tell (None: no trial passed, or none failed, yet)."""

    policy: str
    token_budget: int
    step_budget_ms: float | None
    num_trials: int
    passed_qps: float | None
    failed_qps: float | None

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "token_budget": self.token_budget,
            "step_budget_ms": self.step_budget_ms,
            "num_trials": self.num_trials,
            "passed_qps": self.passed_qps,
            "failed_qps": self.failed_qps,
        }


class TuneInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) during :func:`tune`; ``result`` holds the (policy, budget) searches that
    had finished and every trial run, ``unfinished`` the bounds the other searches had reached,
    and ``num_searches`` how many searches there were in all."""

    def __init__(self, result: TuneResult, unfinished: list[UnfinishedSearch], num_searches: int) -> None:
        super().__init__()
        self.result = result
        self.unfinished = unfinished
        self.num_searches = num_searches


def tune(config: TuneConfig, pool: TrialPool, *, progress: bool = False) -> TuneResult:
    searches = tune_searches(config)
    jobs = [Job(spec, search) for spec, search in searches]
    try:
        trials = run_jobs(jobs, pool, config.slos, progress=progress, desc="tune")
    except JobsInterrupted as interrupted:
        finished = [(spec, search) for spec, search in searches if search.is_done]
        unfinished = [
            UnfinishedSearch(
                policy=spec.serving.policy,
                token_budget=spec.token_budget,
                step_budget_ms=spec.serving.step_budget_ms,
                num_trials=search.num_trials,
                passed_qps=search.lo,
                failed_qps=search.hi,
            )
            for spec, search in searches
            if not search.is_done
        ]
        result = TuneResult(config, _points(finished), interrupted.records)
        raise TuneInterrupted(result, unfinished, len(searches)) from None
    return TuneResult(config, _points(searches), trials)


def _points(searches: list[tuple[TrialSpec, CapacitySearch]]) -> list[CapacityPoint]:
    points = []
    for spec, search in searches:
        points.append(
            CapacityPoint(
                policy=spec.serving.policy,
                token_budget=spec.token_budget,
                max_num_seqs=spec.serving.num_seqs_limit,
                capacity_qps=search.capacity_qps,
                hit_qps_max=search.hit_qps_max,
                num_trials=search.num_trials,
                step_budget_ms=spec.serving.step_budget_ms,
                num_speculative_tokens=spec.serving.num_speculative_tokens,
            )
        )
    return points


@dataclass(frozen=True, slots=True)
class TuneResult:
    config: TuneConfig
    points: list[CapacityPoint]
    trials: list[TrialRecord]

    def best(self, policy: str) -> CapacityPoint | None:
        """The fixed budget (and draft length) with the highest capacity (on a tie, the smaller
        budget, then fewer drafts); None if none met."""
        candidates = [
            p for p in self.points if p.policy == policy and p.capacity_qps > 0 and p.step_budget_ms is None
        ]
        return max(
            candidates,
            key=lambda p: (p.capacity_qps, -p.token_budget, -p.num_speculative_tokens),
            default=None,
        )

    def best_deployment(self) -> Deployment | None:
        """The fixed budget (and draft length) of the policy with the highest capacity, as a
        deployment to run (None if none met the SLOs)."""
        points = [p for p in (self.best(policy) for policy in self.config.policies) if p is not None]
        best = max(points, key=lambda p: p.capacity_qps, default=None)
        if best is None:
            return None
        spec = self.config.base.with_serving(
            best.max_num_seqs,
            policy=best.policy,
            max_num_batched_tokens=best.token_budget,
            step_budget_ms=None,
        )
        return _candidate(spec, best.num_speculative_tokens, self.config.speculation).deployment

    def best_time_budget(self) -> CapacityPoint | None:
        """The step-time target with the highest capacity (the larger target on a tie)."""
        candidates = [p for p in self.points if p.step_budget_ms is not None and p.capacity_qps > 0]
        return max(candidates, key=lambda p: (p.capacity_qps, p.step_budget_ms or 0.0), default=None)

    def closest(self, policy: str | None = None) -> TrialRecord | None:
        """The trial whose worst SLO came nearest its limit (of ``policy``, or of all)."""
        trials = [t for t in self.trials if policy is None or t.spec.serving.policy == policy]
        return min(trials, key=lambda t: self.config.slos.worst_ratio(t.metrics), default=None)

    def to_json(self) -> dict[str, Any]:
        base = self.config.base
        costs = base.costs
        out: dict[str, Any] = {
            "model": str(costs.model),
            "hardware": costs.hardware,
            "tp": costs.tp,
            "expert_parallel": costs.expert_parallel,
            "cost_model": base.columns()["cost_model"],
            "gpu_memory_utilization": base.deployment.gpu_memory_utilization,
            "num_blocks": base.serving.num_blocks,
            "workload": {
                "lengths": base.lengths,
                "arrival": base.arrival,
                "burstiness": base.burstiness,
                "num_requests": base.num_requests,
                "seed": base.seed,
            },
            "slos": self.config.slos.as_dict(),
            "precision": self.config.precision,
            **self._speculative_json(),
            "policies": {policy: self._policy_json(policy) for policy in self.config.policies},
            "deployment": None
            if (best_deployment := self.best_deployment()) is None
            else best_deployment.to_dict(),
            "trials": [t.to_json() for t in self.trials],
        }
        if self.config.step_budgets_ms:
            out["time_budget"] = self._time_budget_json()
        return out

    def _speculative_json(self) -> dict[str, Any]:
        """``{"speculative": ...}``: the draft lengths tried, their acceptance, rule and drafter
        (``{}`` when no drafts were tried)."""
        speculation = self.config.speculation
        if not self.config.speculative_tokens or speculation is None:
            return {}
        return {
            "speculative": {
                "draft_lengths": list(self.config.speculative_tokens),
                "acceptance_rates": list(speculation.acceptance.rates),
                "rule": self.config.base.serving.speculative_rule,
                "draft": speculation.draft,
            }
        }

    def _policy_json(self, policy: str) -> dict[str, Any]:
        """One policy's entry: its best fixed budget, its capacity curve and then, if no budget met,
        the closest trial, else (chunked) the vLLM / SGLang launch lines."""
        best = self.best(policy)
        drafts = bool(self.config.speculative_tokens) and policy == "chunked"
        entry: dict[str, Any] = {
            "best_budget": best.token_budget if best else None,
            "capacity_qps": best.capacity_qps if best else 0.0,
            "max_num_seqs": best.max_num_seqs if best else None,
            **({"best_speculative_tokens": best.num_speculative_tokens if best else None} if drafts else {}),
            "curve": [
                {
                    "token_budget": p.token_budget,
                    **({"num_speculative_tokens": p.num_speculative_tokens} if drafts else {}),
                    "max_num_seqs": p.max_num_seqs,
                    "capacity_qps": p.capacity_qps,
                    "hit_qps_max": p.hit_qps_max,
                    "num_trials": p.num_trials,
                }
                for p in self.points
                if p.policy == policy and p.step_budget_ms is None
            ],
        }
        if best is None:
            closest = self.closest(policy)
            entry["closest"] = closest.to_json() if closest else None
        elif policy == "chunked":
            base = self.config.base
            costs = base.costs
            entry["commands"] = serve_commands(
                str(costs.model),
                costs.tp,
                best.token_budget,
                best.max_num_seqs,
                base.serving.enable_prefix_caching,
                fp8=costs.dtype_bytes == 1,
                expert_parallel=costs.expert_parallel,
                speculative=(best.num_speculative_tokens, base.serving.speculative_rule)
                if best.num_speculative_tokens
                else None,
                draft=self.config.speculation.draft if self.config.speculation else "ngram",
            )
        return entry

    def _time_budget_json(self) -> dict[str, Any]:
        best, fixed = self.best_time_budget(), self.best("chunked")
        return {
            "best_step_budget_ms": best.step_budget_ms if best else None,
            "capacity_qps": best.capacity_qps if best else 0.0,
            "best_fixed_capacity_qps": fixed.capacity_qps if fixed else 0.0,
            "curve": [
                {
                    "step_budget_ms": p.step_budget_ms,
                    "token_cap": p.token_budget,
                    "max_num_seqs": p.max_num_seqs,
                    "capacity_qps": p.capacity_qps,
                    "hit_qps_max": p.hit_qps_max,
                    "num_trials": p.num_trials,
                }
                for p in self.points
                if p.step_budget_ms is not None
            ],
        }


def serve_commands(
    model: str,
    tp: int,
    token_budget: int,
    max_num_seqs: int,
    prefix_caching: bool = True,
    *,
    fp8: bool = False,
    expert_parallel: bool = False,
    speculative: tuple[int, str] | None = None,
    draft: str = "ngram",
) -> dict[str, str]:
    """The vLLM and SGLang launch lines for a chunked budget (presets and short names by their HF
    repository; ``fp8``: fp8 weights and KV cache, ``expert_parallel``: the experts split whole
    over the ``tp`` GPUs, as the simulation priced them); both cache prefixes by default, so only
    a run without the cache says so. ``speculative`` = (k, rule): k drafts a step, as simulated
    under that framework's rule: only its line is given (the other shares a step differently, so
    the capacity was not simulated for it); ``draft``: n-gram lookup, an EAGLE head (its path is
    yours: ``PATH/TO/EAGLE-HEAD``) or ``model:NAME``."""
    model = HF_REPOS.get(model) or AIC_SHORT_NAMES.get(model, model)
    vllm = (
        f"vllm serve {model} --max-num-batched-tokens {token_budget} --max-num-seqs {max_num_seqs} "
        "--enable-chunked-prefill"
    )
    sglang = (
        f"python -m sglang.launch_server --model-path {model} --chunked-prefill-size {token_budget} "
        f"--max-running-requests {max_num_seqs}"
    )
    if not prefix_caching:
        vllm += " --no-enable-prefix-caching"
        sglang += " --disable-radix-cache"
    if tp > 1:
        vllm += f" --tensor-parallel-size {tp}"
        sglang += f" --tp {tp}"
    if expert_parallel:
        vllm += " --enable-expert-parallel"  # EP over the TP group: vLLM's EP size is TP x DP
        sglang += f" --ep-size {tp}"
    if fp8:
        vllm += " --quantization fp8 --kv-cache-dtype fp8"
        sglang += " --quantization fp8 --kv-cache-dtype fp8_e4m3"
    if speculative is None:
        return {"vllm": vllm, "sglang": sglang}
    k, rule = speculative
    head = "PATH/TO/EAGLE-HEAD"
    name = draft.removeprefix("model:")
    drafter = (HF_REPOS.get(name) or AIC_SHORT_NAMES.get(name, name)) if draft.startswith("model:") else head
    if rule == "vllm":
        config = {"ngram": {"method": "ngram"}, "eagle": {"method": "eagle", "model": head}}.get(
            draft, {"method": "draft_model", "model": drafter}
        )
        return {
            "vllm": vllm + f" --speculative-config '{json.dumps({**config, 'num_speculative_tokens': k})}'"
        }
    # SGLang counts the verify window (the drafts and the token before them); a chain, not a tree
    if draft == "ngram":
        flags = f"--speculative-algorithm NGRAM --speculative-num-draft-tokens {k + 1} --speculative-ngram-max-bfs-breadth 1"
    else:
        algorithm = "EAGLE" if draft == "eagle" else "STANDALONE"
        flags = (
            f"--speculative-algorithm {algorithm} --speculative-draft-model-path {drafter} "
            f"--speculative-num-steps {k} --speculative-eagle-topk 1 --speculative-num-draft-tokens {k + 1}"
        )
    return {"sglang": f"{sglang} {flags}"}


TIME_BUDGET_GAP = (
    "neither can hold a step to a time: vLLM's --max-num-batched-tokens and SGLang's "
    "--chunked-prefill-size fix tokens, so a long prompt's later chunks (attention over its earlier "
    "context) run past the target; SGLang's --enable-dynamic-chunking shrinks later chunks only with "
    "pipeline parallelism (--pp-size > 1), from a fitted cost curve, not to a step-time target, and "
    "neither counts the decodes' time in the step"
)


def time_budget_commands(
    model: str, tp: int, step_budget_ms: float, closest_budget: int, max_num_seqs: int
) -> dict[str, str]:
    """The launch lines closest to a step-time target: the fixed budget whose step with no earlier
    context (``closest_budget``) fits it, and what those flags cannot express."""
    seqs = ServingConfig(max_num_batched_tokens=closest_budget).at_most_seqs(max_num_seqs).num_seqs_limit
    commands = serve_commands(model, tp, closest_budget, seqs)
    return {
        **commands,
        "stallfree": f"stallfree serve --model {model} --step-budget-ms {step_budget_ms:g} --profile PROFILE.json",
        "cannot_express": TIME_BUDGET_GAP,
    }
