"""Routers: which replica of a fleet an arriving request goes to.

Pure policies, like the scheduler: a router sees only what a real router in front of replicas
can know (how many requests it has in flight at each replica, the prompts it routed there, its
own approximate tree of them), never a replica's real KV cache; no clock, no I/O. A request is
in flight from its routing to its end (or its refusal), as a proxy sees a response close.

- ``round-robin``: replicas in turn.
- ``least-requests``: the fewest requests in flight (the lowest index on a tie).
- ``power-of-two``: two replicas drawn at random (seeded), the one with fewer in flight.
- ``consistent-hash``: a hash ring (``virtual_nodes`` points per replica) keyed on the request's
  session id (its request id when it has none): every turn of a conversation goes to the same
  replica whatever the loads; vllm-router's ``consistent_hash`` keeps the same affinity (its own
  hash function, so not the same replica for the same session).
- ``cache-aware``: vllm-router's rule (its ``cache_aware`` policy and defaults, 0.1.17): an approximate prefix tree per replica over what was routed there; a request's match
  rate is its longest prefix in a replica's tree over its length. When the loads are imbalanced
  (max - min > ``balance_abs_threshold`` and max > min x ``balance_rel_threshold``) the least
  loaded replica takes it; else, with a best match rate above ``cache_threshold``, the replica
  that matched most (between replicas that match as deep, the one a prompt last went through
  that prefix to: the last tenant vllm-router's tree keeps at a node); else the least loaded. The chosen replica's tree takes the prompt; a tree
  past ``max_tree_size`` units forgets its least recently used branches.

vllm-router 0.1.17 matches token ids, not text: for each request it asks the workers for the
prompt's tokens (``POST /v1/completions/render``, else ``/tokenize`` where that route is absent) and
one id is one unit of its tree. The simulator knows prompts as block ids
(:class:`~stallfree.core.request.PromptBlocks`: Mooncake's 512-token hashes, a session's token
ids): one id is one unit here, and a match rate is the same share of the prompt either way. vLLM
serves the render route only when started with ``--enable-scale-out``: without it (403) the router
gets no tokens and sends every request to the replica with the fewest in flight (the same one on a
tie, for the router's lifetime), which is ``least-requests`` here.
"""

from __future__ import annotations

import bisect
import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from stallfree.core.request import Request

ROUTER_NAMES = ("round-robin", "least-requests", "power-of-two", "consistent-hash", "cache-aware")


class Router(Protocol):
    """Picks a replica for each arrival; ``in_flight[i]``: requests routed to replica i and not
    yet finished, as the router counts them; ``routable``: the replicas it may pick now (None:
    every one), as a router's worker list changes when an autoscaler adds or drains workers."""

    name: str

    def route(
        self, request: Request, in_flight: Sequence[int], routable: Sequence[int] | None = None
    ) -> int: ...


class RoundRobin:
    name = "round-robin"

    def __init__(self) -> None:
        self._next = 0

    def route(self, request: Request, in_flight: Sequence[int], routable: Sequence[int] | None = None) -> int:
        if routable is not None:  # the workers in turn, as listed now
            self._next += 1
            return routable[(self._next - 1) % len(routable)]
        chosen = self._next % len(in_flight)
        self._next = chosen + 1
        return chosen


class LeastRequests:
    name = "least-requests"

    def route(self, request: Request, in_flight: Sequence[int], routable: Sequence[int] | None = None) -> int:
        return min(routable if routable is not None else range(len(in_flight)), key=in_flight.__getitem__)


class PowerOfTwo:
    name = "power-of-two"

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)

    def route(self, request: Request, in_flight: Sequence[int], routable: Sequence[int] | None = None) -> int:
        pool = routable if routable is not None else range(len(in_flight))
        if len(pool) == 1:
            return pool[0]
        a, b = self._rng.sample(pool, 2)
        return a if in_flight[a] <= in_flight[b] else b


class ConsistentHash:
    name = "consistent-hash"

    def __init__(self, num_replicas: int, virtual_nodes: int = 160) -> None:
        ring = sorted(
            (_hash(f"replica-{i}#{v}"), i) for i in range(num_replicas) for v in range(virtual_nodes)
        )
        self._points = [point for point, _ in ring]
        self._owners = [owner for _, owner in ring]

    def route(self, request: Request, in_flight: Sequence[int], routable: Sequence[int] | None = None) -> int:
        key = request.session_id if request.session_id is not None else request.request_id
        at = bisect.bisect_left(self._points, _hash(key))
        if routable is None:
            return self._owners[at % len(self._points)]
        allowed = set(routable)  # the ring without the others: the next point a routable one owns
        for step in range(len(self._points)):
            owner = self._owners[(at + step) % len(self._points)]
            if owner in allowed:
                return owner
        raise ValueError("no replica to route to")


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class _Node:
    __slots__ = ("children", "last_used", "parent", "unit")

    def __init__(self, parent: _Node | None, unit: int) -> None:
        self.children: dict[int, _Node] = {}
        self.parent = parent
        self.unit = unit
        self.last_used = 0


class PrefixTree:
    """One replica's approximate tree: the prompts routed there, one node per unit, at most
    ``max_size`` nodes (least recently used leaves go first)."""

    def __init__(self, max_size: int) -> None:
        self.root = _Node(None, -1)
        self.size = 0
        self.max_size = max_size
        self._clock = 0

    def match(self, units: Sequence[int]) -> int:
        """How many leading ``units`` the tree holds."""
        return self.match_last(units)[0]

    def match_last(self, units: Sequence[int]) -> tuple[int, int]:
        """How many leading ``units`` the tree holds, and when a prompt last went through the
        deepest of them (the ``stamp`` of that insert; 0 for none)."""
        node, depth = self.root, 0
        for unit in units:
            child = node.children.get(unit)
            if child is None:
                break
            node, depth = child, depth + 1
        return depth, node.last_used

    def insert(self, units: Sequence[int], stamp: int | None = None) -> None:
        """Add a prompt's ``units``, stamped ``stamp`` (increasing over the inserts; by default
        the tree's own count)."""
        self._clock = self._clock + 1 if stamp is None else stamp
        node = self.root
        for unit in units:
            child = node.children.get(unit)
            if child is None:
                child = node.children[unit] = _Node(node, unit)
                self.size += 1
            child.last_used = self._clock
            node = child
        if self.size > self.max_size:
            self._evict()

    def _evict(self) -> None:
        """Drop least recently used leaves (and the branches they leave bare) until it fits."""
        leaves = []
        stack = [self.root]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if not node.children and node is not self.root:
                leaves.append(node)
        for leaf in sorted(leaves, key=lambda n: n.last_used):
            bare: _Node | None = leaf
            while bare is not None and bare.parent is not None and not bare.children:
                if self.size <= self.max_size:
                    return
                del bare.parent.children[bare.unit]
                self.size -= 1
                bare = bare.parent


@dataclass(frozen=True, slots=True)
class CacheAwareConfig:
    """vllm-router's ``cache_aware`` flags and their defaults (0.1.17's ``--help``). Its
    ``--max-tree-size`` counts characters and is enforced every ``--eviction-interval-secs`` (120);
    here it counts units (block ids) and holds at every insert."""

    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    max_tree_size: int = 33_554_432


class CacheAware:
    name = "cache-aware"

    def __init__(self, num_replicas: int, config: CacheAwareConfig | None = None) -> None:
        self.config = config or CacheAwareConfig()
        self.trees = [PrefixTree(self.config.max_tree_size) for _ in range(num_replicas)]
        self._routed = 0  # prompts routed: the trees' common clock

    def route(self, request: Request, in_flight: Sequence[int], routable: Sequence[int] | None = None) -> int:
        cfg = self.config
        units = prompt_units(request)
        pool = routable if routable is not None else range(len(in_flight))
        least = min(pool, key=in_flight.__getitem__)
        loads = [in_flight[i] for i in pool]
        most, fewest = max(loads), min(loads)
        if most - fewest > cfg.balance_abs_threshold and most > fewest * cfg.balance_rel_threshold:
            chosen = least
        else:
            # The deepest match; between replicas that match as deep, the one a prompt last went
            # through that prefix to (vllm-router's tree answers the node's last tenant).
            matched = {i: self.trees[i].match_last(units) for i in pool}
            best = max(pool, key=matched.__getitem__)
            chosen = best if units and matched[best][0] / len(units) > cfg.cache_threshold else least
        self._routed += 1
        self.trees[chosen].insert(units, self._routed)
        return chosen

    def forget(self, replica: int) -> None:
        """A worker left (vllm-router's ``/remove_worker`` drops its tree); a new one starts bare."""
        self.trees[replica] = PrefixTree(self.config.max_tree_size)


def prompt_units(request: Request) -> tuple[int, ...]:
    """What a router's tree holds of a prompt: its block ids (none: nothing to match)."""
    blocks = request.prompt_blocks
    if blocks is None:
        return ()
    per_id = blocks.tokens_per_id
    return blocks.ids[: -(-min(blocks.num_named_tokens, request.num_prompt_tokens) // per_id)]


def make_router(name: str, num_replicas: int, seed: int = 0) -> Router:
    """A router by name (:data:`ROUTER_NAMES`); ValueError names the choices."""
    if name == "round-robin":
        return RoundRobin()
    if name == "least-requests":
        return LeastRequests()
    if name == "power-of-two":
        return PowerOfTwo(seed)
    if name == "consistent-hash":
        return ConsistentHash(num_replicas)
    if name == "cache-aware":
        return CacheAware(num_replicas)
    raise ValueError(f"unknown router {name!r}; choose from {', '.join(ROUTER_NAMES)}")
