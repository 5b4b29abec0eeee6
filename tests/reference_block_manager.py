"""A block-at-a-time prefix cache: the test oracle of :class:`stallfree.core.block_manager.BlockManager`,
which keeps runs of blocks instead (tests/test_core_prefix_cache.py drives both with the same
operations and compares every answer)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from stallfree.core.config import ceil_div


class ReferenceBlockManager:
    """The prefix cache block by block: a reference count per cached block, an LRU dict of the
    evictable ones. stallfree's run-based BlockManager must behave exactly like it."""

    def __init__(
        self, block_size: int, num_blocks: int | None, *, enable_prefix_caching: bool = False
    ) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        if num_blocks is not None and num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.enable_prefix_caching = enable_prefix_caching
        # Uncached free ids are popped from the end: lowest ids are handed out first.
        self._free: list[int] = list(range(num_blocks - 1, -1, -1)) if num_blocks is not None else []
        self._next_unbounded_id = 0
        self._tables: dict[str, list[int]] = {}
        self.num_used_blocks = 0
        self._evictable: OrderedDict[int, None] = OrderedDict()  # cached, held by no one: LRU first
        self._refs: dict[int, int] = {}  # cached blocks in use: how many requests hold each
        self._cached: dict[int, int] = {}  # key -> block id
        self._key_of: dict[int, int] = {}  # cached block id -> its key
        # How many of a request's first blocks are settled: taken from the cache or offered to it.
        self._num_keyed: dict[str, int] = {}

    def blocks_for(self, num_tokens: int) -> int:
        return ceil_div(num_tokens, self.block_size)

    @property
    def num_free_blocks(self) -> int | None:
        """Free blocks, evictable cached ones included, or ``None`` for an unbounded pool."""
        return len(self._free) + len(self._evictable) if self.num_blocks is not None else None

    @property
    def num_cached_blocks(self) -> int:
        """Blocks the prefix cache holds (in use or evictable)."""
        return len(self._cached)

    def num_new_blocks(self, request_id: str, num_tokens: int) -> int:
        """Blocks ``request_id`` must add to hold ``num_tokens`` tokens in total."""
        held = len(self._tables.get(request_id, ()))
        return max(0, self.blocks_for(num_tokens) - held)

    def can_allocate(self, num_new_blocks: int, reserve: int = 0) -> bool:
        free = self.num_free_blocks
        return free is None or free - reserve >= num_new_blocks

    def allocate(self, request_id: str, num_tokens: int) -> tuple[int, ...]:
        """Grow ``request_id``'s table to hold ``num_tokens`` tokens; return the ids added."""
        need = self.num_new_blocks(request_id, num_tokens)
        if need == 0:
            return ()
        if not self.can_allocate(need):
            raise RuntimeError(f"request {request_id}: needs {need} blocks, {self.num_free_blocks} free")
        if self.num_blocks is None:
            new = tuple(range(self._next_unbounded_id, self._next_unbounded_id + need))
            self._next_unbounded_id += need
        else:
            free = self._free
            plain = min(need, len(free))
            new = tuple(free[len(free) - plain :][::-1])
            del free[len(free) - plain :]
            if plain < need:
                new += self._evict(need - plain)
        self._tables.setdefault(request_id, []).extend(new)
        self.num_used_blocks += need
        return new

    def trim(self, request_id: str, num_tokens: int) -> int | None:
        """Release ``request_id``'s blocks past those ``num_tokens`` tokens fill (the slots of
        rejected draft tokens: never cached); how many it keeps, or None if it held no more."""
        table = self._tables.get(request_id)
        keep = self.blocks_for(num_tokens)
        if table is None or len(table) <= keep:
            return None
        tail = table[keep:]
        del table[keep:]
        self.num_used_blocks -= len(tail)
        if self.num_blocks is not None:
            self._free.extend(reversed(tail))
        return keep

    def _evict(self, num_blocks: int) -> tuple[int, ...]:
        """The ``num_blocks`` least recently freed cached blocks, dropped from the cache."""
        evictable, cached = self._evictable, self._cached
        blocks = tuple(evictable.popitem(last=False)[0] for _ in range(num_blocks))
        for key in map(self._key_of.pop, blocks):
            del cached[key]
        return blocks

    def free(self, request_id: str) -> None:
        """Release every block of ``request_id`` (no-op if it holds none); cached blocks no one
        else holds become evictable, its last blocks first."""
        table = self._tables.pop(request_id, None)
        num_keyed = self._num_keyed.pop(request_id, 0)
        if not table:
            return
        self.num_used_blocks -= len(table)
        if self.num_blocks is None and not num_keyed:
            return
        # Only the first num_keyed blocks can be cached; the rest go back uncached.
        if self.num_blocks is not None:
            self._free.extend(reversed(table[num_keyed:]))
        refs, key_of = self._refs, self._key_of
        keyed = table[num_keyed - 1 :: -1] if num_keyed else []
        if all(refs.get(block) == 1 for block in keyed):  # cached, and held by this request alone
            for block in keyed:
                del refs[block]
            self._evictable.update(dict.fromkeys(keyed))
            return
        for block in keyed:
            if block not in key_of:  # a duplicate of a block cached earlier: never shared
                if self.num_blocks is not None:
                    self._free.append(block)
            elif refs[block] > 1:
                refs[block] -= 1
                self.num_used_blocks += 1  # still held by another request
            else:
                del refs[block]
                self._evictable[block] = None

    def block_table(self, request_id: str) -> tuple[int, ...]:
        return tuple(self._tables.get(request_id, ()))

    @property
    def usage(self) -> float:
        """Fraction of the pool in use (0 for an unbounded pool)."""
        return self.num_used_blocks / self.num_blocks if self.num_blocks else 0.0

    # -- the prefix cache ---------------------------------------------------------------
    def match(self, keys: Sequence[int], max_blocks: int) -> list[int]:
        """The cached blocks of the longest prefix of ``keys`` (at most ``max_blocks``)."""
        hits: list[int] = []
        cached = self._cached
        for key in keys[:max_blocks]:
            block = cached.get(key)
            if block is None:
                break
            hits.append(block)
        return hits

    def num_evictable(self, blocks: Sequence[int]) -> int:
        """How many of ``blocks`` no request holds (taking them uses up free blocks)."""
        return sum(1 for b in blocks if b in self._evictable)

    def take_cached(self, request_id: str, blocks: Sequence[int]) -> None:
        """Start ``request_id``'s (empty) table with cached ``blocks`` from :meth:`match`."""
        if self._tables.get(request_id):
            raise RuntimeError(f"request {request_id}: cached blocks go first in an empty table")
        refs = self._refs
        for block in blocks:
            if block in refs:
                refs[block] += 1
            else:
                del self._evictable[block]
                refs[block] = 1
                self.num_used_blocks += 1
        self._tables[request_id] = list(blocks)
        self._num_keyed[request_id] = len(blocks)

    def cache_blocks(self, request_id: str, keys: Sequence[int], num_tokens: int) -> None:
        """Cache ``request_id``'s blocks that ``num_tokens`` tokens fill (those with a key in
        ``keys``); a block whose key another block already has stays uncached."""
        table = self._tables.get(request_id)
        if not table:
            return
        done = self._num_keyed.get(request_id, 0)
        upto = min(num_tokens // self.block_size, len(keys), len(table))
        if upto <= done:
            return
        cached, key_of, refs = self._cached, self._key_of, self._refs
        new_keys, blocks = keys[done:upto], table[done:upto]
        if cached.keys().isdisjoint(new_keys):  # the usual case: none of them cached yet
            cached.update(zip(new_keys, blocks, strict=True))
            key_of.update(zip(blocks, new_keys, strict=True))
            refs.update(dict.fromkeys(blocks, 1))
        else:
            for key, block in zip(new_keys, blocks, strict=True):
                if key not in cached:
                    cached[key] = block
                    key_of[block] = key
                    refs[block] = 1
        self._num_keyed[request_id] = upto
