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

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, NamedTuple

from stallfree.costs.kv_transfer import DEFAULT_HOST_LINK, DEFAULT_SHARED_LINK
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
class FleetPrices:
    """Dollars an hour: a GPU, a GB of host memory for the host tier, a GB of the shared store."""

    gpu_hour: float = 0.0
    host_gb_hour: float = 0.0
    store_gb_hour: float = 0.0

    def __post_init__(self) -> None:
        if min(self.gpu_hour, self.host_gb_hour, self.store_gb_hour) < 0:
            raise ValueError("prices must be >= 0")

    def per_hour(self, replicas: int, tp: int, host_gb: float, shared_gb: float) -> float:
        """What a fleet of ``replicas`` costs an hour, its tiers included."""
        return replicas * (tp * self.gpu_hour + host_gb * self.host_gb_hour) + shared_gb * self.store_gb_hour


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
    kv_host_link: str = DEFAULT_HOST_LINK
    kv_shared_gbs: tuple[float, ...] = (0.0,)  # a store of each size the fleet shares (0: none)
    kv_shared_link: str = DEFAULT_SHARED_LINK
    prices: FleetPrices | None = None  # given: the cheapest fleet wins, not the fewest replicas

    def __post_init__(self) -> None:
        for sizes, what in ((self.kv_host_gbs, "host tier"), (self.kv_shared_gbs, "shared store")):
            if not sizes or len(set(sizes)) != len(sizes):
                raise ValueError(f"give one or more distinct {what} sizes (0: none)")
        for host_gb in self.kv_host_gbs:
            for shared_gb in self.kv_shared_gbs:
                self.tiers(host_gb, shared_gb)  # each size and the links parse
        if not self.routers or len(set(self.routers)) != len(self.routers):
            raise ValueError("give one or more distinct routers")
        if not self.budgets or len(set(self.budgets)) != len(self.budgets):
            raise ValueError("give one or more distinct token budgets")
        if self.max_replicas < 1:
            raise ValueError(f"max_replicas must be positive, got {self.max_replicas}")

    def tiers(self, host_gb: float, shared_gb: float = 0.0) -> KvTierConfig | None:
        """The KV tiers with a host tier of ``host_gb`` GB a replica and a shared store of
        ``shared_gb`` GB (None for neither)."""
        if not host_gb and not shared_gb:
            return None
        if not self.base.serving.enable_prefix_caching:
            raise ValueError("a KV tier holds prefix-cached blocks: keep prefix caching on")
        return KvTierConfig(
            host_gb=host_gb or None,
            host_link=self.kv_host_link,
            shared_gb=shared_gb or None,
            shared_link=self.kv_shared_link,
        )


def fleet_searches(config: FleetTuneConfig) -> list[Job]:
    """One replica search per (router, budget, host tier size, shared store size), checked before
    anything runs; each starts at the replicas the roofline's rough capacity of one suggests."""
    jobs = []
    for budget in config.budgets:
        one = config.base.with_serving(config.max_num_seqs, policy="chunked", max_num_batched_tokens=budget)
        check_spec(one)
        start = min(config.max_replicas, max(1, math.ceil(config.base.qps / estimate_qps(one))))
        for router in config.routers:
            for host_gb in config.kv_host_gbs:
                for shared_gb in config.kv_shared_gbs:
                    tiers = config.tiers(host_gb, shared_gb)
                    spec = one.with_deployment(router=router, replicas=start, kv_tiers=tiers)
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


class _Winner(NamedTuple):
    """A search's fewest replicas that met the SLOs; the best ranks lowest (:meth:`rank`)."""

    usd_per_hour: float  # 0 without prices
    replicas: int
    host_gb: float
    shared_gb: float
    worst_ratio: float
    router: str
    trial: TrialRecord

    def rank(self) -> tuple[float, int, float, float, float]:
        """Cheapest, then fewest replicas, the least host memory, the smallest store, the most room."""
        return self.usd_per_hour, self.replicas, self.host_gb, self.shared_gb, self.worst_ratio


def _to_json(config: FleetTuneConfig, jobs: list[Job], trials: list[TrialRecord]) -> dict[str, Any]:
    base, slos = config.base, config.slos
    passing = {(t.job, t.spec.deployment.replicas): t for t in trials if t.passed}
    routers: dict[str, Any] = {r: {"curve": []} for r in config.routers}
    winners: list[_Winner] = []
    for j, job in enumerate(jobs):
        search = job.probe
        assert isinstance(search, ReplicaSearch)
        fewest = search.fewest if search.is_done else None
        gbs = _tier_gbs(job.base)
        entry = {
            "token_budget": job.base.token_budget,
            **gbs,
            "max_num_seqs": job.base.serving.num_seqs_limit,
            "replicas": fewest,
            "finished": search.is_done,
            "num_trials": search.num_trials,
        }
        routers[job.base.deployment.router]["curve"].append(entry)
        if fewest is not None:
            trial = passing[(j, fewest)]
            host_gb, shared_gb = gbs["kv_host_gb"], gbs["kv_shared_gb"]
            usd_per_hour = 0.0
            if config.prices is not None:
                usd_per_hour = entry["usd_per_hour"] = config.prices.per_hour(
                    fewest, base.costs.tp, host_gb, shared_gb
                )
            winners.append(
                _Winner(
                    usd_per_hour,
                    fewest,
                    host_gb,
                    shared_gb,
                    slos.worst_ratio(trial.metrics),
                    job.base.deployment.router,
                    trial,
                )
            )
    for router, entry in routers.items():
        own = [w for w in winners if w.router == router]
        entry["best"] = _best_json(min(own, key=_Winner.rank), base.costs.tp) if own else None
        tried = [t for t in trials if t.spec.deployment.router == router]
        if not own and tried:  # what came nearest, and which SLO no fleet size met
            entry["closest"] = min(tried, key=lambda t: slos.worst_ratio(t.metrics)).to_json()
    best = min(winners, key=_Winner.rank) if winners else None
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
        "prices": None if config.prices is None else dataclasses.asdict(config.prices),
        "routers": routers,
        "best": None,
        "trials": [t.to_json() for t in trials],
    }
    if best is not None:
        out["best"] = {
            **_best_json(best, base.costs.tp),
            "commands": fleet_commands(best.trial.spec),
        }
    return out


def _tier_gbs(spec: TrialSpec) -> dict[str, float]:
    """The host tier's GB a replica and the shared store's (0: none)."""
    tiers = spec.deployment.kv_tiers
    return {
        "kv_host_gb": 0.0 if tiers is None or tiers.host_gb is None else tiers.host_gb,
        "kv_shared_gb": 0.0 if tiers is None or tiers.shared_gb is None else tiers.shared_gb,
    }


def _best_json(winner: _Winner, tp: int) -> dict[str, Any]:
    trial = winner.trial
    m = trial.metrics
    return {
        **({"usd_per_hour": winner.usd_per_hour} if winner.usd_per_hour else {}),
        "router": winner.router,
        "token_budget": trial.spec.token_budget,
        "kv_host_gb": winner.host_gb,
        "kv_shared_gb": winner.shared_gb,
        "max_num_seqs": trial.spec.serving.num_seqs_limit,
        "replicas": winner.replicas,
        "gpus": winner.replicas * tp,
        "worst_slo_ratio": winner.worst_ratio,
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
    with that flag; without it the router finds no tokens and routes on load alone. A host tier is
    vLLM's CPU offloading (SGLang's HiCache); a shared store LMCache's remote backend at STORE (a
    Mooncake store behind SGLang's HiCache)."""
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
    gbs = _tier_gbs(spec)
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
        if host_gb := gbs["kv_host_gb"]:  # vLLM's native CPU offloading; SGLang's HiCache
            extra["vllm"] += f" --kv-offloading-size {host_gb * 1e9 / 2**30:.4g}"  # GiB, all TP ranks
            extra["sglang"] += f" --enable-hierarchical-cache --hicache-size {host_gb:g}"
        env = ""
        if gbs["kv_shared_gb"]:  # LMCache with a remote store under vLLM; HiCache's Mooncake store
            env = "LMCACHE_REMOTE_URL=lm://STORE:65432 " if name == "vllm" else ""
            extra["vllm"] += (
                """ --kv-transfer-config '{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}'"""
            )
            extra["sglang"] += (" --enable-hierarchical-cache" if not host_gb else "") + (
                " --hicache-storage-backend mooncake"
            )
        out[name] = {
            "replica": env + one[name] + extra[name] + " --port 8001",
            "router": f"{router} --port 8000 --worker-urls {urls} --policy {policy}"
            if policy is not None
            else f"{router} has no {spec.deployment.router} policy: choose another router",
        }
    return out
