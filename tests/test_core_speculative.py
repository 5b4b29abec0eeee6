"""Speculative decoding in the scheduler: drafts in the plan under vLLM's and SGLang's rules,
verification results applied, the KV slots of rejected drafts released."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stallfree.core import CacheConfig, Request, Scheduler, SchedulerConfig, StepPlan, StepResult, make_policy
from stallfree.core.serving import ServingConfig
from tests.factories import assert_stall_free, make_scheduler, run_on_step_counter


def proposing(num_drafts: int, accept: dict[str, int] | None = None):  # type: ignore[no-untyped-def]
    """An executor that proposes ``num_drafts`` drafts for every request that got a token and
    accepts ``accept[rid]`` (default: all) of each request's drafts."""

    def execute(plan: StepPlan) -> StepResult:
        accepted = {
            c.request_id: min(c.num_draft_tokens, (accept or {}).get(c.request_id, c.num_draft_tokens))
            for c in plan.chunks
            if c.num_draft_tokens
        }
        proposed = {c.request_id: num_drafts for c in plan.chunks if c.emits_token}
        return StepResult(1.0, num_accepted_drafts=accepted, num_proposed_drafts=proposed)

    return execute


def decoding_streams(sched: Scheduler, n: int, *, prompt: int = 8, max_tokens: int = 1000) -> None:
    """``n`` streams past their prompts, each with drafts proposed for its next step."""
    for i in range(n):
        sched.add_request(Request(f"s{i}", prompt, max_tokens))
    while any(not s.is_decoding for s in sched.running) or sched.num_waiting:
        plan = sched.schedule()
        sched.update_from_output(plan, proposing(0)(plan))
    plan = sched.schedule()  # one plain decode step, whose executor proposes 4 drafts each
    sched.update_from_output(plan, proposing(4)(plan))


def test_vllm_rule_drafts_take_the_budget_before_the_prompt_chunk() -> None:
    # The arithmetic: 16 streams at a ~200-token ridge, 4 drafts each leave 120 for the prompt.
    sched = make_scheduler(token_budget=200, max_num_seqs=32, num_speculative_tokens=4)
    decoding_streams(sched, 16)
    sched.add_request(Request("long", 4000, 10))
    plan = sched.schedule()
    plan.validate()
    drafts = {c.request_id: c.num_draft_tokens for c in plan.chunks if c.is_decoding}
    assert drafts == {f"s{i}": 4 for i in range(16)}
    (prompt,) = [c for c in plan.chunks if c.request_id == "long"]
    assert prompt.num_tokens == 200 - 16 * 5 == 120 and plan.num_tokens == 200


def test_vllm_rule_short_budget_drafts_go_to_the_oldest_streams_and_every_stream_keeps_its_token() -> None:
    sched = make_scheduler(token_budget=20, max_num_seqs=8, num_speculative_tokens=4)
    decoding_streams(sched, 8)
    plan = sched.schedule()
    assert_stall_free(plan, {f"s{i}" for i in range(8)})
    assert [c.num_draft_tokens for c in plan.chunks] == [4, 4, 4, 0, 0, 0, 0, 0]
    assert plan.num_tokens == 20


def test_sglang_rule_runs_prompts_alone_and_drafts_uncapped_otherwise() -> None:
    sched = make_scheduler(
        token_budget=64, max_num_seqs=32, num_speculative_tokens=4, speculative_rule="sglang"
    )
    decoding_streams(sched, 16)
    sched.add_request(Request("long", 100, 10))
    step = proposing(4)
    plans = []
    while True:
        plan = sched.schedule()
        plans.append(plan)
        sched.update_from_output(plan, step(plan))
        if any(c.request_id == "long" and c.emits_token for c in plan.chunks):
            break
    # The prompt's two chunks run back to back with no decode beside them: the streams stall.
    assert [[(c.request_id, c.num_tokens) for c in p.chunks] for p in plans] == [
        [("long", 64)],
        [("long", 36)],
    ]
    plan = sched.schedule()  # then every stream (the new one too) verifies all its drafts, past the budget
    assert {c.num_draft_tokens for c in plan.chunks} == {4} and plan.num_tokens == 17 * 5 > 64


def test_accepted_drafts_become_output_and_rejected_slots_are_released() -> None:
    sched = make_scheduler(
        token_budget=64, max_num_seqs=8, num_blocks=40, block_size=4, num_speculative_tokens=4
    )
    decoding_streams(sched, 2, prompt=7, max_tokens=50)
    s0, s1 = sched.running
    before = {s.request_id: (s.num_computed_tokens, s.num_output_tokens) for s in (s0, s1)}
    plan = sched.schedule()
    assert [(c.num_tokens, c.num_draft_tokens) for c in plan.chunks] == [(5, 4), (5, 4)]
    # s0: 3 of 4 accepted; s1: none: it keeps its one token, its draft slots go back.
    events = sched.update_from_output(plan, proposing(2, {"s0": 3, "s1": 0})(plan))
    assert dict(events.num_accepted_drafts) == {"s0": 3}
    assert (s0.num_computed_tokens, s0.num_output_tokens) == (before["s0"][0] + 4, before["s0"][1] + 4)
    assert (s1.num_computed_tokens, s1.num_output_tokens) == (before["s1"][0] + 1, before["s1"][1] + 1)
    bm = sched.block_manager
    for s in (s0, s1):
        assert len(bm.block_table(s.request_id)) == bm.blocks_for(s.num_computed_tokens)
    assert bm.num_used_blocks == sum(bm.blocks_for(s.num_computed_tokens) for s in (s0, s1))
    nxt = sched.schedule()
    # Executors learn which tables shrank; the new proposals (2 each) are what runs next.
    assert set(nxt.trimmed_block_tables) <= {"s0", "s1"} and "s1" in nxt.trimmed_block_tables
    assert [c.num_draft_tokens for c in nxt.chunks] == [2, 2]


def test_drafts_stop_short_of_max_tokens() -> None:
    sched = make_scheduler(token_budget=64, max_num_seqs=8, num_speculative_tokens=4)
    decoding_streams(sched, 1, max_tokens=4)  # two tokens so far (the prompt's and a decode), two to go
    plan = sched.schedule()
    assert plan.chunks[0].num_draft_tokens == 1  # the second token may be a draft, the last is not
    events = sched.update_from_output(plan, proposing(4)(plan))
    assert events.finished and sched.num_running == 0


def test_speculation_is_refused_where_it_cannot_work() -> None:
    with pytest.raises(ValueError, match="chunked policy only"):
        ServingConfig(policy="prefill-first", num_speculative_tokens=2)
    with pytest.raises(ValueError, match="unknown speculative rule"):
        ServingConfig(num_speculative_tokens=2, speculative_rule="trt")
    with pytest.raises(ValueError, match="does not combine"):
        ServingConfig(num_speculative_tokens=2, step_budget_ms=50)
    with pytest.raises(ValueError, match="accepted"):
        sched = make_scheduler(token_budget=64, max_num_seqs=8, num_speculative_tokens=2)
        decoding_streams(sched, 1)
        plan = sched.schedule()
        sched.update_from_output(plan, StepResult(1.0, num_accepted_drafts={"s0": 3}))


@settings(max_examples=150, deadline=None)
@given(
    rule=st.sampled_from(["vllm", "sglang"]),
    k=st.integers(1, 5),
    budget=st.integers(8, 64),
    num_blocks=st.integers(12, 48),
    seed=st.integers(0, 2**32),
    lengths=st.lists(
        st.tuples(st.integers(1, 60), st.integers(1, 30), st.floats(0, 10)), min_size=1, max_size=10
    ),
)
def test_every_request_finishes_and_no_block_leaks_whatever_is_accepted(
    rule: str, k: int, budget: int, num_blocks: int, seed: int, lengths: list[tuple[int, int, float]]
) -> None:
    config = SchedulerConfig(max_num_seqs=min(8, budget))
    sched = Scheduler(
        config,
        CacheConfig(block_size=4, num_blocks=num_blocks),
        make_policy("chunked", token_budget=budget, num_speculative_tokens=k, speculative_rule=rule),
    )
    rng = random.Random(seed)
    reqs = [Request(str(i), p, m, t) for i, (p, m, t) in enumerate(lengths)]

    def execute(plan: StepPlan) -> StepResult:
        accepted = {
            c.request_id: rng.randint(0, c.num_draft_tokens) for c in plan.chunks if c.num_draft_tokens
        }
        proposed = {c.request_id: rng.randint(0, k + 2) for c in plan.chunks if c.emits_token}
        return StepResult(1.0, num_accepted_drafts=accepted, num_proposed_drafts=proposed)

    def check(plan: StepPlan, decoding: set[str]) -> None:
        bm = sched.block_manager
        assert bm.num_blocks is not None and bm.num_used_blocks <= bm.num_blocks
        assert all(c.num_draft_tokens <= k for c in plan.chunks)
        if rule == "vllm":
            assert plan.num_tokens <= budget
            assert_stall_free(plan, decoding)
        elif plan.num_draft_tokens:
            assert all(c.is_decoding for c in plan.chunks)  # no prompt chunk beside drafts

    events, rejected = run_on_step_counter(sched, reqs, check, executor=execute)
    tokens: dict[str, int] = {}
    for ev in events:
        for rid in ev.new_token_request_ids:
            tokens[rid] = tokens.get(rid, 0) + 1 + ev.num_accepted_drafts.get(rid, 0)
    for r in reqs:
        assert r.request_id in rejected or tokens[r.request_id] == r.max_tokens
    assert sched.block_manager.num_used_blocks == 0 and not sched.has_unfinished_requests()
