"""Paged KV-cache blocks: which block ids each request holds, and the prefix cache over them.

A request holding ``n`` tokens of KV owns ``ceil(n / block_size)`` blocks, in order (its block
table). ``num_free_blocks + num_used_blocks == num_blocks`` always. With ``num_blocks=None`` the
pool is unbounded (the seed's picture ignores memory).

Without prefix caching a block is free or held by exactly one request. With it (vLLM V1's
automatic prefix caching), a full block of prompt tokens is also *cached* under a key that
chains its content to every block before it (:func:`block_keys`), so equal keys mean equal
prefixes. A cached block may be held by several requests at once (reference counts); when the
last one frees it, it stays cached but counts as free: it is evictable, and an allocation that
finds no other free block takes the least recently freed one (a request's tail blocks first),
dropping it from the cache. Only full blocks are cached, so a block written by one request is
never written by another; the executor writes a step's KV before any attention reads it, so a
block cached by one chunk may be read by another chunk of the same step.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from stallfree.core.config import ceil_div
from stallfree.core.request import PromptBlocks


def block_keys(content: PromptBlocks, num_prompt_tokens: int, block_size: int) -> tuple[int, ...]:
    """The prefix-cache key of each full ``block_size`` block of a prompt whose tokens ``content``
    names: key ``i`` hashes key ``i - 1`` with block ``i``'s ids (token ids, or for coarser ids the
    id and the block's offset inside it), so two keys are equal only if the prefixes are (up to
    64-bit hash collisions, as in vLLM's default hash)."""
    per_id = content.tokens_per_id
    if block_size % per_id and per_id % block_size:
        raise ValueError(
            f"prefix caching: blocks of {block_size} tokens cannot be keyed by ids of {per_id} tokens "
            "(one must divide the other)"
        )
    num_blocks = min(num_prompt_tokens, len(content.ids) * per_id) // block_size
    keys: list[int] = []
    parent = 0
    ids = content.ids
    for i in range(num_blocks):
        start = i * block_size
        if per_id <= block_size:
            parent = hash((parent, ids[start // per_id : (start + block_size) // per_id]))
        else:
            parent = hash((parent, ids[start // per_id], start % per_id))
        keys.append(parent)
    return tuple(keys)


class BlockManager:
    """Hands out block ids and keeps the prefix cache; knows nothing about scheduling."""

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
        # Without caching, free ids are popped from the end: lowest ids are handed out first.
        self._free: list[int] = list(range(num_blocks - 1, -1, -1)) if num_blocks is not None else []
        self._next_unbounded_id = 0
        self._tables: dict[str, list[int]] = {}
        self.num_used_blocks = 0
        # With caching, free blocks (cached or not) queue in the order they were freed.
        self._free_queue: OrderedDict[int, None] = OrderedDict()
        if enable_prefix_caching:
            self._free_queue.update((b, None) for b in reversed(self._free))
            self._free = []
        self._refs: dict[int, int] = {}  # held blocks: how many requests hold each
        self._cached: dict[int, int] = {}  # key -> block id
        self._key_of: dict[int, int] = {}  # cached block id -> its key
        self._num_keyed: dict[str, int] = {}  # how many of a request's first blocks are cached

    def blocks_for(self, num_tokens: int) -> int:
        return ceil_div(num_tokens, self.block_size)

    @property
    def num_free_blocks(self) -> int | None:
        """Free blocks, evictable cached ones included, or ``None`` for an unbounded pool."""
        if self.num_blocks is None:
            return None
        return len(self._free_queue) if self.enable_prefix_caching else len(self._free)

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
        elif self.enable_prefix_caching:
            new = tuple(self._pop_free() for _ in range(need))
        else:
            new = tuple(self._free[-need:][::-1])
            del self._free[-need:]
        if self.enable_prefix_caching:
            self._refs.update((b, 1) for b in new)
        self._tables.setdefault(request_id, []).extend(new)
        self.num_used_blocks += need
        return new

    def _pop_free(self) -> int:
        block, _ = self._free_queue.popitem(last=False)
        key = self._key_of.pop(block, None)
        if key is not None:  # evicted
            del self._cached[key]
        return block

    def free(self, request_id: str) -> None:
        """Release every block of ``request_id`` (no-op if it holds none); cached blocks no one
        else holds become evictable, its last blocks first."""
        table = self._tables.pop(request_id, None)
        self._num_keyed.pop(request_id, None)
        if not table:
            return
        if not self.enable_prefix_caching:
            self.num_used_blocks -= len(table)
            if self.num_blocks is not None:
                self._free.extend(reversed(table))
            return
        refs = self._refs
        for block in reversed(table):
            refs[block] -= 1
            if refs[block] == 0:
                del refs[block]
                self.num_used_blocks -= 1
                # An unbounded pool never reuses a block: keep only the cached ones.
                if self.num_blocks is not None or block in self._key_of:
                    self._free_queue[block] = None

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
        return sum(1 for b in blocks if b not in self._refs)

    def take_cached(self, request_id: str, blocks: Sequence[int]) -> None:
        """Start ``request_id``'s (empty) table with cached ``blocks`` from :meth:`match`."""
        if self._tables.get(request_id):
            raise RuntimeError(f"request {request_id}: cached blocks go first in an empty table")
        for block in blocks:
            if block in self._refs:
                self._refs[block] += 1
            else:
                self._free_queue.pop(block)
                self._refs[block] = 1
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
        for i in range(done, upto):
            key = keys[i]
            if key not in self._cached:
                self._cached[key] = table[i]
                self._key_of[table[i]] = key
        if upto > done:
            self._num_keyed[request_id] = upto
