"""``stallfree tune --gpus N --mode agg,disagg``: on N GPUs, replicas that each do everything, or
prefill and decode pools?

Every layout of the N GPUs is a candidate: aggregated, N / tp replicas of tp GPUs (for each TP
size that divides N) at each token budget; disaggregated, x prefill replicas of tp_p GPUs and y
decode replicas of tp_d with x tp_p + y tp_d = N, the prefill replicas at each budget at or past
the ridge point (they run no decodes, so smaller chunks only waste their compute), the decode
replicas at the base budget. Each gets a capacity search (the highest QPS at which a seeded
simulation meets every SLO, as a one-replica tune); they rank by goodput per GPU (that capacity
over N). Each row says what gave out first just above its capacity (the SLOs the lowest failing
trial missed) and how busy its pools and links were at capacity: why the winner wins.
Invariant: as every tune, the same config gives the same result on every pool.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from stallfree.costs.kv_transfer import DEFAULT_KV_LINK, PoolShape
from stallfree.sim.disagg import Disaggregation
from stallfree.tune.capacity import capacity_search, serve_commands
from stallfree.tune.fleet import SGLANG_ROUTER_POLICY, VLLM_ROUTER_POLICY
from stallfree.tune.jobs import Job, TrialRecord, searched
from stallfree.tune.pools import TrialPool
from stallfree.tune.search import CapacitySearch
from stallfree.tune.slo import Slos
from stallfree.tune.trial import TrialSpec, check_spec, estimate_qps

MODES = ("agg", "disagg")
AT_CAPACITY = (
    "p99_ttft_ms",
    "p99_tpot_ms",
    "p99_itl_ms",
    "request_throughput",
    "prefill_busy",
    "decode_busy",
    "link_busy",
    "p99_kv_transfer_ms",
)


@dataclass(frozen=True, slots=True)
class ModeTuneConfig:
    """``base``: the deployment (model, hardware, cost model, router) and workload; ``gpus`` to lay
    out; ``tp_sizes`` each replica may have; ``budgets``: the aggregated replicas' token budgets
    (the prefill replicas take those at or past ``ridge_tokens``, at least the largest)."""

    base: TrialSpec
    gpus: int
    modes: tuple[str, ...]
    tp_sizes: tuple[int, ...]
    budgets: tuple[int, ...]
    ridge_tokens: float
    slos: Slos
    kv_link: str = DEFAULT_KV_LINK
    max_num_seqs: int = 256
    precision: float = 0.05

    def __post_init__(self) -> None:
        unknown = [m for m in self.modes if m not in MODES]
        if unknown or not self.modes or len(set(self.modes)) != len(self.modes):
            raise ValueError(f"--mode: give one or both of {', '.join(MODES)}, each once")
        if self.gpus < 1 or not self.tp_sizes or min(self.tp_sizes) < 1:
            raise ValueError("give a positive GPU count and TP sizes")
        if "disagg" in self.modes and self.gpus < 2 * min(self.tp_sizes):
            raise ValueError(
                f"disaggregation needs a prefill and a decode replica: {self.gpus} GPUs are too few"
            )
        if "agg" in self.modes and not any(self.gpus % tp == 0 for tp in self.tp_sizes):
            raise ValueError(f"no TP size in {self.tp_sizes} divides {self.gpus} GPUs into replicas")

    @property
    def prefill_budgets(self) -> tuple[int, ...]:
        past = tuple(b for b in self.budgets if b >= self.ridge_tokens)
        return past or (max(self.budgets),)


def layouts(config: ModeTuneConfig) -> list[TrialSpec]:
    """Every candidate layout of the GPUs, as a trial spec (its QPS the search's to set)."""
    base, n, seqs = config.base, config.gpus, config.max_num_seqs
    specs = []
    if "agg" in config.modes:
        for tp in config.tp_sizes:
            if n % tp:
                continue
            for budget in config.budgets:
                one = base.with_serving(seqs, policy="chunked", max_num_batched_tokens=budget)
                specs.append(
                    one.with_deployment(costs=dataclasses.replace(base.costs, tp=tp), replicas=n // tp)
                )
    if "disagg" in config.modes:
        decode = base.with_serving(seqs, policy="chunked")
        for tp_p in config.tp_sizes:
            for tp_d in config.tp_sizes:
                for x in range(1, n // tp_p + 1):
                    rest = n - x * tp_p
                    if rest < tp_d or rest % tp_d:
                        continue
                    for budget in config.prefill_budgets:
                        pools = PoolShape(x, rest // tp_d, tp_p, tp_d)
                        specs.append(
                            decode.with_deployment(
                                costs=dataclasses.replace(base.costs, tp=tp_p),
                                replicas=1,
                                disaggregate=Disaggregation(pools, config.kv_link, budget),
                            )
                        )
    return specs


def _start_qps(spec: TrialSpec) -> float:
    """Where a layout's search starts: one replica's rough capacity times its replicas (for pools,
    the prefill replicas at their budget)."""
    d, pools = spec.deployment, spec.pools
    if d.disaggregate is None or pools is None:
        return estimate_qps(spec.at_replicas(1)) * d.replicas
    budget = d.disaggregate.prefill_token_budget or spec.token_budget
    one = spec.with_deployment(disaggregate=None).with_serving(budget, max_num_batched_tokens=budget)
    return estimate_qps(one) * pools.num_prefill


def mode_searches(config: ModeTuneConfig) -> list[Job]:
    """One capacity search per layout, each checked before anything runs."""
    jobs = []
    for spec in layouts(config):
        check_spec(spec.at_replicas(1) if spec.pools is None else spec)
        jobs.append(Job(spec, capacity_search(_start_qps(spec), config.precision)))
    return jobs


def tune_modes(
    config: ModeTuneConfig, pool: TrialPool, *, progress: bool = False
) -> tuple[dict[str, Any], bool]:
    """Run the searches; the result as JSON and whether a Ctrl-C cut it short (then it ranks the
    searches that finished, ``partial: true``)."""
    return searched(
        lambda: mode_searches(config),
        pool,
        config.slos,
        lambda jobs, trials: _to_json(config, jobs, trials),
        progress=progress,
        desc="tune modes",
    )


def layout_name(spec: TrialSpec) -> str:
    """``4 x tp2`` (aggregated) or ``1P3D tp2/tp1`` (prefill / decode TP)."""
    pools = spec.pools
    if pools is None:
        return f"{spec.deployment.replicas} x tp{spec.costs.tp}"
    return f"{pools} tp{pools.tp_prefill}/tp{pools.tp_decode}"


def _to_json(config: ModeTuneConfig, jobs: list[Job], trials: list[TrialRecord]) -> dict[str, Any]:
    slos = config.slos
    rows: list[tuple[float, int, dict[str, Any]]] = []  # (QPS a GPU, job, row)
    for j, job in enumerate(jobs):
        search = job.probe
        assert isinstance(search, CapacitySearch)
        spec = job.base
        disagg = spec.deployment.disaggregate
        own = [t for t in trials if t.job == j]
        capacity = search.capacity_qps if search.is_done else None
        at = [t for t in own if t.passed and t.spec.qps == capacity]
        above = sorted(
            (t for t in own if not t.passed and (capacity is None or t.spec.qps > capacity)),
            key=lambda t: t.spec.qps,
        )
        per_gpu = capacity / spec.num_gpus if capacity else 0.0
        rows.append(
            (
                per_gpu,
                j,
                {
                    "mode": "agg" if disagg is None else "disagg",
                    "layout": layout_name(spec),
                    "token_budget": spec.token_budget if disagg is None else disagg.prefill_token_budget,
                    "decode_token_budget": None if disagg is None else spec.token_budget,
                    "gpus": spec.num_gpus,
                    "capacity_qps": capacity,
                    "qps_per_gpu": None if capacity is None else per_gpu,
                    "finished": search.is_done,
                    "binds": list(slos.violations(above[0].metrics)) if above else [],
                    "at_capacity": {k: at[0].metrics.get(k) for k in AT_CAPACITY} if at else None,
                },
            )
        )
    ranked = sorted((r for r in rows if r[0] > 0), key=lambda r: -r[0])  # stable: ties keep the order tried
    best = ranked[0] if ranked else None
    base = config.base
    out: dict[str, Any] = {
        "mode": "modes",
        "modes": list(config.modes),
        "model": str(base.costs.model),
        "hardware": base.costs.hardware,
        "gpus": config.gpus,
        "tp_sizes": list(config.tp_sizes),
        "kv_link": config.kv_link,
        "router": base.deployment.router,
        "cost_model": base.columns()["cost_model"],
        "ridge_tokens": config.ridge_tokens,
        "workload": {
            "lengths": base.lengths,
            "arrival": base.arrival,
            "burstiness": base.burstiness,
            "num_requests": base.num_requests,
            "seed": base.seed,
        },
        "slos": slos.as_dict(),
        "layouts": [row for _, _, row in ranked] + [row for per_gpu, _, row in rows if not per_gpu],
        "best": None,
        "trials": [t.to_json() for t in trials],
    }
    if best is not None:
        _, j, row = best
        others = [other for _, _, other in ranked if other["mode"] != row["mode"]]
        out["best"] = {
            **row,
            "runner_up": others[0] if others else None,
            "commands": mode_commands(jobs[j].base),
            "deployment": jobs[j].base.deployment.to_dict(),
        }
    return out


def mode_commands(spec: TrialSpec) -> dict[str, Any]:
    """Launch lines of a layout: aggregated, one server per replica behind the router; disaggregated,
    vLLM with its NIXL KV connector on every server behind ``vllm-router --vllm-pd-disaggregation``,
    SGLang with ``--disaggregation-mode prefill|decode`` behind ``sglang_router --pd-disaggregation``
    (hosts P_i / D_i, port 8001; the router on 8000)."""
    costs, serving, d = spec.costs, spec.serving, spec.deployment
    fp8 = costs.dtype_bytes == 1

    def one(tp: int, budget: int) -> dict[str, str]:
        return serve_commands(
            str(costs.model),
            tp,
            budget,
            serving.num_seqs_limit,
            serving.enable_prefix_caching,
            fp8=fp8,
            expert_parallel=costs.expert_parallel,
        )

    pools = spec.pools
    if d.disaggregate is None or pools is None:
        lines = one(costs.tp, spec.token_budget)
        urls = " ".join(f"http://HOST_{i}:8001" for i in range(d.replicas))
        return {
            "vllm": {
                "replica": lines["vllm"] + " --port 8001",
                "router": f"vllm-router --port 8000 --worker-urls {urls} --policy {VLLM_ROUTER_POLICY[d.router] or 'round_robin'}",
            },
            "sglang": {
                "replica": lines["sglang"] + " --host 0.0.0.0 --port 8001",
                "router": f"python -m sglang_router.launch_router --port 8000 --worker-urls {urls} "
                f"--policy {SGLANG_ROUTER_POLICY[d.router] or 'round_robin'}",
            },
        }
    prefill = one(pools.tp_prefill, d.disaggregate.prefill_token_budget or spec.token_budget)
    decode = one(pools.tp_decode, spec.token_budget)
    connector = """ --kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'"""
    p_urls = " ".join(f"--prefill http://P_{i}:8001" for i in range(pools.num_prefill))
    d_urls = " ".join(f"--decode http://D_{i}:8001" for i in range(pools.num_decode))
    vllm_policy = VLLM_ROUTER_POLICY[d.router] or "round_robin"
    sglang_policy = SGLANG_ROUTER_POLICY[d.router] or "round_robin"
    return {
        "vllm": {
            "prefill": prefill["vllm"] + connector + " --port 8001",
            "decode": decode["vllm"] + connector + " --port 8001",
            "router": f"vllm-router --port 8000 --vllm-pd-disaggregation {p_urls} {d_urls} --policy {vllm_policy}",
        },
        "sglang": {
            "prefill": prefill["sglang"] + " --disaggregation-mode prefill --host 0.0.0.0 --port 8001",
            "decode": decode["sglang"] + " --disaggregation-mode decode --host 0.0.0.0 --port 8001",
            "router": f"python -m sglang_router.launch_router --port 8000 --pd-disaggregation {p_urls} {d_urls} "
            f"--policy {sglang_policy}",
        },
    }
