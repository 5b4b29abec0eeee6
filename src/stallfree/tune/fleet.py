"""``stallfree tune --qps Q --router R1,R2``: the fewest replicas meeting the SLOs at a traffic rate.

For each (router, token budget) a :class:`~stallfree.tune.search.ReplicaSearch` sizes the fleet:
seeded simulations of N replicas (each the deployment ``base`` describes, chunked at the budget)
behind the router at ``base.qps``, N doubled until the SLOs hold, then bisected. The answer is the
(router, budget) with the fewest replicas (the fewest GPUs: replicas x TP), ties going to the
trial with the most headroom under its SLOs, and the launch lines of that fleet: one vLLM or SGLang
server per replica behind ``vllm-router`` or ``sglang-router`` with the matching policy.
Invariant: as :func:`~stallfree.tune.capacity.tune`, the same config gives the same result on
every pool.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from stallfree.sim.kv_tiers import KvTierConfig
from stallfree.tune.capacity import serve_commands
from stallfree.tune.jobs import Job, TrialRecord, searched
from stallfree.tune.pools import TrialPool
from stallfree.tune.search import ReplicaSearch
from stallfree.tune.slo import Slos
from stallfree.tune.trial import TrialSpec, check_spec, estimate_qps

# vllm-router 0.1.17's and sglang-router 0.3.2's --policy for each router (None: it has none).
VLLM_ROUTER_POLICY = {
    "round-robin": "round_robin",
    "power-of-two": "power_of_two",
    "consistent-hash": "consistent_hash",
    "cache-aware": "cache_aware",
    "least-requests": None,
}
SGLANG_ROUTER_POLICY = {
    "round-robin": "round_robin",
    "power-of-two": "power_of_two",
    "consistent-hash": None,
    "cache-aware": "cache_aware",
    "least-requests": None,
}


@dataclass(frozen=True, slots=True)
class FleetTuneConfig:
    """``base``: one replica's deployment and the workload at the fleet's rate (``base.qps``)."""

    base: TrialSpec
    routers: tuple[str, ...]
    budgets: tuple[int, ...]
    slos: Slos
    max_num_seqs: int = 256
    max_replicas: int = 256
    kv_host_gbs: tuple[float, ...] = (0.0,)  # a host KV tier of each size a replica (0: none)
    kv_host_link: str = "pcie5"

    def __post_init__(self) -> None:
        if not self.kv_host_gbs or len(set(self.kv_host_gbs)) != len(self.kv_host_gbs):
            raise ValueError("give one or more distinct host tier sizes (0: none)")
        for gb in self.kv_host_gbs:
            self.tiers(gb)  # each size and the link parse
        if not self.routers or len(set(self.routers)) != len(self.routers):
            raise ValueError("give one or more distinct routers")
        if not self.budgets or len(set(self.budgets)) != len(self.budgets):
            raise ValueError("give one or more distinct token budgets")
        if self.max_replicas < 1:
            raise ValueError(f"max_replicas must be positive, got {self.max_replicas}")

    def tiers(self, host_gb: float) -> KvTierConfig | None:
        """A replica's KV tiers with a host tier of ``host_gb`` GB (None for 0)."""
        if not host_gb:
            return None
        if not self.base.serving.enable_prefix_caching:
            raise ValueError("a host KV tier holds prefix-cached blocks: keep prefix caching on")
        return KvTierConfig(host_gb=host_gb, host_link=self.kv_host_link)


def fleet_searches(config: FleetTuneConfig) -> list[Job]:
    """One replica search per (router, budget, host tier size), checked before anything runs; each
    starts at the replicas the roofline's rough capacity of one suggests."""
    jobs = []
    for budget in config.budgets:
        one = config.base.with_serving(config.max_num_seqs, policy="chunked", max_num_batched_tokens=budget)
        check_spec(one)
        start = min(config.max_replicas, max(1, math.ceil(config.base.qps / estimate_qps(one))))
        for router in config.routers:
            for host_gb in config.kv_host_gbs:
                spec = one.with_deployment(router=router, replicas=start, kv_tiers=config.tiers(host_gb))
                jobs.append(Job(spec, ReplicaSearch(start, config.max_replicas), axis="replicas"))
    return jobs


def tune_fleet(
    config: FleetTuneConfig, pool: TrialPool, *, progress: bool = False
) -> tuple[dict[str, Any], bool]:
    """Run the searches; the result as JSON and whether a Ctrl-C cut it short (then it holds the
    searches that finished, ``partial: true``)."""
    return searched(
        lambda: fleet_searches(config),
        pool,
        config.slos,
        lambda jobs, trials: _to_json(config, jobs, trials),
        progress=progress,
        desc="tune fleet",
    )


def _to_json(config: FleetTuneConfig, jobs: list[Job], trials: list[TrialRecord]) -> dict[str, Any]:
    base, slos = config.base, config.slos
    passing = {(t.job, t.spec.deployment.replicas): t for t in trials if t.passed}
    routers: dict[str, Any] = {r: {"curve": []} for r in config.routers}
    winners = []
    for j, job in enumerate(jobs):
        search = job.probe
        assert isinstance(search, ReplicaSearch)
        fewest = search.fewest if search.is_done else None
        entry = {
            "token_budget": job.base.token_budget,
            "kv_host_gb": _host_gb(job.base),
            "max_num_seqs": job.base.serving.num_seqs_limit,
            "replicas": fewest,
            "finished": search.is_done,
            "num_trials": search.num_trials,
        }
        routers[job.base.deployment.router]["curve"].append(entry)
        if fewest is not None:
            trial = passing[(j, fewest)]
            winners.append(
                (
                    fewest,
                    _host_gb(job.base),
                    slos.worst_ratio(trial.metrics),
                    job.base.deployment.router,
                    trial,
                )
            )
    for router, entry in routers.items():
        own = [w for w in winners if w[3] == router]
        entry["best"] = _best_json(min(own, key=lambda w: w[:3]), base.costs.tp) if own else None
        tried = [t for t in trials if t.spec.deployment.router == router]
        if not own and tried:  # what came nearest, and which SLO no fleet size met
            entry["closest"] = min(tried, key=lambda t: slos.worst_ratio(t.metrics)).to_json()
    best = min(winners, key=lambda w: w[:3]) if winners else None
    out: dict[str, Any] = {
        "mode": "fleet",
        "model": str(base.costs.model),
        "hardware": base.costs.hardware,
        "tp": base.costs.tp,
        "expert_parallel": base.costs.expert_parallel,
        "cost_model": base.columns()["cost_model"],
        "qps": base.qps,
        "route_delay_ms": base.deployment.route_delay_ms,
        "max_replicas": config.max_replicas,
        "workload": {
            "lengths": base.lengths,
            "arrival": base.arrival,
            "burstiness": base.burstiness,
            "num_requests": base.num_requests,
            "seed": base.seed,
        },
        "prefix_caching": base.serving.enable_prefix_caching,
        "slos": slos.as_dict(),
        "routers": routers,
        "best": None,
        "trials": [t.to_json() for t in trials],
    }
    if best is not None:
        out["best"] = {
            **_best_json(best, base.costs.tp),
            "commands": fleet_commands(best[4].spec),
        }
    return out


def _host_gb(spec: TrialSpec) -> float:
    tiers = spec.deployment.kv_tiers
    return 0.0 if tiers is None or tiers.host_gb is None else tiers.host_gb


def _best_json(winner: tuple[int, float, float, str, TrialRecord], tp: int) -> dict[str, Any]:
    replicas, host_gb, ratio, router, trial = winner
    m = trial.metrics
    return {
        "router": router,
        "token_budget": trial.spec.token_budget,
        "kv_host_gb": host_gb,
        "max_num_seqs": trial.spec.serving.num_seqs_limit,
        "replicas": replicas,
        "gpus": replicas * tp,
        "worst_slo_ratio": ratio,
        "metrics": {
            key: m.get(key)
            for key in (
                "p99_ttft_ms",
                "p99_tpot_ms",
                "p99_itl_ms",
                "prefix_cache_hit_rate",
                "kv_host_hit_rate",
                "load_imbalance",
                "request_throughput",
            )
        },
        "deployment": trial.spec.deployment.to_dict(),
    }


def fleet_commands(spec: TrialSpec) -> dict[str, Any]:
    """Launch lines of ``spec``'s fleet, for vLLM + vllm-router and SGLang + sglang-router: the
    server to start on each of the replicas' hosts (HOST_0 .. HOST_N-1, port 8001), then the
    router in front of them (port 8000); a router without that policy says so instead. Behind
    vllm-router's cache_aware, vLLM gets ``--enable-scale-out``: the router matches prefixes on
    the token ids each worker renders for it (``/v1/completions/render``), a route vLLM serves only
    with that flag; without it the router finds no tokens and routes on load alone."""
    costs, serving = spec.costs, spec.serving
    assert serving.max_num_batched_tokens is not None
    one = serve_commands(
        str(costs.model),
        costs.tp,
        serving.max_num_batched_tokens,
        serving.num_seqs_limit,
        serving.enable_prefix_caching,
        fp8=costs.dtype_bytes == 1,
        expert_parallel=costs.expert_parallel,
    )
    urls = " ".join(f"http://HOST_{i}:8001" for i in range(spec.deployment.replicas))
    out: dict[str, Any] = {}
    for name, policies, router in (
        ("vllm", VLLM_ROUTER_POLICY, "vllm-router"),
        ("sglang", SGLANG_ROUTER_POLICY, "python -m sglang_router.launch_router"),
    ):
        policy = policies[spec.deployment.router]
        extra = {
            "vllm": " --enable-scale-out" if policy == "cache_aware" else "",
            "sglang": " --host 0.0.0.0",
        }
        if host_gb := _host_gb(spec):  # vLLM's native CPU offloading; SGLang's HiCache
            extra["vllm"] += f" --kv-offloading-size {host_gb * 1e9 / 2**30:.4g}"  # GiB, all TP ranks
            extra["sglang"] += f" --enable-hierarchical-cache --hicache-size {host_gb:g}"
        out[name] = {
            "replica": one[name] + extra[name] + " --port 8001",
            "router": f"{router} --port 8000 --worker-urls {urls} --policy {policy}"
            if policy is not None
            else f"{router} has no {spec.deployment.router} policy: choose another router",
        }
    return out
