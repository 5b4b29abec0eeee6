"""The prefix cache in the core's block manager: keys, hits, eviction, and what the scheduler
does with them (property tests under memory pressure, over every policy)."""

from __future__ import annotations

import random

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from stallfree.core import (
    CacheConfig,
    PromptBlocks,
    Request,
    Scheduler,
    SchedulerConfig,
    StepPlan,
    StepResult,
    make_policy,
)
from stallfree.core.block_manager import BlockKeys, BlockManager, block_keys
from tests.factories import run_on_step_counter
from tests.reference_block_manager import ReferenceBlockManager
from tests.strategies import policy_cases

BLOCK = 4


def tokens_request(rid: str, tokens: list[int], max_tokens: int = 2, arrival_s: float = 0.0) -> Request:
    return Request(rid, len(tokens), max_tokens, arrival_s, prompt_blocks=PromptBlocks(tuple(tokens)))


def caching_scheduler(num_blocks: int | None = 64, budget: int = 64, **kw: int) -> Scheduler:
    return Scheduler(
        SchedulerConfig(max_num_seqs=kw.pop("max_num_seqs", 8)),
        CacheConfig(block_size=BLOCK, num_blocks=num_blocks, watermark=0.0, enable_prefix_caching=True),
        make_policy("chunked", token_budget=budget),
    )


def run_one_step(sched: Scheduler) -> StepPlan:
    plan = sched.schedule()
    sched.update_from_output(plan, StepResult(1.0))
    return plan


def test_keys_chain_the_prefix() -> None:
    a = block_keys(PromptBlocks(tuple(range(10))), 10, BLOCK).to_list()
    b = block_keys(PromptBlocks((0, 1, 2, 3, 4, 5, 6, 99, 8, 9)), 10, BLOCK).to_list()
    assert len(a) == 2  # full blocks only
    assert a[0] == b[0] and a[1] != b[1]
    # The same block after a different prefix is a different key.
    c = block_keys(PromptBlocks((9, 9, 9, 9, 4, 5, 6, 7)), 8, BLOCK).to_list()
    assert c[1] != a[1]


def test_coarse_hash_ids_key_every_sub_block() -> None:
    """Mooncake's 512-token hash ids give 16-token blocks keyed by (id, offset), chained."""
    a = block_keys(PromptBlocks((7, 8), tokens_per_id=512), 1000, 16).to_list()
    b = block_keys(PromptBlocks((7, 9), tokens_per_id=512), 1024, 16).to_list()
    assert len(a) == 1000 // 16 and len(b) == 64
    assert a[:32] == b[:32] and a[32] != b[32]
    assert len(set(a)) == len(a)
    with pytest.raises(ValueError, match="one must divide the other"):
        block_keys(PromptBlocks((1,), tokens_per_id=24), 24, 16)


def test_a_repeated_prefix_is_not_computed_again_and_costs_no_budget() -> None:
    sched = caching_scheduler(budget=64)
    shared = list(range(100, 120))  # 5 full blocks
    sched.add_request(tokens_request("a", [*shared, 1, 2, 3]))
    first = run_one_step(sched)
    assert [(c.num_computed_tokens, c.num_tokens) for c in first.chunks] == [(0, 23)]
    sched.add_request(tokens_request("b", [*shared, 4, 5]))
    plan = sched.schedule()
    chunk_b = next(c for c in plan.chunks if c.request_id == "b")
    assert (chunk_b.num_computed_tokens, chunk_b.num_tokens) == (20, 2)
    # b's first chunk is marked as starting after a hit (a server may take longer over it); a's
    # first chunk found nothing, and no later chunk is a first one
    assert chunk_b.after_cache_hit and not first.chunks[0].after_cache_hit
    assert not any(c.after_cache_hit for c in plan.chunks if c.request_id == "a")
    # b's table starts with a's five blocks, then one of its own.
    assert plan.new_block_ids["b"][:5] == sched.block_manager.block_table("a")[:5]
    assert len(plan.new_block_ids["b"]) == 6
    assert sched.state.num_prefix_hit_tokens == 20
    assert sched.state.num_prefix_queried_tokens == 23 + 22


def test_the_last_prompt_token_always_runs() -> None:
    """An identical prompt of whole blocks hits all but its last block: the last token's logits
    are needed to sample."""
    sched = caching_scheduler()
    prompt = list(range(16))
    sched.add_request(tokens_request("a", prompt))
    run_one_step(sched)
    sched.add_request(tokens_request("b", prompt))
    chunk = next(c for c in sched.schedule().chunks if c.request_id == "b")
    assert (chunk.num_computed_tokens, chunk.num_tokens) == (12, 4)


def test_named_output_tokens_are_cached_once_computed() -> None:
    """A session's next turn repeats the last answer: with the answer's ids named, the blocks its
    decodes filled are hits too (all but the last sampled token, whose KV is never computed)."""
    sched = caching_scheduler()
    prompt, answer = list(range(8)), list(range(50, 58))
    sched.add_request(Request("turn-1", 8, 8, prompt_blocks=PromptBlocks(tuple(prompt + answer))))
    while sched.has_unfinished_requests():
        run_one_step(sched)
    sched.add_request(tokens_request("turn-2", [*prompt, *answer, 99, 98]))
    chunk = sched.schedule().chunks[0]
    assert (chunk.num_computed_tokens, chunk.num_tokens) == (12, 6)


def test_sampled_tokens_key_the_blocks_they_fill() -> None:
    """An engine's request names only its prompt; the tokens its executor samples key the blocks
    they fill, so the next turn (prompt + this answer + a new message) hits them as above."""
    sched = caching_scheduler()
    prompt, answer = list(range(6)), list(range(50, 58))  # the prompt's last block is partial
    sched.add_request(tokens_request("turn-1", prompt, max_tokens=8))
    sampled = iter(answer)
    while sched.has_unfinished_requests():
        plan = sched.schedule()
        tokens = {c.request_id: next(sampled) for c in plan.chunks if c.emits_token}
        sched.update_from_output(plan, StepResult(1.0, tokens))
    sched.add_request(tokens_request("turn-2", [*prompt, *answer, 99, 98]))
    chunk = sched.schedule().chunks[0]
    # blocks 0-2 (the prompt and answer tokens 0-5) were computed; the last sampled token never ran
    assert (chunk.num_computed_tokens, chunk.num_tokens) == (12, 4)


def test_freed_cached_blocks_are_free_until_evicted_lru() -> None:
    bm = BlockManager(BLOCK, 4, enable_prefix_caching=True)
    keys = block_keys(PromptBlocks(tuple(range(8))), 8, BLOCK)
    bm.allocate("a", 8)
    bm.cache_blocks("a", keys, 8)
    bm.free("a")
    assert (bm.num_free_blocks, bm.num_used_blocks, bm.num_cached_blocks) == (4, 0, 2)
    hits = bm.match(keys, 2)
    assert len(hits) == 2 and bm.num_evictable(hits) == 2
    # Three fresh blocks: the two never used, then a's tail block (freed first of its two).
    bm.allocate("b", 12)
    assert bm.num_cached_blocks == 1
    assert bm.match(keys, 2) == hits[:1]
    bm.take_cached("c", hits[:1])
    assert (bm.num_free_blocks, bm.num_used_blocks) == (0, 4)
    bm.free("c")
    bm.free("b")
    assert (bm.num_free_blocks, bm.num_used_blocks) == (4, 0)


def test_two_requests_share_a_block_until_both_free_it() -> None:
    bm = BlockManager(BLOCK, 8, enable_prefix_caching=True)
    keys = block_keys(PromptBlocks(tuple(range(4))), 4, BLOCK)
    bm.allocate("a", 5)
    bm.cache_blocks("a", keys, 5)
    bm.take_cached("b", bm.match(keys, 1))
    assert bm.num_used_blocks == 2
    bm.free("a")
    assert bm.num_used_blocks == 1 and bm.num_evictable(bm.match(keys, 1)) == 0
    bm.free("b")
    assert bm.num_used_blocks == 0 and bm.num_evictable(bm.match(keys, 1)) == 1


def test_a_preempted_request_restarts_from_what_is_still_cached() -> None:
    """Five blocks: b's first decode needs a sixth, so b preempts itself; a finishes within its
    three blocks, so b's two prompt blocks are still cached and its recompute starts after them."""
    sched = caching_scheduler(num_blocks=5, budget=16, max_num_seqs=2)
    sched.add_request(tokens_request("a", list(range(8)), max_tokens=4))
    sched.add_request(tokens_request("b", list(range(50, 58)), max_tokens=12))
    preempted = None
    for _ in range(20):
        plan = run_one_step(sched)
        if plan.preempted_request_ids:
            preempted = plan.preempted_request_ids
            break
    assert preempted == ("b",)
    assert sched.block_manager.num_cached_blocks == 4
    for _ in range(40):
        plan = run_one_step(sched)
        chunk = next((c for c in plan.chunks if c.request_id == "b"), None)
        if chunk is not None:
            assert chunk.num_computed_tokens == 8  # its two prompt blocks, still cached
            break
    else:
        raise AssertionError("b never ran again")


# -- properties -------------------------------------------------------------------------------


@st.composite
def shared_prefix_cases(
    draw: st.DrawFn, repeats: bool = True
) -> tuple[str, dict[str, int], SchedulerConfig, int, list[Request]]:
    """Requests whose token ids start with one of a few shared sequences (or, without
    ``repeats``, never share a token), arriving over ten steps, under a small KV pool. Half of them
    name their output tokens too (as a multi-turn session's workload knows its answers), so one
    request's prompt may be another's prompt and output."""
    policy, kw, config = draw(policy_cases())
    shared = [list(range(1000 * p, 1000 * p + draw(st.integers(0, 40)))) for p in range(1, 4)]
    reqs = []
    for i in range(draw(st.integers(1, 10))):
        unique = [100_000 * (i + 1) + j for j in range(60)]
        tokens = [*draw(st.sampled_from(shared)), *unique] if repeats else unique
        num_prompt, max_tokens = draw(st.integers(1, 30)), draw(st.integers(1, 12))
        named = num_prompt + max_tokens if draw(st.booleans()) else num_prompt
        request = Request(
            str(i),
            num_prompt,
            max_tokens,
            draw(st.floats(0, 10)),
            prompt_blocks=PromptBlocks(tuple(tokens[:named])),
        )
        reqs.append(request)
    return policy, kw, config, draw(st.integers(12, 48)), reqs


def drive(
    policy: str,
    kw: dict[str, int],
    config: SchedulerConfig,
    num_blocks: int,
    reqs: list[Request],
    caching: bool,
) -> tuple[Scheduler, list[StepPlan]]:
    """Replay on a step counter, writing each chunk's token ids into a fake KV store through the
    plan's block tables (as the engine does) and checking that every chunk's earlier context
    holds exactly its own tokens: a cache hit that is not the same prefix fails here."""
    cache = CacheConfig(block_size=BLOCK, num_blocks=num_blocks, watermark=0.0, enable_prefix_caching=caching)
    sched = Scheduler(config, cache, make_policy(policy, **kw))
    prompts = {r.request_id: r.prompt_blocks.ids for r in reqs if r.prompt_blocks is not None}
    tables: dict[str, list[int]] = {}
    kv: dict[int, int] = {}  # slot -> token id written there
    plans: list[StepPlan] = []

    def token(rid: str, pos: int) -> int:
        named = prompts[rid]
        return named[pos] if pos < len(named) else -(pos + 1)  # generated, unnamed: never cached

    def check(plan: StepPlan, decoding: set[str]) -> None:
        bm = sched.block_manager
        assert bm.num_blocks is not None and bm.num_used_blocks <= bm.num_blocks
        assert (bm.num_free_blocks or 0) + bm.num_used_blocks == bm.num_blocks
        for rid in plan.freed_request_ids:
            tables.pop(rid, None)
        for rid, new in plan.new_block_ids.items():
            tables.setdefault(rid, []).extend(new)
        for c in plan.chunks:
            for pos in range(c.num_computed_tokens, c.context_len):
                kv[tables[c.request_id][pos // BLOCK] * BLOCK + pos % BLOCK] = token(c.request_id, pos)
        for c in plan.chunks:
            assert c.num_computed_tokens < c.num_known_tokens  # the last known token always runs
            for pos in range(c.context_len):
                assert kv[tables[c.request_id][pos // BLOCK] * BLOCK + pos % BLOCK] == token(
                    c.request_id, pos
                )
        plans.append(plan)

    run_on_step_counter(sched, reqs, check)
    assert sched.block_manager.num_used_blocks == 0 and not sched.has_unfinished_requests()
    assert sched.state.num_prefix_hit_tokens <= sched.state.num_prefix_queried_tokens
    return sched, plans


@settings(max_examples=150, deadline=None)
@given(shared_prefix_cases())
def test_hits_are_true_prefixes_and_blocks_stay_within_the_pool(
    case: tuple[str, dict[str, int], SchedulerConfig, int, list[Request]],
) -> None:
    drive(*case, caching=True)


@settings(max_examples=100, deadline=None)
@given(shared_prefix_cases(repeats=False))
def test_without_repeats_caching_changes_no_plan(
    case: tuple[str, dict[str, int], SchedulerConfig, int, list[Request]],
) -> None:
    """Nothing repeats (a preempted request's recompute repeats its own prompt, so none is
    preempted): the same chunks and block counts as without the cache."""
    _, plain = drive(*case, caching=False)
    assume(not any(p.preempted_request_ids for p in plain))
    _, cached = drive(*case, caching=True)
    assert [(p.chunks, p.preempted_request_ids) for p in cached] == [
        (p.chunks, p.preempted_request_ids) for p in plain
    ]
    assert [{r: len(b) for r, b in p.new_block_ids.items()} for p in cached] == [
        {r: len(b) for r, b in p.new_block_ids.items()} for p in plain
    ]


@settings(max_examples=100, deadline=None)
@given(shared_prefix_cases())
def test_caching_never_computes_more_prompt_tokens(
    case: tuple[str, dict[str, int], SchedulerConfig, int, list[Request]],
) -> None:
    """With a pool large enough that nothing is preempted, the cache only removes work."""
    policy, kw, config, _, reqs = case
    big = sum(r.num_prompt_tokens + r.max_tokens for r in reqs)
    _, cached = drive(policy, kw, config, big, reqs, caching=True)
    _, plain = drive(policy, kw, config, big, reqs, caching=False)
    assert sum(p.num_tokens for p in cached) <= sum(p.num_tokens for p in plain)


def _same(run: BlockManager, ref: ReferenceBlockManager, op: str, *args: object) -> object:
    """``op`` on both, the same answer and counts (the reference takes keys as a list)."""
    ref_args = [a.to_list() if isinstance(a, BlockKeys) else a for a in args]
    got, want = getattr(run, op)(*args), getattr(ref, op)(*ref_args)
    assert got == want, (op, args)
    state = (run.num_free_blocks, run.num_used_blocks, run.num_cached_blocks)
    assert state == (ref.num_free_blocks, ref.num_used_blocks, ref.num_cached_blocks), op
    return got


@pytest.mark.parametrize("seed", range(150))
def test_runs_of_blocks_behave_as_a_block_at_a_time(seed: int) -> None:
    """The block manager keeps runs of blocks; the reference one block at a time. Random requests
    sharing prefixes (of a 3-token alphabet, so chains meet and part) are admitted on their hits
    (or a prefix of them), computed in random chunks, preempted when short of blocks, and
    freed: every answer (block ids, hits, counts) is the reference's."""
    rng = random.Random(seed)
    block_size = rng.choice([1, 2, 4])
    num_blocks = rng.choice([None, 8, 16, 40])
    run = BlockManager(block_size, num_blocks, enable_prefix_caching=True)
    ref = ReferenceBlockManager(block_size, num_blocks, enable_prefix_caching=True)
    prefixes = [[rng.randrange(3) for _ in range(rng.randrange(30))] for _ in range(4)]
    live: dict[str, tuple[tuple[int, ...], int]] = {}  # request -> (its keys, its tokens)
    computed: dict[str, int] = {}
    for n in range(250):
        op = rng.random()
        if op < 0.3 and len(live) < 8:
            rid = f"r{n}"
            tokens = rng.choice(prefixes)[: rng.randrange(31)] + [
                rng.randrange(3) for _ in range(rng.randrange(1, 20))
            ]
            keys = block_keys(PromptBlocks(tuple(tokens)), len(tokens), block_size)
            hits = _same(run, ref, "match", keys, (len(tokens) - 1) // block_size)
            assert isinstance(hits, list)
            if hits and rng.random() < 0.3:
                hits = hits[: rng.randrange(1, len(hits) + 1)]
            need = run.blocks_for(len(tokens)) - len(hits) + _same(run, ref, "num_evictable", hits)  # type: ignore[operator]
            if _same(run, ref, "can_allocate", need):
                if hits:
                    _same(run, ref, "take_cached", rid, hits)
                live[rid], computed[rid] = (keys, len(tokens)), len(hits) * block_size
        elif op < 0.75 and live:
            rid = rng.choice(sorted(live))
            keys, total = live[rid]
            target = min(total, computed[rid] + rng.randrange(1, 12))
            if _same(run, ref, "can_allocate", run.num_new_blocks(rid, target)):
                _same(run, ref, "allocate", rid, target)
                _same(run, ref, "cache_blocks", rid, keys, target)
                computed[rid] = target
            else:  # preempted
                _same(run, ref, "free", rid)
                del live[rid]
        elif live:
            rid = rng.choice(sorted(live))
            _same(run, ref, "free", rid)
            del live[rid]
    for rid in live:
        _same(run, ref, "free", rid)
    assert run.num_used_blocks == 0
