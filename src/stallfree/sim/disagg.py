"""Disaggregated serving on the one clock: a prefill pool, KV links, a decode pool.

Each request goes as vLLM's KV connectors and vllm-router's PD mode send it:

1. the prefill router picks a prefill replica; it runs the prompt (``max_tokens`` 1, its own
   token budget) and, finished, holds its KV blocks (``Request.sends_kv``);
2. the decode router picks a decode replica; the KV (every prompt token's, from the model's
   layout: :func:`~stallfree.costs.kv_transfer.kv_transfer_bytes`) crosses a link;
3. the decode replica queues it with that KV (``Request.num_external_tokens``); admitted when its
   blocks fit, it runs the last prompt token again for logits and decodes; the client's first
   token is that step's (vLLM's decode server samples it). Only then does the prefill replica
   free its copy: a full decode pool backs up into the prefill pool's KV cache.

Concurrent transfers share the links: a transfer uses ``min(tp_prefill, tp_decode)`` GPU links,
a prefill replica sends over its ``tp_prefill`` links and a decode replica receives over its
``tp_decode``, each shared evenly by its transfers in flight (a transfer's rate is the least of
the three); the link's latency counts as that many more bytes at the transfer's full rate.
The transfer here precedes the decode replica's reservation (vLLM reserves, then pulls): with
the link idle the first token comes at the same time; the blocks the decode replica holds during
a transfer are not counted.

Every request has one record: the decode replica's (arrival, first token, ITL, finish: what the
client sees), with the time it was first scheduled and its prefix-cache hit from the prefill
replica; a request refused by either pool, that pool's refusal.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from stallfree.core import Request, Scheduler
from stallfree.core.router import Router
from stallfree.core.serving import ServingConfig
from stallfree.costs.kv_transfer import DEFAULT_KV_LINK, KV_CONNECTORS, KvLink, PoolShape
from stallfree.costs.memory import KvMemory
from stallfree.costs.protocol import SteadyCostModel
from stallfree.metrics import ItlAccumulator, RequestRecord
from stallfree.sim.driver import Handoff, Replica, SimClock, drive
from stallfree.sim.traffic import TrafficReplica, TrafficRun


@dataclass(frozen=True, slots=True)
class Disaggregation:
    """A disaggregated deployment's layout: the pools, the KV link between them (a
    :data:`~stallfree.costs.kv_transfer.LINKS` name or GB/s a GPU), and the prefill replicas'
    token budget (None: the decode replicas')."""

    shape: PoolShape
    kv_link: str = DEFAULT_KV_LINK
    prefill_token_budget: int | None = None
    kv_connector: str = "nixl"
    prefill_profile: str | None = None  # the prefill replicas' own profile (None: the cost choice's)

    def __post_init__(self) -> None:
        if self.kv_connector not in KV_CONNECTORS:
            raise ValueError(
                f"unknown KV connector {self.kv_connector!r}; choose from {', '.join(KV_CONNECTORS)}"
            )

    def external_tokens(self, num_prompt_tokens: int, block_size: int) -> int:
        """The prompt tokens whose KV the decode replica gets (the rest it computes again)."""
        if self.kv_connector == "nixl":
            return num_prompt_tokens
        return (num_prompt_tokens - 1) // block_size * block_size

    def prefill_serving(self, serving: ServingConfig) -> ServingConfig:
        """How the prefill replicas schedule: as ``serving``, with their own budget if given."""
        if self.prefill_token_budget is None:
            return serving
        return replace(serving, max_num_batched_tokens=self.prefill_token_budget, chunk_tokens=None)


class _Transfer:
    __slots__ = ("dst", "end_s", "left_bytes", "rate", "request", "src")

    def __init__(self, request: Request, src: int, dst: int, num_bytes: float) -> None:
        self.request, self.src, self.dst = request, src, dst
        self.left_bytes = num_bytes
        self.rate = 0.0
        self.end_s = 0.0


class KvLinks:
    """The KV transfers in flight between the pools: a participant of
    :func:`~stallfree.sim.driver.drive` whose steps end as transfers complete."""

    def __init__(
        self, link: KvLink, shape: PoolShape, arrived: Callable[[Request, int, float], None]
    ) -> None:
        self._bw = link.bytes_per_s
        self._latency_s = link.latency_s
        self._shape = shape
        self._arrived = arrived  # (request, decode replica, now): the KV is there
        self._in_flight: list[_Transfer] = []
        self._last_s = 0.0
        self._end_s = 0.0
        self.busy_s = 0.0  # time with a transfer in flight
        self.num_bytes = 0

    def send(self, request: Request, src: int, dst: int, num_bytes: int, now_s: float) -> None:
        """Start moving ``request``'s ``num_bytes`` from prefill replica ``src`` to decode ``dst``."""
        self._advance(now_s)
        links = min(self._shape.tp_prefill, self._shape.tp_decode)
        self._in_flight.append(_Transfer(request, src, dst, num_bytes + self._latency_s * links * self._bw))
        self.num_bytes += num_bytes
        self._rates(now_s)

    def num_to(self, dst: int) -> int:
        return sum(t.dst == dst for t in self._in_flight)

    def _advance(self, now_s: float) -> None:
        elapsed_s = now_s - self._last_s
        if self._in_flight:
            self.busy_s += elapsed_s
            for t in self._in_flight:
                t.left_bytes -= t.rate * elapsed_s
        self._last_s = now_s

    def _rates(self, now_s: float) -> None:
        shape, bw = self._shape, self._bw
        out_count: dict[int, int] = {}
        in_count: dict[int, int] = {}
        for t in self._in_flight:
            out_count[t.src] = out_count.get(t.src, 0) + 1
            in_count[t.dst] = in_count.get(t.dst, 0) + 1
        own = min(shape.tp_prefill, shape.tp_decode) * bw
        for t in self._in_flight:
            t.rate = min(
                own, shape.tp_prefill * bw / out_count[t.src], shape.tp_decode * bw / in_count[t.dst]
            )
            t.end_s = now_s + max(t.left_bytes, 0.0) / t.rate

    # -- the participant -----------------------------------------------------------------------
    def add_request(self, request: Request, now_s: float) -> None:  # pragma: no cover - never routed to
        raise TypeError("the KV links take transfers (send), not requests")

    def has_unfinished_requests(self) -> bool:
        return bool(self._in_flight)

    def start_step(self, now_s: float, next_arrival_s: float | None) -> float | None:
        if not self._in_flight:
            return None
        self._end_s = min(t.end_s for t in self._in_flight)
        return self._end_s

    def cut(self, at_s: float) -> float | None:
        return self.start_step(at_s, None)  # a new transfer slowed the others: the next end moved

    def finish_step(self) -> None:
        now_s = self._end_s
        self._advance(now_s)
        done = [t for t in self._in_flight if t.end_s <= now_s]
        self._in_flight = [t for t in self._in_flight if t.end_s > now_s]
        self._rates(now_s)
        for t in done:
            self._arrived(t.request, t.dst, now_s)


class _PoolReplica:
    """A pool's traffic replica, as the driver sees it; the pools' subclasses change what a
    request and a step's start mean."""

    def __init__(self, inner: TrafficReplica) -> None:
        self.inner = inner

    def add_request(self, request: Request, now_s: float) -> None:
        self.inner.add_request(request, now_s)

    def has_unfinished_requests(self) -> bool:
        return self.inner.has_unfinished_requests()

    def start_step(self, now_s: float, next_arrival_s: float | None) -> float | None:
        return self.inner.start_step(now_s, next_arrival_s)

    def cut(self, at_s: float) -> float | None:
        return self.inner.cut(at_s)

    def finish_step(self) -> None:
        self.inner.finish_step()


class _PrefillReplica(_PoolReplica):
    """A prefill replica: runs an arrival's prompt for one token and keeps its KV to send."""

    def __init__(self, inner: TrafficReplica, originals: dict[str, Request], owner: dict[str, int]) -> None:
        super().__init__(inner)
        self._originals = originals  # the run's books of the requests on their way
        self._owner = owner

    def add_request(self, request: Request, now_s: float) -> None:
        rid = request.request_id
        self.inner.add_request(replace(request, max_tokens=1, sends_kv=True), now_s)
        if not self.inner.scheduler.has_request(rid):  # refused: it goes no further
            del self._originals[rid], self._owner[rid]


class _DecodeReplica(_PoolReplica):
    """A decode replica that frees each request's prefill copy once it admits the request."""

    def __init__(self, inner: TrafficReplica, release: Callable[[str], None]) -> None:
        super().__init__(inner)
        self._release = release
        self._queued: deque[str] = deque()  # handed over, not yet admitted: in admission order

    def add_request(self, request: Request, now_s: float) -> None:
        self.inner.add_request(request, now_s)
        if self.inner.scheduler.has_request(request.request_id):
            self._queued.append(request.request_id)
        else:  # refused: no decode replica will read the prefill's copy
            self._release(request.request_id)

    def start_step(self, now_s: float, next_arrival_s: float | None) -> float | None:
        end_s = self.inner.start_step(now_s, next_arrival_s)
        scheduler, queued = self.inner.scheduler, self._queued
        # Admission takes the waiting queue's head, and every request here came handed over.
        while queued and (queued[0] in scheduler.state.running_by_id or not scheduler.has_request(queued[0])):
            self._release(queued.popleft())
        return end_s


@dataclass(slots=True)
class DisaggRun:
    """What :func:`run_disaggregated` measured: each pool's runs, the client's records (arrival
    order), the decode pool's ITL samples, and each request's way through."""

    prefill: list[TrafficRun]
    decode: list[TrafficRun]
    records: list[RequestRecord]
    itl: ItlAccumulator
    duration_s: float
    stopped: bool
    link_busy_s: float
    kv_bytes: int
    prefill_s: list[float] = field(default_factory=list)  # arrival -> the prefill replica's end
    transfer_s: list[float] = field(default_factory=list)  # prefill's end -> the KV at decode
    decode_queue_s: list[float] = field(default_factory=list)  # KV at decode -> first scheduled there


def run_disaggregated(
    shape: PoolShape,
    prefill: tuple[Sequence[Scheduler], Sequence[SteadyCostModel]],
    decode: tuple[Sequence[Scheduler], Sequence[SteadyCostModel]],
    routers: tuple[Router, Router],
    link: KvLink,
    kv_bytes: Callable[[int], int],
    requests: Iterable[Request],
    external_tokens: Callable[[int], int] = lambda n: n,
    *,
    fast: bool = True,
    step_budget_s: float | None = None,
    stop: Callable[[], bool] | None = None,
) -> DisaggRun:
    """Run ``requests`` (ordered by arrival) through a prefill pool and a decode pool (one scheduler
    and cost model a replica) joined by ``link``; ``external_tokens(num_prompt_tokens)``: the tokens
    whose KV moves, ``kv_bytes`` of them; ``step_budget_s``: count the steps longer than that."""
    handoffs: list[Handoff] = []
    num_p = shape.num_prefill
    owner: dict[str, int] = {}  # request -> its prefill replica, until that frees its copy
    originals: dict[str, Request] = {}  # handed to a prefill replica, not yet to a decode one
    prefill_end_s: dict[str, float] = {}
    arrived_s: dict[str, float] = {}
    ordering: dict[str, int] = {}

    def prefill_done(rid: str, end_s: float) -> None:
        request = originals.pop(rid)
        prefill_end_s[rid] = end_s
        dst = routers[1].route(
            request, [d.inner.num_in_flight + links.num_to(i) for i, d in enumerate(dsides)]
        )
        nbytes = kv_bytes(external_tokens(request.num_prompt_tokens))
        handoffs.append((num_p, lambda now_s: links.send(request, owner[rid], dst, nbytes, now_s)))

    def kv_arrived(request: Request, dst: int, now_s: float) -> None:
        arrived_s[request.request_id] = now_s
        handed = replace(request, num_external_tokens=external_tokens(request.num_prompt_tokens))
        handoffs.append((num_p + 1 + dst, lambda t: dsides[dst].add_request(handed, t)))

    def release(rid: str) -> None:
        src = owner.pop(rid)
        handoffs.append((src, lambda _t: pschedulers[src].release_kv(rid)))

    pschedulers, pcosts = prefill
    psides = [
        TrafficReplica(s, c, fast=fast, step_budget_s=step_budget_s, cuttable=True, on_finished=prefill_done)
        for s, c in zip(pschedulers, pcosts, strict=True)
    ]
    links = KvLinks(link, shape, kv_arrived)
    dsides = [
        _DecodeReplica(TrafficReplica(s, c, fast=fast, step_budget_s=step_budget_s, cuttable=True), release)
        for s, c in zip(*decode, strict=True)
    ]
    if len(psides) != num_p or len(dsides) != shape.num_decode:
        raise ValueError(f"{shape} needs {num_p} prefill and {shape.num_decode} decode schedulers")

    def route(request: Request) -> int:
        rid = request.request_id
        ordering[rid] = len(ordering)
        i = routers[0].route(request, [p.num_in_flight for p in psides])
        owner[rid] = i
        originals[rid] = request
        return i

    participants: list[Replica] = [*(_PrefillReplica(p, originals, owner) for p in psides), links, *dsides]
    clock = SimClock()
    stopped = drive(clock, requests, participants, route=route, stop=stop, handoffs=handoffs)
    now = clock.now()
    pruns = [p.result(now, stopped) for p in psides]
    druns = [d.inner.result(now, stopped) for d in dsides]
    run = DisaggRun(pruns, druns, [], ItlAccumulator(), now, stopped, links.busy_s, links.num_bytes)
    _join_pools(run, prefill_end_s, arrived_s, ordering)
    return run


def _join_pools(
    run: DisaggRun, prefill_end_s: dict[str, float], arrived_s: dict[str, float], ordering: dict[str, int]
) -> None:
    """Fill in ``run``'s client view from its pools' runs: the records (the prefill pool's refusals
    and the decode pool's records, those with the prefill replica's first scheduling and prefix-cache
    hit; sorted by arrival ``ordering``), the decode pool's ITL samples, each request's stage times."""
    records = run.records
    records.extend(r for prun in run.prefill for r in prun.records if r.finish_reason == "rejected")
    by_prefill = {r.request_id: r for prun in run.prefill for r in prun.records}
    for drun in run.decode:
        run.itl.add_many(drun.itl.values_s, drun.itl.counts)
        for rec in drun.records:
            rid = rec.request_id
            if rec.finish_reason == "rejected":
                records.append(rec)
                continue
            first = by_prefill[rid]
            run.prefill_s.append(prefill_end_s[rid] - rec.arrival_s)
            run.transfer_s.append(arrived_s[rid] - prefill_end_s[rid])
            if rec.first_scheduled_s is not None:
                run.decode_queue_s.append(rec.first_scheduled_s - arrived_s[rid])
            records.append(
                replace(
                    rec, first_scheduled_s=first.first_scheduled_s, num_cached_tokens=first.num_cached_tokens
                )
            )
    records.sort(key=lambda rec: ordering[rec.request_id])


def disaggregated_summary(
    run: DisaggRun,
    plan: Disaggregation,
    link: KvLink,
    servings: tuple[ServingConfig, ServingConfig],
    kvs: tuple[KvMemory, KvMemory],
) -> dict[str, Any]:
    """The pools (each one's replicas, TP, budget, KV blocks a replica, busy share: the time its
    replicas ran steps over theirs), and each request's way through: its prefill (from arrival,
    queueing included), its KV's trip, its wait for a decode slot (ms: median, p90, p99)."""
    duration_s, shape = run.duration_s, plan.shape

    def pool(runs: list[TrafficRun], tp: int, serving: ServingConfig, kv: KvMemory) -> dict[str, Any]:
        return {
            "replicas": len(runs),
            "tp": tp,
            "token_budget": serving.token_budget,
            "num_kv_blocks": kv.num_blocks,
            "busy": sum(r.busy_s for r in runs) / (len(runs) * duration_s) if duration_s > 0 else 0.0,
            "num_steps": sum(r.num_steps for r in runs),
            "max_step_ms": max(r.max_step_s for r in runs) * 1000,
            "num_preemptions": sum(r.num_preemptions for r in runs),
        }

    stages = {"prefill": run.prefill_s, "kv_transfer": run.transfer_s, "decode_queue": run.decode_queue_s}
    return {
        "pools": str(shape),
        "gpus": shape.num_gpus,
        "prefill": pool(run.prefill, shape.tp_prefill, servings[0], kvs[0]),
        "decode": pool(run.decode, shape.tp_decode, servings[1], kvs[1]),
        "kv_link": link.name,
        "kv_link_bytes_per_s": link.bytes_per_s,
        "num_kv_transfers": len(run.transfer_s),
        "kv_bytes": run.kv_bytes,
        "link_busy": run.link_busy_s / duration_s if duration_s > 0 else 0.0,
        **{
            f"{stat}_{stage}_ms": float(np.percentile(values, q)) * 1000 if values else None
            for stage, values in stages.items()
            for stat, q in (("median", 50), ("p90", 90), ("p99", 99))
        },
        "kv_connector": plan.kv_connector,
    }
