"""KV tiers on the simulated clock: what a replica's loads from its host tier and the shared
store cost, and the requests that wait for them.

The tiers' bookkeeping is the block manager's (:mod:`stallfree.core.kv_tiers`: write-through of
every block its prefix cache takes in, LRU by units, lookups past the GPU's hit). This module
adds the clock, as a request reaches a replica (:class:`TieredReplica`):

1. its blocks past what the GPU's prefix cache holds are looked up, the host tier's first, then
   the shared store's after them (:meth:`~stallfree.core.block_manager.BlockManager.tier_hits`);
2. each tier's blocks load over that tier's link of this replica: a PCIe link to host memory, a
   network link to the store, one of each per GPU (a replica of ``tp`` GPUs loads its shards in
   parallel); a link carries one load at a time, first come first served, so loads queue behind
   each other;
3. once its last load is in, the request joins the scheduler's queue; as it is admitted its loaded
   blocks land in the GPU's prefix cache after its hit (as many as the free blocks hold:
   :meth:`~stallfree.core.block_manager.BlockManager.land`), where its admission finds them.

While it loads the request is outside the scheduler, other requests run (vLLM holds such a
request in WAITING_FOR_REMOTE_KVS and schedules the others; SGLang's HiCache prefetches from its
storage tier as a request is queued). Simplifications, said where they matter: the lookup and the
loads happen as the request reaches the replica (vLLM looks up as it schedules the request), and
what was loaded waits, free, until the request is admitted (as in a host staging buffer; if the
GPU has by then evicted a block of its hit before them, they are not used and the request
computes them); writes to the tiers are not priced (they go the other way on full-duplex links,
and off the critical path); a request preempted later finds what the GPU cache still holds (no
second load). The router sees none of the tiers (vllm-router does not).
A tier's hits are the loaded blocks a request's admission started from
(``KvTiers.num_hit_blocks``); the prefix cache's counters count them with the GPU's.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from stallfree.core import Request, Scheduler
from stallfree.core.block_manager import BlockKeys, block_keys
from stallfree.core.kv_tiers import KvTier, KvTiers
from stallfree.costs.kv_transfer import DEFAULT_HOST_LINK, DEFAULT_SHARED_LINK, KvLink, tier_link
from stallfree.sim.driver import Replica

_GB = 1e9


@dataclass(frozen=True, slots=True)
class KvTierConfig:
    """A host tier of ``host_gb`` GB a replica over ``host_link``, a store of ``shared_gb`` GB
    shared by the fleet over each replica's ``shared_link``; either may be absent (None)."""

    host_gb: float | None = None
    host_link: str = DEFAULT_HOST_LINK
    shared_gb: float | None = None
    shared_link: str = DEFAULT_SHARED_LINK

    def __post_init__(self) -> None:
        if self.host_gb is None and self.shared_gb is None:
            raise ValueError("KV tiers: give a host tier's GB, a shared store's GB or both")
        for name in ("host_gb", "shared_gb"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"KV tiers: {name} must be a positive number of GB, got {value}")
        tier_link(self.host_link, host=True)  # the links' names parse
        tier_link(self.shared_link, host=False)

    def make_shared(self, bytes_per_block: int) -> KvTier | None:
        """The fleet's shared store (one for every replica), None without one."""
        return None if self.shared_gb is None else _tier("shared store", self.shared_gb, bytes_per_block)

    def make_host(self, bytes_per_block: int) -> KvTier | None:
        """One replica's host tier, None without one."""
        return None if self.host_gb is None else _tier("host tier", self.host_gb, bytes_per_block)


def _tier(name: str, gb: float, bytes_per_block: int) -> KvTier:
    num_blocks = int(gb * _GB // bytes_per_block)
    if num_blocks < 1:
        raise ValueError(
            f"the {name}'s {gb:g} GB is less than one KV block of this model ({bytes_per_block / _GB:.3g} GB)"
        )
    return KvTier(name, num_blocks)


class TierLoads:
    """One replica's tiers and links, and what its loads cost and moved.

    ``price(num_tokens) -> (bytes, seconds on a link of 1 byte/s a GPU)``: the replica's KV of that
    many tokens (all its GPUs' shards) and how long its GPUs move it at that rate (``tp`` links in
    parallel)."""

    def __init__(
        self,
        scheduler: Scheduler,
        tiers: KvTiers,
        links: tuple[KvLink, KvLink],
        price: Callable[[int], tuple[int, float]],
    ) -> None:
        self.scheduler = scheduler
        self.tiers = tiers
        self.links = links
        self._price = price
        scheduler.state.block_manager.tiers = tiers
        self._free_s = [0.0, 0.0]  # when each link (host, shared) ends its last load
        self.loaded_tokens = [0, 0]  # tokens loaded from each tier (host, shared)
        self.bytes_loaded = [0, 0]
        self.block_size = scheduler.state.block_manager.block_size
        self.num_loads = 0  # requests that loaded anything
        self.waits_s: list[float] = []  # each such request's wait, from reaching the replica

    def load(self, request: Request, now_s: float) -> tuple[float, BlockKeys, tuple[int, int, int]] | None:
        """Start loading what the tiers hold of ``request``'s prompt past the GPU's hit: when the
        loads are in, the prompt's keys and the blocks loaded (first, first from the shared store,
        past the last); None if the tiers hold none of it (or the scheduler would refuse it, or it
        keeps no prefix)."""
        scheduler = self.scheduler
        bm = scheduler.state.block_manager
        content = request.prompt_blocks
        if content is None or not bm.enable_prefix_caching or scheduler.rejection_reason(request) is not None:
            return None
        size = bm.block_size
        limit = (request.num_prompt_tokens - 1) // size  # the last token runs for its logits
        keys = block_keys(content, request.num_prompt_tokens, size)
        on_gpu = len(bm.match(keys, limit))
        host, shared = bm.tier_hits(keys, on_gpu, limit)
        if not host and not shared:
            return None
        ready_s = now_s
        for i, num_blocks in enumerate((host, shared)):
            if num_blocks:
                num_bytes, unit_s = self._price(num_blocks * size)
                link = self.links[i]
                end_s = max(now_s, self._free_s[i]) + link.latency_s + unit_s / link.bytes_per_s
                self._free_s[i] = end_s
                ready_s = max(ready_s, end_s)
                self.loaded_tokens[i] += num_blocks * size
                self.bytes_loaded[i] += num_bytes
        self.num_loads += 1
        self.waits_s.append(ready_s - now_s)
        return ready_s, keys, (on_gpu, on_gpu + host, on_gpu + host + shared)


class _Inner(Replica, Protocol):
    """What a :class:`TieredReplica` wraps: a :class:`~stallfree.sim.traffic.TrafficReplica`."""

    @property
    def num_in_flight(self) -> int: ...


class TieredReplica:
    """A :class:`~stallfree.sim.traffic.TrafficReplica` whose requests first load what the KV
    tiers hold of them (:class:`TierLoads`); a participant of :func:`~stallfree.sim.driver.drive`."""

    def __init__(self, inner: _Inner, loads: TierLoads) -> None:
        self.inner = inner
        self.loads = loads
        # (loads in, order, the request, its keys, the blocks loaded), earliest first
        self._loading: list[tuple[float, int, Request, BlockKeys, tuple[int, int, int]]] = []
        self._num_added = 0
        self._added_s = self._lands_s = -1.0  # when the request added last came, and reaches the scheduler
        self._stepping = False
        self._wake_s: float | None = None  # idle until a load lands (or the next arrival)

    @property
    def num_in_flight(self) -> int:
        return len(self._loading) + self.inner.num_in_flight

    def add_request(self, request: Request, now_s: float) -> None:
        loaded = self.loads.load(request, now_s)
        self._num_added += 1
        self._added_s = now_s
        if loaded is None:
            self._lands_s = now_s
            self.inner.add_request(request, now_s)
            return
        ready_s, keys, span = loaded
        self._lands_s = ready_s
        heapq.heappush(self._loading, (ready_s, self._num_added, request, keys, span))

    def has_unfinished_requests(self) -> bool:
        return bool(self._loading) or self.inner.has_unfinished_requests()

    def start_step(self, now_s: float, next_arrival_s: float | None) -> float | None:
        loading = self._loading
        while loading and loading[0][0] <= now_s:
            _, _, request, keys, span = heapq.heappop(loading)
            self.loads.scheduler.state.block_manager.stage(request.request_id, keys, span)
            self.inner.add_request(request, now_s)
        next_s = loading[0][0] if loading else None
        if next_arrival_s is not None and (next_s is None or next_arrival_s < next_s):
            next_s = next_arrival_s
        end_s = self.inner.start_step(now_s, next_s)
        self._stepping = end_s is not None
        self._wake_s = None if self._stepping else (loading[0][0] if loading else None)
        if self._wake_s is not None and next_arrival_s is not None:
            self._wake_s = min(self._wake_s, next_arrival_s)  # one replica is told arrivals ahead
        return end_s if self._stepping else self._wake_s

    def cut(self, at_s: float) -> float | None:
        # a request added now reaches the scheduler when its loads are in; one still on its way
        # to this replica (a route delay) at ``at_s``, when its lookup will say
        lands_s = self._lands_s if at_s == self._added_s else at_s
        if self._stepping:
            return self.inner.cut(lands_s)
        if self._wake_s is not None and lands_s < self._wake_s:
            self._wake_s = lands_s
            return lands_s
        return None

    def finish_step(self) -> None:
        if self._stepping:
            self.inner.finish_step()
            self._stepping = False
        self._wake_s = None


def tier_summary(loads: Sequence[TierLoads], queried_tokens: int, hit_tokens: int) -> dict[str, Any]:
    """The tiers' part of a run's summary, given the prefix cache's looked-up and hit tokens (which
    count what landed from the tiers): ``kv_tiers``, the hits by source (``gpu``, ``host``,
    ``shared``: tokens, and their share of those looked up), for each tier its capacity, link,
    tokens and bytes loaded, blocks written and evicted; how many requests loaded and how long they waited (from reaching the replica to the last load
    in; TTFT counts it too). For the table: ``kv_gpu_hit_rate``, ``kv_host_hit_rate``,
    ``kv_shared_hit_rate``, ``mean_kv_load_wait_ms``."""
    tiers = _tiers_summary(loads, queried_tokens, hit_tokens)
    return {
        "kv_tiers": tiers,
        **{
            f"kv_{name}_hit_rate": tiers[name]["hit_rate"]
            for name in ("gpu", "host", "shared")
            if name in tiers
        },
        "mean_kv_load_wait_ms": tiers["mean_load_wait_ms"],
    }


def _tiers_summary(loads: Sequence[TierLoads], queried_tokens: int, hit_tokens: int) -> dict[str, Any]:
    def share(tokens: int) -> float | None:
        return tokens / queried_tokens if queried_tokens else None

    first = loads[0]
    out: dict[str, Any] = {"gpu": {}}
    from_tiers = 0
    for i, name in enumerate(("host", "shared")):
        tiers = [getattr(t.tiers, name) for t in loads]
        if tiers[0] is None:
            continue
        distinct = list({id(t): t for t in tiers}.values())  # the shared store is one object
        hits = sum(t.tiers.num_hit_blocks[i] for t in loads) * first.block_size
        from_tiers += hits
        link = first.links[i]
        out[name] = {
            "hit_tokens": hits,
            "hit_rate": share(hits),
            "capacity_blocks": sum(t.num_blocks for t in distinct),
            "link": link.name,
            "link_gb_per_s": link.bytes_per_s / _GB,
            "loaded_tokens": sum(t.loaded_tokens[i] for t in loads),
            "bytes_loaded": sum(t.bytes_loaded[i] for t in loads),
            "stored_blocks": sum(t.num_stored_blocks for t in distinct),
            "evicted_blocks": sum(t.num_evicted_blocks for t in distinct),
        }
    out["gpu"] = {"hit_tokens": hit_tokens - from_tiers, "hit_rate": share(hit_tokens - from_tiers)}
    waits_s = [w for t in loads for w in t.waits_s]
    out["num_loads"] = len(waits_s)
    out["total_load_wait_s"] = sum(waits_s)
    out["mean_load_wait_ms"] = 1000 * sum(waits_s) / len(waits_s) if waits_s else None
    out["p99_load_wait_ms"] = 1000 * float(np.percentile(waits_s, 99)) if waits_s else None
    return out
