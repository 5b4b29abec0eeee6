"""The Python API of ``stallfree simulate``: a workload and a
:class:`~stallfree.sim.deployment.Deployment` in, a :class:`SimulationResult` out.

:func:`simulate` prices each replica's steps as :func:`~stallfree.costs.choice.pick_cost_model`
says, sizes its KV cache, builds its scheduler and runs the workload through one replica
(:func:`~stallfree.sim.traffic.run_traffic`), a fleet behind a router
(:func:`~stallfree.sim.fleet.run_fleet`) or prefill and decode pools
(:func:`~stallfree.sim.disagg.run_disaggregated`).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

import numpy as np

from stallfree.core import ChunkedPolicy, Request, Scheduler
from stallfree.core.config import ShedRule
from stallfree.core.kv_tiers import KvTiers
from stallfree.core.router import Router, make_router
from stallfree.core.serving import ServingConfig
from stallfree.costs.choice import CostPick, pick_once
from stallfree.costs.kv_transfer import kv_link, kv_transfer_bytes, tier_link
from stallfree.costs.measured import VariedSteps
from stallfree.costs.memory import KvMemory, fixed_kv_memory, kv_memory
from stallfree.costs.protocol import SteadyCostModel
from stallfree.metrics import ItlAccumulator, RequestRecord, summarize
from stallfree.sim.autoscaled import num_slots, run_autoscaled
from stallfree.sim.deployment import Deployment
from stallfree.sim.disagg import Disaggregation, disaggregated_summary, run_disaggregated
from stallfree.sim.fleet import run_fleet
from stallfree.sim.kv_tiers import KvTierConfig, TierLoads, tier_summary
from stallfree.sim.speculative import DraftStats, DraftVerifier, draft_pricer
from stallfree.sim.traffic import StepTrace, TrafficReplica, TrafficRun, run_traffic
from stallfree.workload import Workload, WorkloadArrays, sample
from stallfree.workload.agents import AgentTurns, TurnQueue
from stallfree.workload.classes import TrafficClasses, class_summaries, classes_of

DEFAULT_DEPLOYMENT = Deployment()


@dataclass(frozen=True, slots=True)
class SimulationResult:
    """One policy's run (:func:`simulate`'s).

    The summary holds :func:`stallfree.metrics.summarize`'s keys plus ``policy``, ``num_steps``,
    ``max_step_ms``, ``num_kv_blocks``, ``kv_block_size``, ``rejected_reasons`` (reason -> count),
    the prefix cache's ``enable_prefix_caching``, ``prefix_cache_queried_tokens``,
    ``prefix_cache_hit_tokens`` and ``prefix_cache_hit_rate``, and, with
    ``serving.step_budget_ms``, what missed the step-time target (``step_budget_ms``,
    ``num_steps_over_budget``, ``num_guarded_steps``, ``num_decode_overruns``).

    A run that ``stop`` ended (a Ctrl-C's flag, say, asked between steps) is ``partial``: the
    records of the requests finished by then, the summary of those over the simulated time so far,
    with ITL samples of every gap simulated so far (requests still in flight included) and the
    steps run.

    Several replicas (or a route delay): the summary is the fleet's, plus ``num_replicas``,
    ``router``, ``route_delay_ms``, ``load_imbalance`` (the busiest replica's busy time over the
    mean) and ``replicas`` (each one's summary); ``steps`` is None; ``num_kv_blocks`` is the
    fleet's total. One replica is the run above, unchanged.

    Drafts (speculative decoding): the summary adds vLLM's spec-decode counters and rates
    (:meth:`~stallfree.sim.speculative.DraftStats.summary`).

    Traffic classes (:class:`~stallfree.workload.classes.TrafficClasses`, on any deployment):
    ``summary["classes"]`` scores each class as the run is scored (its goodput by its own SLOs),
    and ``class_itl`` holds each class's ITL samples.

    KV tiers (``deployment.kv_tiers``, one replica or a fleet): the prefix cache's keys count the
    blocks loaded from the tiers with the GPU's, and the summary adds ``kv_tiers`` (the hits by
    source, each tier's capacity, link, tokens and bytes loaded, blocks written and evicted; the
    loads' waits: :func:`~stallfree.sim.kv_tiers.tier_summary`), ``kv_gpu_hit_rate``,
    ``kv_host_hit_rate``, ``kv_shared_hit_rate`` and ``mean_kv_load_wait_ms``.

    Disaggregated: the summary is the client's, plus ``disaggregation`` (the pools and the KV's
    trips: :func:`~stallfree.sim.disagg.disaggregated_summary`).
    """

    policy: str
    summary: dict[str, Any]
    records: list[RequestRecord]
    itl: ItlAccumulator
    kv: KvMemory
    steps: StepTrace | None
    partial: bool = False
    class_itl: Mapping[str, ItlAccumulator] = dataclasses.field(default_factory=dict)  # by traffic class
    traffic_classes: Mapping[str, str] = dataclasses.field(default_factory=dict)  # request id -> its class


def simulate(
    workload: Workload | WorkloadArrays | AgentTurns | TrafficClasses | Iterable[Request],
    deployment: Deployment = DEFAULT_DEPLOYMENT,
    *,
    num_requests: int | None = None,
    seed: int = 0,
    goodput: Mapping[str, float] | None = None,
    keep_steps: bool = False,
    fast: bool = True,
    step_noise: bool = False,
    step_scales: tuple[float, float] | None = None,
    stop: Callable[[], bool] | None = None,
) -> SimulationResult:
    """Simulate ``workload`` served by ``deployment`` (:class:`~stallfree.sim.deployment.Deployment`;
    default: one chunked replica at :data:`~stallfree.core.DEFAULT_TOKEN_BUDGET` tokens a step,
    priced by the full roofline of llama-3-8b on an a100-80gb).

    ``workload``: a :class:`~stallfree.workload.Workload` (sampled with ``num_requests`` and
    ``seed``), sampled :class:`~stallfree.workload.WorkloadArrays`, requests ordered by arrival, or
    :class:`~stallfree.workload.agents.AgentTurns` (turns that arrive once the turns they wait for
    have finished; one replica or a fleet).
    A replica's ``max_model_len`` defaults to the model's context and its ``num_blocks`` to what
    fits in ``gpu_memory_utilization`` of the hardware's memory; with a profile (an engine's, not
    the hardware's) to what the engine allocates where memory allows, ``max_num_seqs`` full
    contexts. ``goodput`` maps ``ttft`` / ``tpot`` / ``e2el`` to SLOs in ms. ``fast=False``
    schedules every step (the reference the fast path equals). ``step_noise`` and ``step_scales``
    (a profile's model only) vary the steps' times: :class:`~stallfree.costs.measured.VariedSteps`.

    The summary's keys, and what a fleet, drafts, classes, KV tiers and pools add to them:
    :class:`SimulationResult`.
    """
    if isinstance(workload, TrafficClasses):
        how = {"keep_steps": keep_steps, "fast": fast, "step_noise": step_noise, "step_scales": step_scales}
        return _simulate_classes(workload, deployment, num_requests, seed, goodput, {**how, "stop": stop})
    requests: Iterable[Request] = ()
    queue: TurnQueue | None = None  # agent turns: released as the turns they wait for finish
    if not isinstance(workload, AgentTurns):
        requests = _requests(workload, num_requests, seed)
    elif deployment.disaggregate is not None or deployment.autoscale is not None:
        raise ValueError(
            "agent turns run on one replica or a fleet: not with disaggregation or an autoscaler"
        )
    else:
        queue = workload.queue()
    on_finished = None if queue is None else queue.finished
    if deployment.disaggregate is not None:
        return _simulate_disaggregated(
            deployment, deployment.disaggregate, requests, seed, goodput, fast, stop
        )
    serving, picks = deployment.serving, _picks(deployment)
    kvs = {id(p): replica_kv_memory(p, serving, deployment.gpu_memory_utilization) for p in picks}
    if deployment.autoscale is not None:
        return _simulate_autoscaled(
            deployment, picks[0], kvs[id(picks[0])], requests, goodput, seed, fast, stop
        )
    verifiers = [_verifier(deployment, p, seed + i) for i, p in enumerate(picks)]
    drafts = None if deployment.speculation is None else [v for v in verifiers if v is not None]
    if len(picks) > 1 or deployment.route_delay_ms:
        router = make_router(deployment.router, len(picks), seed)
        return _simulate_fleet(
            [(p, kvs[id(p)]) for p in picks],
            serving,
            (router, deployment.route_delay_ms / 1000),
            queue or requests,
            goodput,
            (fast, step_noise, step_scales, seed),
            stop,
            drafts,
            on_finished,
            deployment.kv_tiers,
            deployment.shed,
        )
    one = (fast, keep_steps, step_noise, step_scales, seed)
    return _simulate_one(
        deployment, picks[0], kvs[id(picks[0])], queue or requests, goodput, one, stop, drafts
    )


def _simulate_one(
    deployment: Deployment,
    pick: CostPick,
    kv: KvMemory,
    requests: Iterable[Request] | TurnQueue,
    goodput: Mapping[str, float] | None,
    how: tuple[bool, bool, bool, tuple[float, float] | None, int],
    stop: Callable[[], bool] | None,
    drafts: list[DraftVerifier] | None,
) -> SimulationResult:
    """One replica's run; ``how`` = (fast, keep_steps, step_noise, step_scales, seed)."""
    (fast, keep_steps, step_noise, step_scales, seed), serving = how, deployment.serving
    # The cost model is the step-time predictor of a time-budgeted policy (unused otherwise).
    scheduler = serving.make_scheduler(
        pick.model.max_position_embeddings, kv.num_blocks, predictor=pick.pricer.step_time_s
    )
    tiers = _tier_loads(deployment.kv_tiers, serving, [pick], [scheduler])
    run = run_traffic(
        scheduler,
        _varied(pick, step_noise, step_scales, seed),
        requests,
        fast=fast,
        keep_steps=keep_steps,
        step_budget_s=serving.step_budget_s,
        stop=stop,
        drafts=drafts[0] if drafts else None,
        on_finished=requests.finished if isinstance(requests, TurnQueue) else None,
        tiers=tiers[0] if tiers else None,
        shed=deployment.shed,
    )
    if not run.records and not run.stopped:
        raise ValueError("no request could run: the workload is empty")
    summary = _summary(run, serving, [scheduler], kv, goodput)
    if tiers:
        summary.update(
            tier_summary(tiers, summary["prefix_cache_queried_tokens"], summary["prefix_cache_hit_tokens"])
        )
    return SimulationResult(
        serving.policy, summary, run.records, run.itl, kv, run.steps, run.stopped, run.class_itl
    )


def _simulate_classes(
    classes: TrafficClasses,
    deployment: Deployment,
    num_requests: int | None,
    seed: int,
    goodput: Mapping[str, float] | None,
    how: dict[str, Any],
) -> SimulationResult:
    """Traffic classes: their requests merged, run as any requests are, and scored per class too
    (``summary["classes"]``: :func:`~stallfree.workload.classes.class_summaries`)."""
    if num_requests is None:
        raise ValueError("traffic classes need a number of requests")
    requests = classes.sample(num_requests, seed)
    result = simulate(requests, deployment, seed=seed, goodput=goodput, **how)
    class_of = classes_of(requests)
    result.summary["classes"] = class_summaries(
        classes.classes, class_of, result.records, result.class_itl, result.summary["duration"]
    )
    return replace(result, traffic_classes=class_of)


def _verifier(deployment: Deployment, pick: CostPick, seed: int) -> DraftVerifier | None:
    """A replica's drafts' verifier (None without speculative decoding)."""
    spec = deployment.speculation
    if spec is None:
        return None
    k = deployment.serving.num_speculative_tokens
    return DraftVerifier(spec.acceptance, k, seed, draft_pricer(spec.draft, pick))


def _picks(deployment: Deployment) -> list[CostPick]:
    """One resolved cost choice per replica (replicas of one choice share its pick)."""
    if not deployment.fleet:
        return [pick_once(deployment.costs)] * deployment.replicas
    picks = []
    for group in deployment.fleet:
        try:
            pick = pick_once(replace(deployment.costs, hardware=group.hardware, tp=group.tp))
        except ValueError as exc:
            raise ValueError(f"fleet {group}: {exc}") from None
        picks += [pick] * group.count
    return picks


def _simulate_fleet(
    replicas: list[tuple[CostPick, KvMemory]],
    serving: ServingConfig,
    fleet: tuple[Router, float],
    requests: Iterable[Request] | TurnQueue,
    goodput: Mapping[str, float] | None,
    how: tuple[bool, bool, tuple[float, float] | None, int],
    stop: Callable[[], bool] | None,
    drafts: list[DraftVerifier] | None,
    on_finished: Callable[[str, float], None] | None = None,
    kv_tiers: KvTierConfig | None = None,
    shed: ShedRule | None = None,
) -> SimulationResult:
    """``replicas``: each one's pricing and KV cache; ``fleet`` = (router, routing delay s); ``how``
    = (fast, step_noise, step_scales, seed); ``kv_tiers``: the tiers below each replica's GPU cache;
    ``shed``: the rule each replica refuses sheddable requests by."""
    (router, delay_s), (fast, step_noise, step_scales, seed) = fleet, how
    schedulers = [
        serving.make_scheduler(p.model.max_position_embeddings, kv.num_blocks, predictor=p.pricer.step_time_s)
        for p, kv in replicas
    ]
    costs = [_varied(p, step_noise, step_scales, seed + i) for i, (p, _) in enumerate(replicas)]
    tiers = _tier_loads(kv_tiers, serving, [p for p, _ in replicas], schedulers)
    run = run_fleet(
        schedulers,
        costs,
        router,
        requests,
        fast=fast,
        step_budget_s=serving.step_budget_s,
        stop=stop,
        route_delay_s=delay_s,
        drafts=drafts,
        on_finished=on_finished,
        tiers=tiers,
        shed=shed,
    )
    if not run.records and not run.stopped:
        raise ValueError("no request could run: the workload is empty")
    each = [
        {
            **_summary(r, serving, [s], kv, goodput),
            "busy_s": round(r.busy_s, 6),  # microseconds: the sum of steps may group differently
            "hardware": p.hardware.name,
            "tp": p.tp,
        }
        for r, s, (p, kv) in zip(run.runs, schedulers, replicas, strict=True)
    ]
    whole = _combined(run.runs, run.records, run.itl, run.duration_s, run.stopped)
    kv = replicas[0][1]
    summary = _summary(whole, serving, schedulers, kv, goodput)
    summary.update(
        num_kv_blocks=sum(kv.num_blocks for _, kv in replicas),
        num_replicas=len(replicas),
        router=router.name,
        route_delay_ms=delay_s * 1000,
        load_imbalance=run.load_imbalance,
        replicas=each,
    )
    if tiers:
        summary.update(
            tier_summary(tiers, summary["prefix_cache_queried_tokens"], summary["prefix_cache_hit_tokens"])
        )
    class_itl = _merged_class_itl(run.runs)
    return SimulationResult(serving.policy, summary, run.records, run.itl, kv, None, run.stopped, class_itl)


def _tier_loads(
    config: KvTierConfig | None,
    serving: ServingConfig,
    picks: Sequence[CostPick],
    schedulers: Sequence[Scheduler],
) -> list[TierLoads] | None:
    """Each replica's KV tiers (its host tier, the one shared store) and their links, sized in
    blocks of the model's KV layout; None without tiers."""
    if config is None:
        return None
    if not serving.enable_prefix_caching:
        raise ValueError("KV tiers keep the prefix cache's blocks: not with prefix caching off")
    size = serving.block_size
    links = (tier_link(config.host_link, host=True), tier_link(config.shared_link, host=False))
    shared = config.make_shared(kv_transfer_bytes(picks[0].model, size, picks[0].dtype_bytes))
    loads = []
    for pick, scheduler in zip(picks, schedulers, strict=True):
        tiers = KvTiers(config.make_host(kv_transfer_bytes(pick.model, size, pick.dtype_bytes)), shared)
        loads.append(TierLoads(scheduler, tiers, links, _kv_price(pick)))
    return loads


def _kv_price(pick: CostPick) -> Callable[[int], tuple[int, float]]:
    """A replica's KV of ``n`` tokens: its bytes, and its seconds on links of 1 byte/s a GPU (its
    ``tp`` GPUs each move their shard)."""
    model, dtype_bytes, tp = pick.model, pick.dtype_bytes, pick.tp

    def price(num_tokens: int) -> tuple[int, float]:
        num_bytes = kv_transfer_bytes(model, num_tokens, dtype_bytes)
        return num_bytes, num_bytes / tp

    return price


def _merged_class_itl(runs: Iterable[TrafficRun]) -> dict[str, ItlAccumulator]:
    merged: dict[str, ItlAccumulator] = {}
    for run in runs:
        for name, acc in run.class_itl.items():
            merged.setdefault(name, ItlAccumulator()).add_many(acc.values_s, acc.counts)
    return merged


def _simulate_autoscaled(
    deployment: Deployment,
    pick: CostPick,
    kv: KvMemory,
    requests: Iterable[Request],
    goodput: Mapping[str, float] | None,
    seed: int,
    fast: bool,
    stop: Callable[[], bool] | None,
) -> SimulationResult:
    """A fleet an autoscaler resizes (:func:`~stallfree.sim.autoscaled.run_autoscaled`); the
    summary is the fleet's, plus ``autoscale``: its settings, the GPU-hours, every scaling
    decision, each replica's lifetime and the fleet's size at every scrape."""
    scale, serving = deployment.autoscale, deployment.serving
    assert scale is not None
    context = pick.model.max_position_embeddings
    made = itertools.count()

    def make_replica() -> TrafficReplica:
        drafts = _verifier(deployment, pick, seed + next(made))
        scheduler = serving.make_scheduler(context, kv.num_blocks, predictor=pick.pricer.step_time_s)
        return TrafficReplica(
            scheduler,
            pick.pricer,
            fast=fast,
            step_budget_s=serving.step_budget_s,
            cuttable=True,
            drafts=drafts,
        )

    router = make_router(deployment.router, num_slots(scale.max_replicas), seed)
    run = run_autoscaled(
        make_replica,
        router,
        scale.make(),
        requests,
        initial=deployment.replicas,
        startup_s=scale.startup_s,
        scrape_s=scale.scrape_s,
        stop=stop,
        route_delay_s=deployment.route_delay_ms / 1000,
    )
    if not run.records and not run.stopped:
        raise ValueError("no request could run: the workload is empty")
    whole = _combined(run.runs, run.records, run.itl, run.duration_s, run.stopped)
    summary = _summary(whole, serving, run.schedulers, kv, goodput)
    replica_s = run.replica_seconds()
    gpu_hours = replica_s * pick.tp / 3600
    summary.update(
        router=deployment.router,
        num_replicas_max=max(
            (starting + ready for _, starting, ready, _ in run.sizes), default=deployment.replicas
        ),
        autoscale={
            **dataclasses.asdict(scale),
            "gpu_hours": gpu_hours,
            "replica_hours": replica_s / 3600,
            "num_replicas_started": len(run.lifetimes),
            "events": [dataclasses.asdict(e) for e in run.events],
            "lifetimes": [dataclasses.asdict(life) for life in run.lifetimes],
            "sizes": [list(size) for size in run.sizes],
        },
    )
    class_itl = _merged_class_itl(run.runs)
    return SimulationResult(serving.policy, summary, run.records, run.itl, kv, None, run.stopped, class_itl)


def _simulate_disaggregated(
    deployment: Deployment,
    plan: Disaggregation,
    requests: Iterable[Request],
    seed: int,
    goodput: Mapping[str, float] | None,
    fast: bool,
    stop: Callable[[], bool] | None,
) -> SimulationResult:
    shape, costs, serving = plan.shape, deployment.costs, deployment.serving
    prefill_serving = plan.prefill_serving(serving)
    pools = []
    for choice, pool_serving, count in (
        (
            replace(costs, tp=shape.tp_prefill, profile=plan.prefill_profile or costs.profile),
            prefill_serving,
            shape.num_prefill,
        ),
        (replace(costs, tp=shape.tp_decode), serving, shape.num_decode),
    ):
        pick = pick_once(choice)
        kv = replica_kv_memory(pick, pool_serving, deployment.gpu_memory_utilization)
        schedulers = [
            pool_serving.make_scheduler(
                pick.model.max_position_embeddings, kv.num_blocks, predictor=pick.pricer.step_time_s
            )
            for _ in range(count)
        ]
        pools.append((pick, kv, schedulers, [pick.pricer] * count))
    (ppick, pkv, pschedulers, pcosts), (_, dkv, dschedulers, dcosts) = pools
    link = kv_link(plan.kv_link, ppick.hardware)
    model, dtype_bytes = ppick.model, ppick.dtype_bytes
    router = deployment.router
    routers = (make_router(router, shape.num_prefill, seed), make_router(router, shape.num_decode, seed + 1))
    run = run_disaggregated(
        shape,
        (pschedulers, pcosts),
        (dschedulers, dcosts),
        routers,
        link,
        lambda n: kv_transfer_bytes(model, n, dtype_bytes),
        requests,
        lambda n: plan.external_tokens(n, serving.block_size),
        fast=fast,
        step_budget_s=serving.step_budget_s,
        stop=stop,
    )
    if not run.records and not run.stopped:
        raise ValueError("no request could run: the workload is empty")
    whole = _combined([*run.prefill, *run.decode], run.records, run.itl, run.duration_s, run.stopped)
    summary = _summary(whole, serving, pschedulers, dkv, goodput)  # the prefix cache: the prefill pool's
    summary.update(
        **_step_budget_summary(serving, [*pschedulers, *dschedulers], whole.num_steps_over_budget),
        policy=f"disagg:{shape}",
        num_kv_blocks=shape.num_prefill * pkv.num_blocks + shape.num_decode * dkv.num_blocks,
        router=router,
        disaggregation=disaggregated_summary(run, plan, link, (prefill_serving, serving), (pkv, dkv)),
    )
    class_itl = _merged_class_itl([*run.prefill, *run.decode])
    return SimulationResult(
        f"disagg:{shape}", summary, run.records, run.itl, dkv, None, run.stopped, class_itl
    )


def _combined(
    runs: Sequence[TrafficRun],
    records: list[RequestRecord],
    itl: ItlAccumulator,
    duration_s: float,
    stopped: bool,
) -> TrafficRun:
    """Several replicas' runs as one (a fleet's, or both pools'): their client records and ITL,
    their counters summed."""
    return TrafficRun(
        records=records,
        itl=itl,
        duration_s=duration_s,
        num_steps=sum(r.num_steps for r in runs),
        num_plans=sum(r.num_plans for r in runs),
        num_preemptions=sum(r.num_preemptions for r in runs),
        rejected_reasons=_merged(r.rejected_reasons for r in runs),
        steps=None,
        max_step_s=max(r.max_step_s for r in runs),
        num_steps_over_budget=sum(r.num_steps_over_budget for r in runs),
        stopped=stopped,
        drafts=_merged_drafts(runs),
    )


def _merged_drafts(runs: Iterable[TrafficRun]) -> DraftStats | None:
    stats = [r.drafts for r in runs if r.drafts is not None]
    if not stats:
        return None
    whole = DraftStats()
    for part in stats:
        whole.merge(part)
    return whole


def _merged(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    return dict(sum((Counter(part) for part in counts), Counter()))


def _summary(
    run: TrafficRun,
    serving: ServingConfig,
    schedulers: Sequence[Scheduler],
    kv: KvMemory,
    goodput: Mapping[str, float] | None,
) -> dict[str, Any]:
    # Every request rejected is a result (nulls and the rejections), whenever they arrived: a
    # lone request or all-at-once arrivals give a zero duration, later arrivals a positive one.
    scores = summarize(run.records, run.itl, run.duration_s, goodput)
    return {
        "policy": serving.policy,
        **scores,
        # exact, where the ITL samples are rounded to 16 significant bits (None without a gap)
        "max_itl_ms": max((r.max_itl_s for r in run.records), default=0.0) * 1000
        if scores["max_itl_ms"] is not None
        else None,
        "num_steps": run.num_steps,
        "max_step_ms": run.max_step_s * 1000,
        **_step_budget_summary(serving, schedulers, run.num_steps_over_budget),
        "num_kv_blocks": kv.num_blocks,
        "kv_block_size": serving.block_size,
        "rejected_reasons": run.rejected_reasons,
        **_prefix_cache_summary(serving, schedulers, run.records),
        **_speculative_summary(serving, run.drafts),
    }


def _speculative_summary(serving: ServingConfig, drafts: DraftStats | None) -> dict[str, Any]:
    """Speculative decoding's settings and counters (nothing without it)."""
    if not serving.num_speculative_tokens or drafts is None:
        return {}
    return {
        "num_speculative_tokens": serving.num_speculative_tokens,
        "speculative_rule": serving.speculative_rule,
        **drafts.summary(),
    }


def replica_kv_memory(pick: CostPick, serving: ServingConfig, gpu_memory_utilization: float) -> KvMemory:
    """A replica's KV cache: ``serving.num_blocks``, a profiled engine's sizing, or what fits the hardware."""
    model, context = pick.model, pick.model.max_position_embeddings
    num_blocks = serving.num_blocks
    if num_blocks is None and pick.measured is not None:
        # A profile is of an engine, not of the hardware: its KV cache as the engine sizes it
        # where memory allows (max_num_seqs full contexts, as LLMEngine caps its cache).
        num_blocks = serving.full_contexts_num_blocks(context)
    if num_blocks is not None:
        return fixed_kv_memory(
            model, num_blocks, tp=pick.tp, block_size=serving.block_size, dtype_bytes=pick.dtype_bytes
        )
    return kv_memory(
        model,
        pick.hardware,
        tp=pick.tp,
        gpu_memory_utilization=gpu_memory_utilization,
        block_size=serving.block_size,
        dtype_bytes=pick.dtype_bytes,
        max_num_batched_tokens=serving.step_token_cap(context),
        max_num_seqs=serving.num_seqs_limit,
    )


def _varied(
    pick: CostPick, step_noise: bool, step_scales: tuple[float, float] | None, seed: int
) -> SteadyCostModel:
    """The pricer, its steps varied as ``step_noise`` / ``step_scales`` say (a profile's model only)."""
    if not step_noise and step_scales is None:
        return pick.pricer
    if pick.measured is None:
        raise ValueError(
            "step_noise and step_scales need a profile's model (how the profiled machine's steps ran)"
        )
    decode, prompt = step_scales or (1.0, 1.0)
    noise = pick.measured.step_noise() if step_noise else None
    return VariedSteps(pick.measured, decode=decode, prompt=prompt, noise=noise, seed=seed)


def _step_budget_summary(
    serving: ServingConfig, schedulers: Sequence[Scheduler], num_over: int
) -> dict[str, Any]:
    """A time-budgeted run's step-time target and what missed it (nothing without a budget)."""
    policies = [s.policy for s in schedulers]
    if serving.step_budget_ms is None or not all(isinstance(p, ChunkedPolicy) for p in policies):
        return {}
    chunked = cast("list[ChunkedPolicy]", policies)
    return {
        "step_budget_ms": serving.step_budget_ms,
        "num_steps_over_budget": num_over,
        "num_guarded_steps": sum(p.num_guarded_steps for p in chunked),
        "num_decode_overruns": sum(p.num_decode_overruns for p in chunked),
    }


def _prefix_cache_summary(
    serving: ServingConfig, schedulers: Sequence[Scheduler], records: list[RequestRecord]
) -> dict[str, Any]:
    """Whether the prefix cache was on; over the tokens it looked up (at every admission,
    recomputes included, as vLLM counts), the share it found (None: no request said what its
    prompt is, so nothing could be shared); the share of completed requests that found any of
    their prompt cached at first; and the median TTFT of those that found at least half of it
    cached, and of the rest (None: no such request)."""
    queried = sum(s.state.num_prefix_queried_tokens for s in schedulers)
    hits = sum(s.state.num_prefix_hit_tokens for s in schedulers)
    done = [
        (r, r.first_token_s - r.arrival_s) for r in records if r.is_completed and r.first_token_s is not None
    ]
    mostly = [ttft_s for r, ttft_s in done if 2 * r.num_cached_tokens >= r.num_prompt_tokens]
    rest = [ttft_s for r, ttft_s in done if 2 * r.num_cached_tokens < r.num_prompt_tokens]
    return {
        "enable_prefix_caching": serving.enable_prefix_caching,
        "prefix_cache_queried_tokens": queried,
        "prefix_cache_hit_tokens": hits,
        "prefix_cache_hit_rate": hits / queried if queried else None,
        "prefix_cache_hit_requests": sum(r.num_cached_tokens > 0 for r, _ in done) / len(done)
        if queried and done
        else None,
        "median_ttft_ms_mostly_cached": float(np.median(mostly)) * 1000 if queried and mostly else None,
        "median_ttft_ms_mostly_computed": float(np.median(rest)) * 1000 if queried and rest else None,
    }


def _requests(
    workload: Workload | WorkloadArrays | Iterable[Request], num_requests: int | None, seed: int
) -> Iterable[Request]:
    if isinstance(workload, Workload):
        return sample(workload, num_requests, seed).iter_requests()
    if isinstance(workload, WorkloadArrays):
        return workload.iter_requests()
    return sorted(workload, key=lambda r: r.arrival_time_s)
