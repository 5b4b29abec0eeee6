"""KV tiers below the GPU's prefix cache: a host tier per replica and a store the replicas share.

A tier keeps KV blocks by their prefix-cache keys (:func:`~stallfree.core.block_manager.block_keys`),
in *units*: the blocks one key base covers (one block for prompts given as token ids; a trace's
coarser id, e.g. a Mooncake hash id of 512 tokens, for prompts given as such ids). A unit holds a
prefix of its blocks (how many), and is evicted whole, least recently used first (LMCache and
vLLM's CPU offloading also store and evict chunks of several blocks, not single blocks).

Invariants: ``num_used_blocks`` is the sum of the units' blocks and never exceeds ``num_blocks``;
a unit is held at most once; a block stored stays findable until its unit is evicted, and is never
found after; every block stored is either still held or counted in ``num_evicted_blocks``.

What fills them (write-through of every block the GPU's prefix cache takes in) and what reads
them (:meth:`~stallfree.core.block_manager.BlockManager.tier_hits`) is the block manager's; what
a load costs is the driver's (the scheduler never sees a clock).
"""

from __future__ import annotations

from collections import OrderedDict


class KvTier:
    """One tier: at most ``num_blocks`` blocks, in units evicted least recently used first."""

    def __init__(self, name: str, num_blocks: int) -> None:
        if num_blocks <= 0:
            raise ValueError(f"the {name} KV tier must hold at least one block, got {num_blocks}")
        self.name = name
        self.num_blocks = num_blocks
        self._units: OrderedDict[int, int] = OrderedDict()  # unit key -> blocks held; oldest first
        self.num_used_blocks = 0
        self.num_stored_blocks = 0  # blocks written in (a unit's blocks already held: not again)
        self.num_evicted_blocks = 0

    def __len__(self) -> int:
        """Units held."""
        return len(self._units)

    def held(self, key: int) -> int:
        """Blocks of unit ``key`` held (its first ones; 0: none), without counting as a use."""
        return self._units.get(key, 0)

    def use(self, key: int) -> int:
        """:meth:`held`, and the unit, if held, becomes the most recently used."""
        units = self._units
        num = units.get(key, 0)
        if num:
            units.move_to_end(key)
        return num

    def store(self, key: int, num_blocks: int) -> None:
        """Hold the first ``num_blocks`` blocks of unit ``key`` (more than the tier holds: as many
        as it does); the unit becomes the most recently used, and the least recently used others
        are evicted until the blocks fit."""
        units = self._units
        old = units.get(key)
        if old is not None:
            units.move_to_end(key)
            if old >= num_blocks:  # most stores: a unit written again, as a chunk ends in it
                return
        else:
            old = 0
        new = num_blocks if num_blocks <= self.num_blocks else self.num_blocks
        if new == old:
            return
        units[key] = new
        self.num_used_blocks += new - old
        self.num_stored_blocks += new - old
        while self.num_used_blocks > self.num_blocks:
            _, evicted = units.popitem(last=False)  # never ``key``: it is the newest and fits alone
            self.num_used_blocks -= evicted
            self.num_evicted_blocks += evicted

    def units(self) -> list[tuple[int, int]]:
        """Every unit held and its blocks, least recently used first (for tests and reports)."""
        return list(self._units.items())


class KvTiers:
    """The tiers below one replica's GPU pool: its own ``host`` tier and the fleet's ``shared``
    store (the same object in every replica), either of them absent; ``num_hit_blocks``: the
    blocks loaded from each (host, shared) that this replica's requests started from."""

    __slots__ = ("host", "num_hit_blocks", "shared")

    def __init__(self, host: KvTier | None = None, shared: KvTier | None = None) -> None:
        if host is None and shared is None:
            raise ValueError("KV tiers: give a host tier, a shared store or both")
        self.host = host
        self.shared = shared
        self.num_hit_blocks = [0, 0]

    def store(self, key: int, num_blocks: int) -> None:
        """Write the first ``num_blocks`` blocks of unit ``key`` through to every tier."""
        if self.host is not None:
            self.host.store(key, num_blocks)
        if self.shared is not None:
            self.shared.store(key, num_blocks)
