"""One trial: a seeded simulation of one deployment at one QPS, described by a :class:`TrialSpec`.

A spec is a frozen value of strings and numbers (specs are named by preset or path), so it
pickles to worker processes and Ray tasks unchanged, and its :meth:`~TrialSpec.key` names the
trial in a resumable sweep. :func:`run_trial` is the trial function the backends run: spec in,
vLLM-keyed summary out, nothing else. The same spec gives the same summary in any process.

Workloads use common random numbers across QPS: the seed fixes the request lengths and the
shape of the arrival gaps, and the QPS only rescales the gaps, so a capacity search compares
the same requests arriving faster or slower.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from stallfree.core import DEFAULT_TOKEN_BUDGET
from stallfree.core.serving import ServingConfig
from stallfree.costs.choice import CostChoice, pick_once
from stallfree.costs.kv_transfer import PoolShape
from stallfree.metrics import Summary
from stallfree.sim.api import SimulationResult, simulate
from stallfree.sim.deployment import Deployment
from stallfree.workload import Workload, gamma, parse_lengths, sample
from stallfree.workload.arrivals import ReplayArrivals
from stallfree.workload.lengths import TraceLengths

ARRIVALS = ("poisson", "gamma", "trace")
DEFAULT_SERVING = ServingConfig(max_num_batched_tokens=DEFAULT_TOKEN_BUDGET)


@dataclass(frozen=True, slots=True, kw_only=True)
class TrialSpec:
    """Everything that decides a trial's result: the :class:`~stallfree.sim.deployment.Deployment`
    (its cost choice named by strings and numbers: a kind, presets or paths; its serving config
    naming its token budget) and the workload. ``arrival`` ``trace``: the arrival times of the
    trace ``lengths`` names (with its lengths, in order), replayed at ``qps`` requests a second."""

    deployment: Deployment
    qps: float = 1.0
    lengths: str = "sharegpt"
    arrival: str = "poisson"
    burstiness: float = 1.0
    num_requests: int = 1000
    seed: int = 0

    def __post_init__(self) -> None:
        if self.arrival not in ARRIVALS:
            raise ValueError(f"unknown arrival {self.arrival!r}; choose from {', '.join(ARRIVALS)}")
        for label, value in (("qps", self.qps), ("burstiness", self.burstiness)):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{label} must be a positive number, got {value}")
        if self.num_requests <= 0:
            raise ValueError(f"num_requests must be positive, got {self.num_requests}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        if not isinstance(self.costs.model, str) or not isinstance(self.costs.hardware, str):
            raise ValueError("a trial names its model and hardware (preset or path), so it pickles and keys")
        if self.costs.profile is not None and not isinstance(self.costs.profile, str):
            raise ValueError("a trial names its profile by path")
        if self.serving.max_num_batched_tokens is None:
            raise ValueError("a trial's serving config names its max_num_batched_tokens")
        if self.deployment.fleet:
            raise ValueError("a trial's replicas are alike (no fleet of replica groups)")

    @classmethod
    def of(cls, costs: CostChoice, serving: ServingConfig = DEFAULT_SERVING, **fields: Any) -> TrialSpec:
        """A lone replica priced by ``costs``, scheduled by ``serving``; ``fields``: the workload's."""
        return cls(deployment=Deployment(costs=costs, serving=serving), **fields)

    @property
    def costs(self) -> CostChoice:
        return self.deployment.costs

    @property
    def serving(self) -> ServingConfig:
        return self.deployment.serving

    @property
    def pools(self) -> PoolShape | None:
        """A disaggregated deployment's pools (None: aggregated)."""
        d = self.deployment.disaggregate
        return None if d is None else d.shape

    @property
    def num_gpus(self) -> int:
        return self.deployment.num_gpus

    @property
    def token_budget(self) -> int:
        """vLLM's ``--max-num-batched-tokens`` (SGLang's ``--chunked-prefill-size``): the chunked
        budget (a time-budgeted candidate's cap) or the whole-prompt policies' batch cap."""
        assert self.serving.max_num_batched_tokens is not None  # checked when built
        return self.serving.max_num_batched_tokens

    def columns(self) -> dict[str, object]:
        """The spec as flat named values (a sweep's CSV columns, :data:`COLUMNS`)."""
        c, s = self.costs, self.serving
        return {
            "model": c.model,
            "hardware": c.hardware,
            "tp": c.tp,
            "policy": s.policy,
            "token_budget": s.max_num_batched_tokens,
            "max_num_seqs": s.num_seqs_limit,
            "qps": self.qps,
            "lengths": self.lengths,
            "arrival": self.arrival,
            "burstiness": self.burstiness,
            "num_requests": self.num_requests,
            "seed": self.seed,
            "cost_model": c.kind if c.profile is None else f"measured:{c.profile}",
            "gpu_memory_utilization": self.deployment.gpu_memory_utilization,
            "step_budget_ms": s.step_budget_ms,
            "num_blocks": s.num_blocks,
            "num_speculative_tokens": s.num_speculative_tokens,
        }

    def key(self) -> str:
        """A stable 16-hex-digit name of this trial (same spec, same key, in any process). The
        fields hashed are those a trial had before deployments were one value (a lone replica's
        leave the fleet's out, one without drafts the speculative ones), so a sweep's trials keep
        their keys."""
        d = self.deployment
        spec, pools = d.speculation, self.pools
        fields: dict[str, Any] = {
            "costs": dataclasses.asdict(self.costs),
            "serving": dataclasses.asdict(self.serving),
            **{name: getattr(self, name) for name in ("qps", "lengths", "arrival", "burstiness")},
            **{name: getattr(self, name) for name in ("num_requests", "seed")},
            "gpu_memory_utilization": d.gpu_memory_utilization,
        }
        if d.replicas != 1 or d.router != "round-robin" or d.route_delay_ms:
            fields.update(replicas=d.replicas, router=d.router, route_delay_ms=d.route_delay_ms)
        if d.kv_tiers is not None:
            fields.update(kv_tiers=dataclasses.asdict(d.kv_tiers))
        if spec is not None:
            fields.update(acceptance_rates=list(spec.acceptance.rates), draft=spec.draft)
        else:
            for name in ("num_speculative_tokens", "speculative_rule"):
                del fields["serving"][name]
        if self.serving.scheduling_policy == "fcfs":
            del fields["serving"]["scheduling_policy"]
        if d.disaggregate is not None and pools is not None:
            fields.update(
                disaggregate=f"{pools.num_prefill}P{pools.num_decode}D",
                decode_tp=pools.tp_decode,
                kv_link=d.disaggregate.kv_link,
                prefill_token_budget=d.disaggregate.prefill_token_budget,
            )
        text = json.dumps(fields, sort_keys=True)
        return hashlib.sha1(text.encode()).hexdigest()[:16]

    def at_qps(self, qps: float) -> TrialSpec:
        return dataclasses.replace(self, qps=qps)

    def at_replicas(self, replicas: int) -> TrialSpec:
        return self.with_deployment(replicas=replicas)

    def with_deployment(self, **changes: Any) -> TrialSpec:
        """This spec with its deployment's ``changes`` (field names of :class:`Deployment`)."""
        return dataclasses.replace(self, deployment=dataclasses.replace(self.deployment, **changes))

    def with_serving(self, max_num_seqs: int, **changes: Any) -> TrialSpec:
        """This spec scheduling as ``changes`` say, running at most ``max_num_seqs`` sequences
        (fewer under a smaller chunked budget: :meth:`ServingConfig.at_most_seqs`)."""
        serving = dataclasses.replace(self.serving, max_num_seqs=None, **changes)
        return self.with_deployment(serving=serving.at_most_seqs(max_num_seqs))


COLUMNS = tuple(TrialSpec.of(CostChoice(model="m")).columns())


def check_spec(spec: TrialSpec) -> None:
    """Fail now, in one clear ``ValueError``, on what would fail in every worker: the lengths,
    then the deployment, by a run of one tiny request."""
    _workload(spec)
    _simulate(dataclasses.replace(spec, lengths="fixed:16,2", num_requests=1, arrival="poisson"))


def run_trial(spec: TrialSpec) -> Summary:
    """Simulate ``spec``; its numeric summary (keys as :func:`stallfree.metrics.summarize`, plus
    ``num_steps`` and ``num_kv_blocks``)."""
    summary = _simulate(spec).summary
    numbers = {
        k: v
        for k, v in summary.items()
        if v is None or (isinstance(v, int | float) and not isinstance(v, bool))
    }
    if (pools := summary.get("disaggregation")) is not None:  # what says why a layout wins
        numbers.update(
            prefill_busy=pools["prefill"]["busy"],
            decode_busy=pools["decode"]["busy"],
            link_busy=pools["link_busy"],
            p99_kv_transfer_ms=pools["p99_kv_transfer_ms"],
            p99_prefill_ms=pools["p99_prefill_ms"],
        )
    return numbers


def _simulate(spec: TrialSpec) -> SimulationResult:
    return simulate(_workload(spec), spec.deployment, num_requests=spec.num_requests, seed=spec.seed)


def estimate_qps(spec: TrialSpec) -> float:
    """A rough QPS to start a capacity search at: half of what the budget could push through.

    A step full of ``token_budget`` tokens moves ``token_budget / step time`` tokens per second
    and a request needs its prompt plus output tokens; latency SLOs cut capacity below that.
    """
    cost = pick_once(spec.costs).pricer
    arrays = sample(_workload(spec), min(spec.num_requests, 1000), spec.seed)
    tokens_per_request = float(arrays.num_prompt_tokens.mean() + arrays.max_tokens.mean())
    tokens_per_s = spec.token_budget / cost.prefill_time_s(spec.token_budget)
    return 0.5 * tokens_per_s / tokens_per_request


def ridge_tokens(costs: CostChoice) -> float:
    return pick_once(costs).pricer.ridge_tokens()


def decode_step_ms(costs: CostChoice, num_seqs: int, context_len: int) -> float:
    """One decode step with no prompt in it (the yardstick of Sarathi-Serve's TBT SLOs); the
    roofline's ``full`` kind unless the steps are measured."""
    if costs.kind != "measured" and costs.profile is None:
        costs = dataclasses.replace(costs, kind="full")
    return pick_once(costs).pricer.decode_step_s(num_seqs, context_len) * 1000


def full_step_ms(costs: CostChoice, token_budget: int) -> float:
    """One step filled with ``token_budget`` prompt tokens: the gap a full chunk puts between
    two tokens of every running stream."""
    return pick_once(costs).pricer.prefill_time_s(token_budget) * 1000


def _workload(spec: TrialSpec) -> Workload:
    if spec.arrival == "trace":
        return Workload(
            arrivals=ReplayArrivals(spec.lengths, trace_qps(spec.lengths, spec.num_requests) / spec.qps),
            lengths=TraceLengths(spec.lengths, "in-order"),
        )
    return Workload(arrivals=gamma(spec.qps, spec.burstiness), lengths=parse_lengths(spec.lengths))


@functools.lru_cache(maxsize=8)
def trace_qps(trace: str, num_requests: int) -> float:
    """A trace's own rate over its first ``num_requests`` rows: the gaps between them, a second."""
    arrivals_s = ReplayArrivals(trace).times_s(num_requests, np.random.default_rng(0))
    span_s = float(arrivals_s[-1])
    if span_s <= 0:
        raise ValueError(
            f"trace {trace}: its first {num_requests} requests arrive at once, so they have no rate"
        )
    return (num_requests - 1) / span_s
