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

from stallfree.core import DEFAULT_TOKEN_BUDGET
from stallfree.core.serving import ServingConfig
from stallfree.metrics import Summary
from stallfree.sim.api import SimulationResult, simulate
from stallfree.sim.costs import CostChoice, CostPick, pick_cost_model
from stallfree.workload import Workload, gamma, parse_lengths, sample

ARRIVALS = ("poisson", "gamma")


@dataclass(frozen=True, slots=True, kw_only=True)
class TrialSpec:
    """Everything that decides a trial's result. ``token_budget`` is vLLM's
    ``--max-num-batched-tokens`` (SGLang's ``--chunked-prefill-size``) for every policy."""

    model: str
    hardware: str
    tp: int = 1
    policy: str = "chunked"
    token_budget: int = DEFAULT_TOKEN_BUDGET
    max_num_seqs: int = 256
    qps: float = 1.0
    lengths: str = "sharegpt"
    arrival: str = "poisson"
    burstiness: float = 1.0
    num_requests: int = 1000
    seed: int = 0
    cost_model: str = "full"
    gpu_memory_utilization: float = 0.9
    step_budget_ms: float | None = None  # chunked: chunks sized by time; token_budget is then a cap
    num_blocks: int | None = None  # KV-cache blocks (default: from memory; a profile's engine sizing)

    def __post_init__(self) -> None:
        if self.arrival not in ARRIVALS:
            raise ValueError(f"unknown arrival {self.arrival!r}; choose from {', '.join(ARRIVALS)}")
        for label, value in (("qps", self.qps), ("burstiness", self.burstiness)):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{label} must be a positive number, got {value}")
        for label, count in (
            ("tp", self.tp),
            ("token_budget", self.token_budget),
            ("max_num_seqs", self.max_num_seqs),
            ("num_requests", self.num_requests),
            ("num_blocks", 1 if self.num_blocks is None else self.num_blocks),
        ):
            if count <= 0:
                raise ValueError(f"{label} must be positive, got {count}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")

    @property
    def serving(self) -> ServingConfig:
        """How the trial schedules: ``token_budget`` is the chunked budget or the batch cap."""
        return ServingConfig(
            policy=self.policy,
            max_num_batched_tokens=self.token_budget,
            max_num_seqs=self.max_num_seqs,
            step_budget_ms=self.step_budget_ms,
            num_blocks=self.num_blocks,
        )

    def key(self) -> str:
        """A stable 16-hex-digit name of this trial (same fields, same key, in any process; a spec
        without a step budget or a block count keeps the key it had before those fields existed)."""
        fields = dataclasses.asdict(self)
        for name in ("step_budget_ms", "num_blocks"):
            if fields[name] is None:
                del fields[name]
        text = json.dumps(fields, sort_keys=True)
        return hashlib.sha1(text.encode()).hexdigest()[:16]

    @property
    def costs(self) -> CostChoice:
        """How the trial prices steps (``cost_model`` is a kind, or ``measured:<profile path>``)."""
        return _choice(self.model, self.hardware, self.tp, self.cost_model)

    def at_qps(self, qps: float) -> TrialSpec:
        return dataclasses.replace(self, qps=qps)


def check_spec(spec: TrialSpec) -> None:
    """Fail now, in one clear ``ValueError``, on what would fail in every worker: the lengths,
    then the deployment, by a run of one tiny request."""
    _workload(spec)
    _simulate(dataclasses.replace(spec, lengths="fixed:16,2", num_requests=1))


def run_trial(spec: TrialSpec) -> Summary:
    """Simulate ``spec``; its numeric summary (keys as :func:`stallfree.metrics.summarize`, plus
    ``num_steps`` and ``num_kv_blocks``)."""
    summary = _simulate(spec).summary
    return {
        k: v
        for k, v in summary.items()
        if v is None or (isinstance(v, int | float) and not isinstance(v, bool))
    }


def _simulate(spec: TrialSpec) -> SimulationResult:
    return simulate(
        _workload(spec),
        _pick(spec.costs),
        spec.serving,
        gpu_memory_utilization=spec.gpu_memory_utilization,
        num_requests=spec.num_requests,
        seed=spec.seed,
    )


def estimate_qps(spec: TrialSpec) -> float:
    """A rough QPS to start a capacity search at: half of what the budget could push through.

    A step full of ``token_budget`` tokens moves ``token_budget / step time`` tokens per second
    and a request needs its prompt plus output tokens; latency SLOs cut capacity below that.
    """
    cost = _pick(spec.costs).pricer
    arrays = sample(_workload(spec), min(spec.num_requests, 1000), spec.seed)
    tokens_per_request = float(arrays.num_prompt_tokens.mean() + arrays.max_tokens.mean())
    tokens_per_s = spec.token_budget / cost.prefill_time_s(spec.token_budget)
    return 0.5 * tokens_per_s / tokens_per_request


def ridge_tokens(model: str, hardware: str, tp: int, cost_model: str = "full") -> float:
    return _pick(_choice(model, hardware, tp, cost_model)).pricer.ridge_tokens()


def decode_step_ms(
    model: str, hardware: str, tp: int, num_seqs: int, context_len: int, cost_model: str = "full"
) -> float:
    """One decode step with no prompt in it (the yardstick of Sarathi-Serve's TBT SLOs); the
    roofline's ``full`` kind unless ``cost_model`` is measured."""
    kind = cost_model if cost_model.startswith("measured") else "full"
    return _pick(_choice(model, hardware, tp, kind)).pricer.decode_step_s(num_seqs, context_len) * 1000


def full_step_ms(model: str, hardware: str, tp: int, cost_model: str, token_budget: int) -> float:
    """One step filled with ``token_budget`` prompt tokens: the gap a full chunk puts between
    two tokens of every running stream."""
    return _pick(_choice(model, hardware, tp, cost_model)).pricer.prefill_time_s(token_budget) * 1000


@functools.lru_cache(maxsize=16)
def _pick(choice: CostChoice) -> CostPick:
    return pick_cost_model(choice)


def _choice(model: str, hardware: str, tp: int, cost_model: str) -> CostChoice:
    """A spec's strings as a choice: a kind, or ``measured:<profile path>`` (a spec holds only strings)."""
    profile = cost_model.removeprefix("measured:") if cost_model.startswith("measured:") else None
    return CostChoice("measured" if profile else cost_model, model, hardware, tp, profile)


def _workload(spec: TrialSpec) -> Workload:
    return Workload(arrivals=gamma(spec.qps, spec.burstiness), lengths=parse_lengths(spec.lengths))
