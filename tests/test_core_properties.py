"""Property tests of the scheduler over random workloads under memory pressure."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from stallfree.core import CacheConfig, Request, Scheduler, SchedulerConfig, StepPlan, make_policy
from stallfree.core.scheduler import StepEvents
from tests.factories import assert_stall_free, run_on_step_counter
from tests.strategies import policy_cases

BLOCK = 4


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[str, dict[str, int], SchedulerConfig, CacheConfig, list[Request]]:
    policy, kw, config = draw(policy_cases())
    config = dataclasses.replace(
        config, scheduling_policy=draw(st.sampled_from(["fcfs", "priority", "sglang-priority"]))
    )
    num_blocks = draw(st.integers(8, 64))
    reqs = [
        Request(
            str(i),
            draw(st.integers(1, 80)),
            draw(st.integers(1, 20)),
            draw(st.floats(0, 10)),
            priority=draw(st.integers(0, 3)),
        )
        for i in range(draw(st.integers(1, 12)))
    ]
    cache = CacheConfig(block_size=BLOCK, num_blocks=num_blocks, watermark=draw(st.sampled_from([0.0, 0.1])))
    return policy, kw, config, cache, reqs


def drive(
    policy: str, kw: dict[str, int], cfg: SchedulerConfig, cache: CacheConfig, reqs: list[Request]
) -> tuple[Scheduler, list[StepPlan], list[StepEvents], dict[str, str]]:
    """Replay arrivals on a step counter (one step = 1 s); check invariants every step."""
    sched = Scheduler(cfg, cache, make_policy(policy, **kw))
    plans: list[StepPlan] = []

    def check(plan: StepPlan, decoding: set[str]) -> None:
        check_budget(plan, policy, kw, cfg)
        bm = sched.block_manager
        assert bm.num_blocks is not None and bm.num_used_blocks <= bm.num_blocks
        if policy == "chunked":
            assert_stall_free(plan, decoding)
        plans.append(plan)

    events, rejected = run_on_step_counter(sched, reqs, check)
    return sched, plans, events, rejected


def check_budget(plan: StepPlan, policy: str, kw: dict[str, int], cfg: SchedulerConfig) -> None:
    assert len(plan.chunks) <= cfg.max_num_seqs
    if "token_budget" in kw and policy == "chunked":
        assert plan.num_tokens <= kw["token_budget"]
    if "chunk_tokens" in kw:
        assert plan.num_prefill_tokens <= kw["chunk_tokens"]
    if policy != "chunked" and "token_budget" in kw and len(plan.chunks) > 1 and plan.num_decode_tokens == 0:
        assert plan.num_tokens <= kw["token_budget"]  # several whole prompts batched only under the cap


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_every_request_finishes_or_is_rejected_and_no_block_leaks(
    case: tuple[str, dict[str, int], SchedulerConfig, CacheConfig, list[Request]],
) -> None:
    sched, _, events, rejected = drive(*case)
    reqs = case[-1]
    produced: dict[str, int] = {}
    for ev in events:
        for rid in ev.new_token_request_ids:
            produced[rid] = produced.get(rid, 0) + 1
    finished = {rid for ev in events for rid, _ in ev.finished}
    for r in reqs:
        if r.request_id in rejected:
            assert r.request_id not in produced
        else:
            assert r.request_id in finished
            assert produced[r.request_id] == r.max_tokens
    assert sched.block_manager.num_used_blocks == 0
    assert not sched.has_unfinished_requests()


@settings(max_examples=40, deadline=None)
@given(scenarios())
def test_same_input_same_plans(
    case: tuple[str, dict[str, int], SchedulerConfig, CacheConfig, list[Request]],
) -> None:
    _, plans_a, _, _ = drive(*case)
    _, plans_b, _, _ = drive(*case)
    assert plans_a == plans_b


@settings(max_examples=60, deadline=None)
@given(scenarios())
def test_prefill_chunks_continue_where_the_last_one_stopped(
    case: tuple[str, dict[str, int], SchedulerConfig, CacheConfig, list[Request]],
) -> None:
    """Each chunk starts at the request's computed tokens: 0 after a preemption, else
    where its previous chunk ended; KV blocks added always cover the chunk."""
    _, plans, _, _ = drive(*case)
    computed: dict[str, int] = {}
    blocks: dict[str, int] = {}
    for plan in plans:
        for rid in plan.freed_request_ids:
            computed.pop(rid, None)
            blocks.pop(rid, None)
        for rid, new in plan.new_block_ids.items():
            blocks[rid] = blocks.get(rid, 0) + len(new)
        for c in plan.chunks:
            assert c.num_computed_tokens == computed.get(c.request_id, 0)
            computed[c.request_id] = c.context_len
            assert blocks.get(c.request_id, 0) * BLOCK >= c.context_len
