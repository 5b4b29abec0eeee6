"""Paged KV-cache blocks: which block ids each request holds, and the prefix cache over them.

A request holding ``n`` tokens of KV owns ``ceil(n / block_size)`` blocks, in order (its block
table). ``num_free_blocks + num_used_blocks == num_blocks`` always. With ``num_blocks=None`` the
pool is unbounded (the seed's picture ignores memory).

Without prefix caching a block is free or held by exactly one request. With it (vLLM V1's
automatic prefix caching), a full block of prompt tokens is also *cached* under a key that
chains its content to every block before it (:func:`block_keys`), so equal keys mean equal
prefixes. A cached block may be held by several requests at once (reference counts); when the
last one frees it, it stays cached but counts as free: it is evictable, and an allocation that
finds no uncached free block takes the least recently freed cached one (a request's tail blocks
first), dropping it from the cache. (vLLM keeps one queue of free blocks, cached or not, and
takes the least recently freed of all; keeping cached blocks until no other is free differs only
when memory is short, and keeps a request without a known prompt as cheap as without caching.) Only full blocks are cached, so a block written by one request is
never written by another; the executor writes a step's KV before any attention reads it, so a
block cached by one chunk may be read by another chunk of the same step.

The cache keeps *runs*, not blocks: the blocks one request cached one after another (its prompt,
chunk by chunk), indexed by the key of their first block, with one reference count per holder
rather than per block. Since a key chains every key before it, a cached key is either the first
of a run or follows the one before it in the same run: a lookup walks from run to run. Holders
hold a prefix of a run (a hit always starts at a run's first block), so a run's evictable blocks
are its last ones. Caching, freeing and evicting cost a few operations per run, not per block: a
simulated fleet caches every ~8K-token prompt (~500 blocks) and evicts it later. Nor are keys
kept per block: a request's keys (:class:`BlockKeys`) are worked out as they are read, a run's
are those of the request that cached it, and how far two chains agree is found by bisection
(a key equal means every key before it is).

KV tiers (:mod:`stallfree.core.kv_tiers`, optional): every block the cache takes in is written
through to the replica's host tier and the fleet's shared store, by the units of its keys; a
request's blocks past its GPU hit that the tiers hold are :meth:`BlockManager.tier_hits`; once
loaded they wait (:meth:`~BlockManager.stage`) until the request is about to be admitted, then
:meth:`~BlockManager.land` in the cache after its GPU hit, where its admission finds them as
cached blocks, counted by the tier they came from (``KvTiers.num_hit_blocks``). Without tiers
nothing here changes.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections import deque
from collections.abc import Sequence

from stallfree.core.config import ceil_div
from stallfree.core.kv_tiers import KvTier, KvTiers
from stallfree.core.request import PromptBlocks


def block_keys(content: PromptBlocks, num_tokens: int, block_size: int) -> BlockKeys:
    """The prefix-cache key of each full ``block_size`` block of the first ``num_tokens`` tokens
    that ``content`` names: key ``i`` hashes key ``i - 1`` with block ``i``'s ids (token ids, or
    for coarser ids the id and the block's offset inside it), so two keys are equal only if the
    prefixes are (up to 64-bit hash collisions, as in vLLM's default hash)."""
    per_id = content.tokens_per_id
    if block_size % per_id and per_id % block_size:
        raise ValueError(
            f"prefix caching: blocks of {block_size} tokens cannot be keyed by ids of {per_id} tokens "
            "(one must divide the other)"
        )
    num_blocks = min(num_tokens, content.num_named_tokens) // block_size
    bases: list[int] = []
    parent = 0
    ids = content.ids
    if per_id <= block_size:
        step = block_size // per_id
        for start in range(0, num_blocks * step, step):
            parent = hash((parent, ids[start : start + step]))
            bases.append(parent)
        return BlockKeys(bases, 1, block_size, num_blocks)
    # one hash per id; its blocks' keys are that hash plus their offset in it
    for block_id in ids[: ceil_div(num_blocks * block_size, per_id)]:
        parent = hash((parent, block_id))
        bases.append(parent)
    return BlockKeys(bases, per_id // block_size, block_size, num_blocks)


class BlockKeys:
    """A request's block keys (:func:`block_keys`), each worked out as it is read: a key for
    every ``per_base`` blocks (one per coarse id, else one per block) and the block's offset.

    Not a tuple of ints: a Mooncake prompt of ~14K tokens has ~870 blocks but ~27 ids, and a
    fleet's cache would make, keep and free an int object for every block. The cache keeps a
    run's keys as the chain it came from and where it starts in it."""

    __slots__ = ("_bases", "_block_size", "_len", "_per_base")

    def __init__(self, bases: list[int], per_base: int, block_size: int, length: int) -> None:
        self._bases = bases
        self._per_base = per_base
        self._block_size = block_size
        self._len = length

    def __len__(self) -> int:
        return self._len

    def at(self, i: int) -> int:
        """Key ``i`` (0 <= i < len)."""
        per = self._per_base
        if per == 1:
            return self._bases[i]
        return self._bases[i // per] + i % per * self._block_size

    def append(self, key: int) -> None:
        """Key one more block (a block of sampled tokens; keys of one per block only)."""
        if self._per_base != 1:
            raise ValueError("only keys of one per block grow")
        self._bases.append(key)
        self._len += 1

    @property
    def blocks_per_unit(self) -> int:
        """Blocks one key base covers: a KV tier's unit (:mod:`stallfree.core.kv_tiers`)."""
        return self._per_base

    def unit(self, j: int) -> int:
        """Unit ``j``'s key: that of blocks ``j * blocks_per_unit``.. (their base)."""
        return self._bases[j]

    def to_list(self) -> list[int]:
        """Every key, in order."""
        return [self.at(i) for i in range(self._len)]


def _num_shared(a: BlockKeys, a_at: int, b: BlockKeys, b_at: int, most: int) -> int:
    """How many keys ``a`` from ``a_at`` on and ``b`` from ``b_at`` on share (at most ``most``),
    the first being shared. A key chains every key before it, so a shared key means those before
    it are shared too (up to hash collisions, as for the keys themselves): found by bisection."""
    if most <= 1 or (a is b and a_at == b_at) or a.at(a_at + most - 1) == b.at(b_at + most - 1):
        return most
    low, high = 1, most - 1  # the first ``low`` are shared; more than ``high`` are not
    while low < high:
        mid = (low + high + 1) // 2
        if a.at(a_at + mid - 1) == b.at(b_at + mid - 1):
            low = mid
        else:
            high = mid - 1
    return low


class _Run:
    """Cached blocks, keys ``start``.. of ``chain`` (evictions take its last ones); ``holders``
    maps each request holding some to how many of its first blocks it holds; ``queued``: its
    evictable ranges in the LRU queue."""

    __slots__ = ("blocks", "chain", "holders", "queued", "start")

    def __init__(self, start: int, chain: BlockKeys, blocks: list[int], holder: str) -> None:
        self.start = start
        self.chain = chain
        self.blocks = blocks
        self.holders = {holder: len(blocks)}
        self.queued: list[_Range] = []

    def held(self) -> int:
        """How many of its first blocks some request holds (the rest are evictable)."""
        return max(self.holders.values(), default=0)


class _Range:
    """Blocks ``lo``..``hi - 1`` of ``run``, evictable, in the LRU queue (evicted from the last)."""

    __slots__ = ("hi", "lo", "run")

    def __init__(self, run: _Run, lo: int, hi: int) -> None:
        self.run, self.lo, self.hi = run, lo, hi


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
        # Uncached free ids are popped from the end: lowest ids are handed out first.
        self._free: list[int] = list(range(num_blocks - 1, -1, -1)) if num_blocks is not None else []
        self._next_unbounded_id = 0
        self._tables: dict[str, list[int]] = {}
        self.num_used_blocks = 0
        self._heads: dict[int, _Run] = {}  # a run's first key -> the run
        self._starts: list[int] = []  # where runs start in their chains, sorted (few: hits end at few places)
        self._num_starting: dict[int, int] = {}  # how many runs start at each of those
        self._run_at: dict[int, _Run] = {}  # a run's first block -> the run
        self._num_cached = 0
        self._queue: deque[_Range] = deque()  # evictable ranges, least recently freed first
        self._num_evictable = 0
        # How many of a request's first blocks are settled: taken from the cache or offered to it;
        # the runs it holds, in table order; its settled blocks left uncached (their key was); the
        # run that cached the key of its last settled block (where to look for the next key).
        self._num_keyed: dict[str, int] = {}
        self._holds: dict[str, list[_Run]] = {}
        self._duplicates: dict[str, list[int]] = {}
        self._tip: dict[str, _Run] = {}
        self.tiers: KvTiers | None = None  # written through as blocks are cached (None: no tiers)
        # requests whose blocks were loaded from the tiers, until admitted: their keys and the
        # blocks loaded (first, first from the shared store, past the last); then those that
        # landed in the cache (the same, past the GPU's hit as it was then)
        self._staged: dict[str, tuple[BlockKeys, tuple[int, int, int]]] = {}
        self._landed: dict[str, tuple[int, int, int]] = {}

    def blocks_for(self, num_tokens: int) -> int:
        return ceil_div(num_tokens, self.block_size)

    @property
    def num_free_blocks(self) -> int | None:
        """Free blocks, evictable cached ones included, or ``None`` for an unbounded pool."""
        return len(self._free) + self._num_evictable if self.num_blocks is not None else None

    @property
    def num_cached_blocks(self) -> int:
        """Blocks the prefix cache holds (in use or evictable)."""
        return self._num_cached

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
        elif need == 1 and self._free:  # most allocations: a decode or a chunk crossing into a block
            new = (self._free.pop(),)
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
        out: list[int] = []
        queue = self._queue
        while num_blocks:
            oldest = queue[0]
            if oldest.lo == oldest.hi:  # emptied by a hit (which dropped it from its run's list)
                queue.popleft()
                continue
            run, hi = oldest.run, oldest.hi
            cut = max(oldest.lo, hi - num_blocks)
            # A run's oldest range is its last blocks: evicting shortens the run.
            out += run.blocks[cut:hi][::-1]
            if not cut:
                self._unindex(run)
            del run.blocks[cut:]
            num_blocks -= hi - cut
            self._num_evictable -= hi - cut
            self._num_cached -= hi - cut
            oldest.hi = cut
            if cut == oldest.lo:
                queue.popleft()
                run.queued.remove(oldest)
        return tuple(out)

    def free(self, request_id: str) -> None:
        """Release every block of ``request_id`` (no-op if it holds none); cached blocks no one
        else holds become evictable, its last blocks first."""
        if self._staged:
            self._staged.pop(request_id, None)
        if self._landed:
            self._landed.pop(request_id, None)
        table = self._tables.pop(request_id, None)
        num_keyed = self._num_keyed.pop(request_id, 0)
        holds = self._holds.pop(request_id, [])
        duplicates = self._duplicates.pop(request_id, [])
        self._tip.pop(request_id, None)
        if not table:
            return
        self.num_used_blocks -= len(table)
        if self.num_blocks is None and not num_keyed:
            return
        # Only the first num_keyed blocks can be cached; the rest go back uncached.
        if self.num_blocks is not None:
            self._free.extend(reversed(table[num_keyed:]))
            self._free.extend(reversed(duplicates))
        for run in reversed(holds):
            num = run.holders.pop(request_id)
            rest = run.held()
            self.num_used_blocks += min(num, rest)  # still held by another request
            if num > rest:
                evictable = _Range(run, rest, num)
                self._queue.append(evictable)
                run.queued.append(evictable)
                self._num_evictable += num - rest

    def block_table(self, request_id: str) -> tuple[int, ...]:
        return tuple(self._tables.get(request_id, ()))

    @property
    def usage(self) -> float:
        """Fraction of the pool in use (0 for an unbounded pool)."""
        return self.num_used_blocks / self.num_blocks if self.num_blocks else 0.0

    # -- the prefix cache ---------------------------------------------------------------
    def match(self, keys: BlockKeys, max_blocks: int) -> list[int]:
        """The cached blocks of the longest prefix of ``keys`` (at most ``max_blocks``)."""
        hits: list[int] = []
        limit = min(len(keys), max_blocks)
        while len(hits) < limit:
            # key ``at`` is cached only as a run's first (the run before ended or left the chain)
            at = len(hits)
            run = self._heads.get(keys.at(at))
            if run is None:
                break
            hits += run.blocks[
                : _num_shared(keys, at, run.chain, run.start, min(limit - at, len(run.blocks)))
            ]
        return hits

    def _spans(self, blocks: Sequence[int]) -> list[tuple[_Run, int]]:
        """The runs a hit from :meth:`match` (or a prefix of one) takes, with how many of the
        first blocks of each (a hit leaves a run where its chain of keys leaves the run's)."""
        spans: list[tuple[_Run, int]] = []
        i = 0
        while i < len(blocks):
            run = self._run_at[blocks[i]]
            num = _common_prefix(list(blocks[i:]), run.blocks)
            spans.append((run, num))
            i += num
        return spans

    def num_evictable(self, blocks: Sequence[int]) -> int:
        """How many of ``blocks`` no request holds (taking them uses up free blocks)."""
        return sum(max(0, num - run.held()) for run, num in self._spans(blocks))

    def take_cached(self, request_id: str, blocks: Sequence[int]) -> None:
        """Start ``request_id``'s (empty) table with cached ``blocks`` from :meth:`match`."""
        if self._tables.get(request_id):
            raise RuntimeError(f"request {request_id}: cached blocks go first in an empty table")
        if self._landed and request_id in self._landed:
            self._count_landed(request_id, len(blocks))
        holds = []
        for run, num in self._spans(blocks):
            taken = num - run.held()
            if taken > 0:  # blocks no one held: out of their evictable ranges, into use
                for evictable in run.queued:
                    evictable.lo = max(evictable.lo, min(evictable.hi, num))
                run.queued = [evictable for evictable in run.queued if evictable.lo < evictable.hi]
                self.num_used_blocks += taken
                self._num_evictable -= taken
            run.holders[request_id] = num
            holds.append(run)
        self._tables[request_id] = list(blocks)
        self._num_keyed[request_id] = len(blocks)
        self._holds[request_id] = holds
        if holds:
            self._tip[request_id] = holds[-1]

    def cache_blocks(self, request_id: str, keys: BlockKeys, num_tokens: int) -> None:
        """Cache ``request_id``'s blocks that ``num_tokens`` tokens fill (those with a key in
        ``keys``); a block whose key another block already has stays uncached."""
        table = self._tables.get(request_id)
        if not table:
            return
        done = self._num_keyed.get(request_id, 0)
        upto = min(num_tokens // self.block_size, len(keys), len(table))
        if upto <= done:
            return
        duplicates = self._duplicates
        tip = self._tip.get(request_id)
        i = done
        while i < upto:
            run = self._run_caching(keys, i, tip)
            if run is not None:  # cached already: its blocks stay uncached as far as run goes on
                num = _num_shared(keys, i, run.chain, i, min(upto, run.start + len(run.blocks)) - i)
                assert num > 0, "the run found does not cache the key"
                duplicates.setdefault(request_id, []).extend(table[i : i + num])
            else:  # new up to the next key that starts a run (none between is cached)
                num = self._next_start(keys, i + 1, upto) - i
                run = self._add_run(request_id, i, keys, table[i : i + num])
            tip = run
            i += num
        assert tip is not None
        self._tip[request_id] = tip
        self._num_keyed[request_id] = upto
        if self.tiers is not None:
            self._write_through(self.tiers, keys, done, upto)

    def _write_through(self, tiers: KvTiers, keys: BlockKeys, lo: int, hi: int) -> None:
        """Store the units of blocks ``lo``..``hi - 1`` in the tiers, each with its blocks before
        ``hi`` (the request holds all of them: a unit's earlier blocks go with it)."""
        per = keys.blocks_per_unit
        for j in range(lo // per, (hi - 1) // per + 1):
            tiers.store(keys.unit(j), min(hi, (j + 1) * per) - j * per)

    def tier_hits(self, keys: BlockKeys, start: int, limit: int) -> tuple[int, int]:
        """How many of the blocks from ``start`` (past the GPU's hit), at most ``limit`` in all,
        the host tier holds one after another, and how many the shared store holds after those;
        the units found become their tier's most recently used (0, 0 without tiers)."""
        tiers = self.tiers
        if tiers is None:
            return 0, 0
        limit = min(limit, len(keys))
        host = 0 if tiers.host is None else _tier_run(tiers.host, keys, start, limit)
        shared = 0 if tiers.shared is None else _tier_run(tiers.shared, keys, start + host, limit)
        return host, shared

    def stage(self, request_id: str, keys: BlockKeys, span: tuple[int, int, int]) -> None:
        """Blocks ``start``..``end - 1`` of ``keys`` were loaded from the tiers for ``request_id``
        (``span`` = (start, the first from the shared store, end)): they wait to :meth:`land`
        until it is about to be admitted (vLLM allocates a request's blocks as it schedules it)."""
        self._staged[request_id] = (keys, span)

    def land_staged(self, request_id: str, reserve: int = 0) -> int:
        """:meth:`land` what was loaded for ``request_id``, if anything was (0 otherwise)."""
        staged = self._staged.get(request_id)
        return 0 if staged is None else self.land(request_id, staged[0], staged[1], reserve)

    def land(self, request_id: str, keys: BlockKeys, span: tuple[int, int, int], reserve: int = 0) -> int:
        """Cache blocks ``start``..``end - 1`` of ``keys``, loaded from the tiers for ``request_id``
        (``span`` = (start, the first from the shared store, end)), after the GPU's hit, as a freed
        request's (evictable, the most recently freed), and count those of them its admission
        starts from. Only past the hit as it is now: none if it no longer reaches ``start`` (a
        block before them was evicted while they waited), and as many as the free blocks (less
        ``reserve``) hold. Returns how many landed."""
        start, split, end = span
        hits = self.match(keys, end)
        lo = len(hits)
        if lo < start or lo >= end:
            return 0
        hi = end
        free = self.num_free_blocks
        if free is not None:
            hi = min(end, lo + free - reserve - self.num_evictable(hits))
            if hi <= lo:
                return 0
        holder = "\0landing"  # no request's id: its blocks are freed at once
        if hits:
            self.take_cached(holder, hits)
        self.allocate(holder, hi * self.block_size)
        self.cache_blocks(holder, keys, hi * self.block_size)
        self.free(holder)
        before = self._landed.get(request_id)  # landed before, some since evicted: one span
        self._landed[request_id] = (
            (lo, split, hi) if before is None else (min(lo, before[0]), split, max(hi, before[2]))
        )
        return hi - lo

    def _count_landed(self, request_id: str, num_hit: int) -> None:
        """``request_id`` is admitted with a hit of ``num_hit`` blocks: count those that landed
        for it, by the tier they came from."""
        lo, split, hi = self._landed.pop(request_id)
        self._staged.pop(request_id, None)
        if self.tiers is not None:
            counts = self.tiers.num_hit_blocks
            counts[0] += max(0, min(num_hit, split, hi) - lo)
            counts[1] += max(0, min(num_hit, hi) - max(lo, split))

    def _next_start(self, keys: BlockKeys, lo: int, hi: int) -> int:
        """The first of keys ``lo``..``hi - 1`` that starts a run (a run starting at ``j`` starts at key
        position ``j`` of every chain it is in: only those places are looked at), else ``hi``."""
        starts = self._starts
        for j in starts[bisect_left(starts, lo) : bisect_left(starts, hi)]:
            if keys.at(j) in self._heads:
                return j
        return hi

    def _run_caching(self, keys: BlockKeys, i: int, tip: _Run | None) -> _Run | None:
        """The run that caches key ``i``, if one does; ``tip``: a run that may cache key ``i - 1``."""
        key = keys.at(i)
        if tip is not None and 0 < i - tip.start <= len(tip.blocks) and tip.chain.at(i - 1) == keys.at(i - 1):
            # key i is then the tip's next key or some run's first key
            return tip if i - tip.start < len(tip.blocks) and tip.chain.at(i) == key else self._heads.get(key)
        # The run caching key i caches every key from its first to key i: the last key at or
        # before i that starts a run (looked for where runs start) is that one, or none caches it.
        starts = self._starts
        for j in reversed(starts[: bisect_right(starts, i)]):
            run = self._heads.get(keys.at(j))
            if run is not None:
                return run if i - j < len(run.blocks) and run.chain.at(run.start + i - j) == key else None
        return None

    def _add_run(self, request_id: str, start: int, keys: BlockKeys, blocks: list[int]) -> _Run:
        """Cache ``blocks`` (keys ``start``.. of ``keys``) for ``request_id``: the end of the run
        it holds whole, if they continue it, else a run of their own."""
        holds = self._holds.setdefault(request_id, [])
        last = holds[-1] if holds else None
        if last is not None and last.holders[request_id] == len(last.blocks) == start - last.start:
            run = last
            run.chain = keys  # it holds the whole run: its keys are the run's, and go on
            run.blocks += blocks
            run.holders[request_id] = len(run.blocks)
        else:
            run = _Run(start, keys, blocks, request_id)
            holds.append(run)
            self._index(run)
        self._num_cached += len(blocks)
        return run

    def _index(self, run: _Run) -> None:
        """Find ``run`` by its first key and first block, and look for keys where it starts."""
        self._heads[run.chain.at(run.start)] = run
        self._run_at[run.blocks[0]] = run
        if run.start not in self._num_starting:
            insort(self._starts, run.start)
        self._num_starting[run.start] = self._num_starting.get(run.start, 0) + 1

    def _unindex(self, run: _Run) -> None:
        """:meth:`_index` undone, as ``run``'s last cached block is evicted."""
        del self._heads[run.chain.at(run.start)], self._run_at[run.blocks[0]]
        self._num_starting[run.start] -= 1
        if not self._num_starting[run.start]:
            del self._num_starting[run.start], self._starts[bisect_left(self._starts, run.start)]


def _tier_run(tier: KvTier, keys: BlockKeys, start: int, limit: int) -> int:
    """How many blocks from ``start`` (short of ``limit``) ``tier`` holds one after another."""
    per = keys.blocks_per_unit
    at = start
    while at < limit:
        j = at // per
        end = min(j * per + tier.use(keys.unit(j)), limit)
        if end <= at:
            break
        at = end
    return at - start


def _common_prefix(items: list[int], run_items: list[int]) -> int:
    """How many first ``items`` equal the first of ``run_items`` (a run's blocks)."""
    head = items[: len(run_items)]
    num = len(head)
    if head == run_items[:num]:
        return num
    i = 0
    while head[i : i + 64] == run_items[i : i + 64]:  # 64 at a time, then one by one
        i += 64
    while head[i] == run_items[i]:
        i += 1
    return i
