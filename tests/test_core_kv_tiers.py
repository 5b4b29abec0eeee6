"""KV tiers below the GPU's prefix cache (core): LRU units, write-through, lookups past the GPU hit;
property tests that blocks move between the tiers without loss or duplication."""

from __future__ import annotations

from collections import OrderedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stallfree.core.block_manager import BlockKeys, BlockManager, block_keys
from stallfree.core.kv_tiers import KvTier, KvTiers
from stallfree.core.request import PromptBlocks

BLOCK = 4


class ReferenceTier:
    """The tier's rule written plainly: units in use order, a unit's blocks the most stored."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.units: OrderedDict[int, int] = OrderedDict()
        self.evicted = 0

    def store(self, key: int, num: int) -> None:
        num = min(max(self.units.pop(key, 0), num), self.num_blocks)
        self.units[key] = num
        while sum(self.units.values()) > self.num_blocks:
            self.evicted += self.units.popitem(last=False)[1]

    def use(self, key: int) -> int:
        if key in self.units:
            self.units.move_to_end(key)
        return self.units.get(key, 0)


def test_a_tier_evicts_whole_units_least_recently_used_first() -> None:
    tier = KvTier("host", 6)
    tier.store(1, 2)
    tier.store(2, 2)
    tier.store(3, 2)
    assert tier.use(1) == 2  # 1 is now the most recently used: 2 goes first
    tier.store(4, 1)
    assert tier.units() == [(3, 2), (1, 2), (4, 1)]
    assert (tier.num_used_blocks, tier.num_stored_blocks, tier.num_evicted_blocks) == (5, 7, 2)
    tier.store(4, 3)  # more of a unit held: only the new blocks are written, and something must go
    assert tier.units() == [(1, 2), (4, 3)]
    assert tier.held(3) == 0 and tier.num_evicted_blocks == 4


def test_a_tier_smaller_than_one_block_or_none_at_all_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one block"):
        KvTier("host", 0)
    with pytest.raises(ValueError, match="host tier, a shared store or both"):
        KvTiers()


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 12),
    st.lists(st.tuples(st.booleans(), st.integers(0, 9), st.integers(1, 5)), max_size=60),
)
def test_a_tier_keeps_the_reference_rule(capacity: int, ops: list[tuple[bool, int, int]]) -> None:
    tier, reference = KvTier("t", capacity), ReferenceTier(capacity)
    for is_store, key, num in ops:
        if is_store:
            tier.store(key, num)
            reference.store(key, num)
        else:
            assert tier.use(key) == reference.use(key)
        assert tier.units() == list(reference.units.items())
        assert tier.num_used_blocks == sum(n for _, n in tier.units()) <= capacity
        assert tier.num_stored_blocks == tier.num_used_blocks + tier.num_evicted_blocks
        assert tier.num_evicted_blocks == reference.evicted


def _keys(ids: list[int], per_id: int) -> BlockKeys:
    content = PromptBlocks(tuple(ids), per_id)
    return block_keys(content, len(ids) * per_id, BLOCK)


def _held_run(tier: KvTier, keys: BlockKeys, start: int, limit: int) -> int:
    """The blocks from ``start`` the tier holds one after another, read without using them."""
    per, at = keys.blocks_per_unit, start
    while at < limit and at % per < tier.held(keys.unit(at // per)):
        at += 1
    return at - start


@settings(max_examples=80, deadline=None)
@given(
    st.sampled_from([BLOCK, 2 * BLOCK]),  # tokens per id: a block (a unit a block) or two
    st.integers(6, 24),  # GPU blocks
    st.integers(1, 10),  # host blocks
    st.integers(1, 20),  # shared blocks
    st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=6), min_size=1, max_size=25),
)
def test_blocks_move_between_the_tiers_without_loss_or_duplication(
    per_id: int, gpu: int, host: int, shared: int, prompts: list[list[int]]
) -> None:
    """Random prompts (ids that repeat, so prefixes are shared) run one after another through a
    small GPU pool with both tiers small: eviction at every level. Each tier holds exactly what
    was written through and not evicted; a lookup past the GPU hit finds, tier by tier, exactly
    the blocks each holds; what it found lands in the GPU's cache right after the hit (as much as
    fits), is taken by the request's admission and counted once, by the tier it came from; a
    request's freshly cached units are in both tiers."""
    bm = BlockManager(BLOCK, gpu, enable_prefix_caching=True)
    host_tier, shared_tier = KvTier("host", host), KvTier("shared", shared)
    tiers = KvTiers(host_tier, shared_tier)
    bm.tiers = tiers
    reference = {"host": ReferenceTier(host), "shared": ReferenceTier(shared)}
    for i, prompt in enumerate(prompts):
        keys, rid = _keys(prompt, per_id), str(i)
        tokens, per = len(keys) * BLOCK, keys.blocks_per_unit
        on_gpu = len(bm.match(keys, len(keys)))
        want_host = _held_run(host_tier, keys, on_gpu, len(keys))
        want_shared = _held_run(shared_tier, keys, on_gpu + want_host, len(keys))
        assert bm.tier_hits(keys, on_gpu, len(keys)) == (want_host, want_shared)
        assert _reference_lookup(reference["host"], keys, on_gpu) == want_host
        assert _reference_lookup(reference["shared"], keys, on_gpu + want_host) == want_shared
        bm.stage(rid, keys, (on_gpu, on_gpu + want_host, on_gpu + want_host + want_shared))
        landed = bm.land_staged(rid)
        hit = bm.match(keys, len(keys))
        assert landed <= want_host + want_shared and len(hit) >= on_gpu + landed
        _written(reference, keys, on_gpu, on_gpu + landed)
        need = bm.blocks_for(tokens) - len(hit) + bm.num_evictable(hit)
        if not bm.can_allocate(need):
            bm.free(rid)  # not admitted: what landed stays cached, counted for no one
            continue
        counted = sum(tiers.num_hit_blocks)
        if hit:
            bm.take_cached(rid, hit)
        assert sum(tiers.num_hit_blocks) == counted + landed  # all it landed, once
        bm.allocate(rid, tokens)
        bm.cache_blocks(rid, keys, tokens)
        _written(reference, keys, len(hit), len(keys))
        bm.free(rid)
        assert bm.num_used_blocks == 0 and bm.num_free_blocks == gpu  # every GPU block back
        for tier in (host_tier, shared_tier):
            ref = reference[tier.name]
            assert tier.units() == list(ref.units.items())
            assert tier.num_used_blocks == sum(n for _, n in tier.units()) <= tier.num_blocks
            assert tier.num_stored_blocks == tier.num_used_blocks + tier.num_evicted_blocks
            if len(hit) < len(keys):  # this request wrote its last unit through: the newest
                assert tier.units()[-1][0] == keys.unit((len(keys) - 1) // per)


def _written(reference: dict[str, ReferenceTier], keys: BlockKeys, lo: int, hi: int) -> None:
    """Write-through as the reference sees it: blocks ``lo``..``hi - 1`` newly cached, each unit
    they touch stored with its blocks before ``hi``."""
    per = keys.blocks_per_unit
    for j in range(lo // per, (hi - 1) // per + 1 if lo < hi else 0):
        for ref in reference.values():
            ref.store(keys.unit(j), min(hi, (j + 1) * per) - j * per)


def _reference_lookup(reference: ReferenceTier, keys: BlockKeys, start: int) -> int:
    """A lookup block by block: each unit looked at becomes the most recently used, until a
    block its unit does not hold."""
    per, at, last, held = keys.blocks_per_unit, start, None, 0
    while at < len(keys):
        key = keys.unit(at // per)
        if key != last:
            held, last = reference.use(key), key
        if at % per >= held:
            break
        at += 1
    return at - start


def test_a_prompt_evicted_from_the_gpu_is_found_in_the_host_tier_then_the_shared_store() -> None:
    bm = BlockManager(BLOCK, 4, enable_prefix_caching=True)
    host, shared = KvTier("host", 2), KvTier("shared", 8)
    bm.tiers = KvTiers(host, shared)
    keys = _keys([1, 2, 3, 4], BLOCK)  # four blocks
    bm.allocate("a", 16)
    bm.cache_blocks("a", keys, 16)
    bm.free("a")
    other = _keys([9, 9, 9, 9], BLOCK)
    bm.allocate("b", 16)  # evicts every block of a from the GPU; its own are written through
    bm.cache_blocks("b", other, 16)
    assert bm.match(keys, 4) == []
    assert host.units() == [(other.unit(2), 1), (other.unit(3), 1)]
    assert bm.tier_hits(keys, 0, 4) == (0, 4)  # the host tier kept only b's last two blocks
    bm.free("b")
    assert bm.tier_hits(other, 0, 4) == (0, 4)  # b's first blocks: from the shared store
    assert bm.tier_hits(other, 2, 4) == (2, 0)  # past a GPU hit of two: the host tier's
    assert bm.tier_hits(other, 1, 3) == (0, 2)  # at most the limit, only one after another


def test_without_tiers_the_block_manager_finds_nothing_below_the_gpu() -> None:
    bm = BlockManager(BLOCK, 4, enable_prefix_caching=True)
    keys = _keys([1, 2], BLOCK)
    bm.allocate("a", 8)
    bm.cache_blocks("a", keys, 8)
    assert bm.tier_hits(keys, 0, 2) == (0, 0)


def _evicted_prompt(gpu: int, host: int, shared: int) -> tuple[BlockManager, KvTiers, BlockKeys]:
    """A six-block prompt cached, freed, then evicted from the GPU by another prompt's blocks."""
    bm = BlockManager(BLOCK, gpu, enable_prefix_caching=True)
    tiers = KvTiers(KvTier("host", host), KvTier("shared", shared))
    bm.tiers = tiers
    keys = _keys([1, 2, 3, 4, 5, 6], BLOCK)
    bm.allocate("a", 24)
    bm.cache_blocks("a", keys, 24)
    bm.free("a")
    bm.allocate("b", gpu * BLOCK)
    bm.cache_blocks("b", _keys([9] * gpu, BLOCK), gpu * BLOCK)
    bm.free("b")
    assert bm.match(keys, 6) == []
    return bm, tiers, keys


def test_loaded_blocks_land_after_the_gpu_hit_and_count_by_tier_when_admitted() -> None:
    bm, tiers, keys = _evicted_prompt(gpu=8, host=8, shared=16)
    # b's eight blocks took the whole host tier; the store kept a's six
    assert bm.tier_hits(keys, 0, 6) == (0, 6)
    bm.stage("c", keys, (0, 0, 6))
    assert bm.land_staged("c") == 6 and len(bm.match(keys, 6)) == 6
    assert bm.num_free_blocks == 8  # landed blocks are cached and evictable until taken
    bm.take_cached("c", bm.match(keys, 4))  # admitted with a hit of four of them
    assert tiers.num_hit_blocks == [0, 4]
    assert bm.land_staged("c") == 0  # counted once: admitted, nothing is staged any more


def test_loaded_blocks_land_only_after_a_hit_that_still_reaches_them_and_where_there_is_room() -> None:
    bm, tiers, keys = _evicted_prompt(gpu=8, host=8, shared=16)
    bm.stage("c", keys, (2, 4, 6))  # loaded past a hit of two blocks the GPU no longer holds
    assert bm.land_staged("c") == 0 and bm.match(keys, 6) == []
    bm.allocate("held", 5 * BLOCK)  # five blocks in use: three free
    bm.stage("d", keys, (0, 2, 6))
    assert bm.land_staged("d", reserve=1) == 2  # two fit above the reserve
    bm.take_cached("d", bm.match(keys, 6))
    assert tiers.num_hit_blocks == [2, 0]  # both from before the split: the host tier's
    bm.free("d")
    bm.stage("e", keys, (0, 2, 6))
    bm.free("e")  # gone before it was admitted: nothing stays staged
    assert bm.land_staged("e") == 0
