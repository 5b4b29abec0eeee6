"""``stallfree tune``'s core: a capacity search per (policy, budget), the curve, the best budget.

:func:`tune` turns a :class:`TuneConfig` into one :class:`~stallfree.tune.jobs.Job` per
(policy, budget), runs them on a pool and returns a :class:`TuneResult`: every trial, each
(policy, budget)'s capacity, the best budget per policy and, when no budget meets the SLOs,
the trial that came closest. Invariant: for the same config the result is the same on every
pool (see :mod:`stallfree.tune.jobs`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

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

    Each budget runs with ``min(max_num_seqs, budget)`` sequences, since every running sequence
    needs its decode token inside the budget (vLLM enforces the same).
    """

    base: TrialSpec
    policies: tuple[str, ...]
    budgets: tuple[int, ...]
    slos: Slos
    max_num_seqs: int = 256
    precision: float = 0.05
    qps_start: float | None = None  # None: estimated per budget from the roofline

    def __post_init__(self) -> None:
        if not self.policies:
            raise ValueError("give at least one policy")
        if not self.budgets:
            raise ValueError("give at least one token budget")
        if len(set(self.policies)) != len(self.policies) or len(set(self.budgets)) != len(self.budgets):
            raise ValueError("policies and budgets must not repeat")


@dataclass(frozen=True, slots=True)
class CapacityPoint:
    """One (policy, budget)'s search outcome; ``capacity_qps`` 0 means no QPS tried met the SLOs."""

    policy: str
    token_budget: int
    max_num_seqs: int
    capacity_qps: float
    hit_qps_max: bool
    num_trials: int


def tune_searches(config: TuneConfig) -> list[tuple[TrialSpec, CapacitySearch]]:
    """One capacity search per (policy, budget), checked before anything runs."""
    searches = []
    for policy in config.policies:
        for budget in config.budgets:
            spec = dataclasses.replace(
                config.base, policy=policy, token_budget=budget, max_num_seqs=min(config.max_num_seqs, budget)
            )
            check_spec(spec)
            start = config.qps_start if config.qps_start is not None else estimate_qps(spec)
            search = SearchConfig(
                qps_start=start,
                precision=config.precision,
                qps_min=start / QPS_RANGE_FACTOR,
                qps_max=start * QPS_RANGE_FACTOR,
            )
            searches.append((spec, CapacitySearch(search)))
    return searches


class TuneInterrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`tune`; ``result`` holds only the (policy, budget) searches that had
    finished, and ``num_searches`` how many there were in all."""

    def __init__(self, result: TuneResult, num_searches: int) -> None:
        super().__init__()
        self.result = result
        self.num_searches = num_searches


def tune(config: TuneConfig, pool: TrialPool, *, progress: bool = False) -> TuneResult:
    searches = tune_searches(config)
    jobs = [Job(spec, search) for spec, search in searches]
    try:
        trials = run_jobs(jobs, pool, config.slos, progress=progress, desc="tune")
    except JobsInterrupted as interrupted:
        finished = [(spec, search) for spec, search in searches if search.is_done]
        result = TuneResult(config, _points(finished), interrupted.records)
        raise TuneInterrupted(result, len(searches)) from None
    return TuneResult(config, _points(searches), trials)


def _points(searches: list[tuple[TrialSpec, CapacitySearch]]) -> list[CapacityPoint]:
    points = []
    for spec, search in searches:
        points.append(
            CapacityPoint(
                policy=spec.policy,
                token_budget=spec.token_budget,
                max_num_seqs=spec.max_num_seqs,
                capacity_qps=search.capacity_qps,
                hit_qps_max=search.hit_qps_max,
                num_trials=search.num_trials,
            )
        )
    return points


@dataclass(frozen=True, slots=True)
class TuneResult:
    config: TuneConfig
    points: list[CapacityPoint]
    trials: list[TrialRecord]

    def best(self, policy: str) -> CapacityPoint | None:
        """The budget with the highest capacity (the smaller budget on a tie); None if none met."""
        candidates = [p for p in self.points if p.policy == policy and p.capacity_qps > 0]
        return max(candidates, key=lambda p: (p.capacity_qps, -p.token_budget), default=None)

    def closest(self, policy: str | None = None) -> TrialRecord | None:
        """The trial whose worst SLO came nearest its limit (of ``policy``, or of all)."""
        trials = [t for t in self.trials if policy is None or t.spec.policy == policy]
        return min(trials, key=lambda t: self.config.slos.worst_ratio(t.metrics), default=None)

    def to_json(self) -> dict[str, Any]:
        base = self.config.base
        policies: dict[str, Any] = {}
        for policy in self.config.policies:
            best = self.best(policy)
            entry: dict[str, Any] = {
                "best_budget": best.token_budget if best else None,
                "capacity_qps": best.capacity_qps if best else 0.0,
                "max_num_seqs": best.max_num_seqs if best else None,
                "curve": [
                    {
                        "token_budget": p.token_budget,
                        "max_num_seqs": p.max_num_seqs,
                        "capacity_qps": p.capacity_qps,
                        "hit_qps_max": p.hit_qps_max,
                        "num_trials": p.num_trials,
                    }
                    for p in self.points
                    if p.policy == policy
                ],
            }
            if best is None:
                closest = self.closest(policy)
                entry["closest"] = closest.to_json() if closest else None
            elif policy == "chunked":
                entry["commands"] = serve_commands(base.model, base.tp, best.token_budget, best.max_num_seqs)
            policies[policy] = entry
        return {
            "model": base.model,
            "hardware": base.hardware,
            "tp": base.tp,
            "cost_model": base.cost_model,
            "gpu_memory_utilization": base.gpu_memory_utilization,
            "workload": {
                "lengths": base.lengths,
                "arrival": base.arrival,
                "burstiness": base.burstiness,
                "num_requests": base.num_requests,
                "seed": base.seed,
            },
            "slos": self.config.slos.as_dict(),
            "precision": self.config.precision,
            "policies": policies,
            "trials": [t.to_json() for t in self.trials],
        }


def serve_commands(model: str, tp: int, token_budget: int, max_num_seqs: int) -> dict[str, str]:
    """The vLLM and SGLang launch lines for a chunked budget (presets by their HF repository)."""
    model = HF_REPOS.get(model, model)
    vllm = (
        f"vllm serve {model} --max-num-batched-tokens {token_budget} --max-num-seqs {max_num_seqs} "
        "--enable-chunked-prefill"
    )
    sglang = (
        f"python -m sglang.launch_server --model-path {model} --chunked-prefill-size {token_budget} "
        f"--max-running-requests {max_num_seqs}"
    )
    if tp > 1:
        vllm += f" --tensor-parallel-size {tp}"
        sglang += f" --tp {tp}"
    return {"vllm": vllm, "sglang": sglang}
