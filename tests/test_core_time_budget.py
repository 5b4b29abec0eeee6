"""Chunks sized by time: the chunked policy's step-time target, StepContext.preview, the guards."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stallfree.core import (
    CacheConfig,
    ChunkedPolicy,
    Request,
    ScheduledChunk,
    Scheduler,
    SchedulerConfig,
    ServingConfig,
    Steadiness,
    StepPlan,
    make_policy,
)
from stallfree.core.context import StepContext
from stallfree.core.time_budget import CHUNK_GRANULE, MIN_CHUNK_TOKENS
from tests.factories import assert_stall_free, make_scheduler, one_second, run_on_step_counter


class Linear:
    """A predictor: fixed + per token + per decode + per query-key pair (attention grows with context)."""

    def __init__(
        self, fixed: float = 1.0, token: float = 0.01, decode: float = 0.05, key: float = 0.0
    ) -> None:
        self.fixed, self.token, self.decode, self.key = fixed, token, decode, key
        self.calls = 0

    def __call__(self, plan: StepPlan) -> float:
        self.calls += 1
        if not plan.chunks:
            return 0.0
        t = self.fixed
        for c in plan.chunks:
            t += self.decode if c.is_decode else self.token * c.num_tokens
            t += self.key * c.num_tokens * (c.num_computed_tokens + (c.num_tokens + 1) / 2)
        return t


def timed(step_budget_s: float, predictor: Linear, **kw: int) -> ChunkedPolicy:
    return ChunkedPolicy(step_budget_s=step_budget_s, predictor=predictor, **kw)


def run(sched: Scheduler, max_steps: int = 10_000) -> list[StepPlan]:
    plans = []
    for _ in range(max_steps):
        plan = sched.schedule()
        if plan.is_empty:
            break
        plans.append(plan)
        sched.update_from_output(plan, one_second(plan))
    return plans


def prompt_chunks(plans: list[StepPlan], rid: str) -> list[ScheduledChunk]:
    return [c for p in plans for c in p.chunks if c.request_id == rid and c.num_computed_tokens < 4096]


# -- preview ------------------------------------------------------------------------------------


def test_preview_prices_a_candidate_without_changing_anything() -> None:
    sched = make_scheduler(
        "chunked", max_num_seqs=4, block_size=4, num_blocks=8, watermark=0.0, token_budget=64
    )
    sched.add_request(Request("a", 6, 4))
    run_one = sched.schedule()
    sched.update_from_output(run_one, one_second(run_one))  # a decodes from now on
    sched.add_request(Request("b", 20, 2))
    ctx = StepContext(sched.state, sched.config)
    ctx.schedule_decodes()
    free = sched.block_manager.num_free_blocks
    head = ctx.waiting[0]
    plan = ctx.preview(head, 12)
    assert [(c.request_id, c.num_computed_tokens, c.num_tokens, c.num_known_tokens) for c in plan.chunks] == [
        ("a", 6, 1, 7),
        ("b", 0, 12, 20),
    ]
    assert not plan.new_block_ids and not plan.preempted_request_ids and not plan.freed_request_ids
    # nothing moved: b still waits, holds no blocks, is not scheduled; the free blocks are as they were
    assert ctx.waiting[0] is head and not ctx.is_scheduled(head) and not ctx.is_running(head)
    assert sched.block_manager.num_free_blocks == free and ctx.num_scheduled_tokens == 1
    assert ctx.preview().chunks == plan.chunks[:1]  # no candidate: the step so far
    # the action then schedules exactly what was previewed
    assert ctx.admit(12) == 12
    assert ctx.build(()).chunks == plan.chunks


def test_preview_refuses_what_no_action_could_schedule() -> None:
    sched = make_scheduler("chunked")
    sched.add_request(Request("a", 10, 2))
    ctx = StepContext(sched.state, sched.config)
    head = ctx.waiting[0]
    for bad in (0, 11):
        with pytest.raises(ValueError, match="has 10 tokens to run"):
            ctx.preview(head, bad)
    ctx.admit(10)
    with pytest.raises(ValueError, match="already in this step"):
        ctx.preview(head, 1)


# -- the policy ---------------------------------------------------------------------------------


def test_chunks_shrink_along_a_long_prompt_and_every_step_stays_within_the_target() -> None:
    predictor = Linear(key=1e-6)
    sched = make_scheduler(timed(10.0, predictor), max_num_seqs=8)
    for i in range(4):
        sched.add_request(Request(f"s{i}", 64, 10_000))
    run(sched, 2)  # the streams are decoding
    sched.add_request(Request("p", 4000, 1))
    plans = []
    while any(s.request_id == "p" for s in (*sched.running, *sched.state.waiting)):
        plan = sched.schedule()
        plans.append(plan)
        sched.update_from_output(plan, one_second(plan))
    sizes = [c.num_tokens for p in plans for c in p.chunks if c.request_id == "p"]
    assert sum(sizes) == 4000
    assert all(predictor(p) <= 10.0 for p in plans)
    assert sizes[0] > sizes[-2] and sizes == sorted(sizes, reverse=True)[: len(sizes) - 1] + sizes[-1:]
    assert all(n % CHUNK_GRANULE == 0 for n in sizes[:-1])  # the last piece is whatever was left
    # each chunk is the largest granule that fits: one more granule would not
    for plan in plans[:-1]:
        p = next(c for c in plan.chunks if c.request_id == "p")
        bigger = StepPlan(
            tuple(
                ScheduledChunk(
                    c.request_id, c.num_computed_tokens, c.num_tokens + CHUNK_GRANULE, c.num_known_tokens
                )
                if c is p
                else c
                for c in plan.chunks
            )
        )
        assert predictor(bigger) > 10.0
    assert sched.policy.num_guarded_steps == 0  # type: ignore[attr-defined]


def test_a_last_piece_is_taken_whole_when_it_fits() -> None:
    predictor = Linear(fixed=0.0, token=1.0, decode=0.0)
    sched = make_scheduler(timed(40.0, predictor))
    sched.add_request(Request("p", 37, 1))
    plans = run(sched)
    assert [c.num_tokens for p in plans for c in p.chunks] == [37]  # not 32 + a 5-token tail


def test_decodes_always_run_and_the_first_prompt_still_advances_by_the_minimum_chunk() -> None:
    predictor = Linear(fixed=5.0)  # every step is over a 1 s target: the decodes alone exceed it
    policy = timed(1.0, predictor)
    sched = make_scheduler(policy, max_num_seqs=8)
    for i in range(3):
        sched.add_request(Request(f"s{i}", 8, 40))
    run(sched, 3)  # the guard admits one stream a step
    assert all(s.is_decoding for s in sched.running) and sched.num_running == 3
    policy.num_guarded_steps = policy.num_decode_overruns = 0
    sched.add_request(Request("p", 50, 1))
    sched.add_request(Request("q", 50, 1))
    plans = run(sched, 8)
    for plan in plans:
        decodes = [c for c in plan.chunks if c.request_id.startswith("s")]
        assert len(decodes) == 3 and all(c.num_tokens == 1 for c in decodes)  # never skipped
        prompts = [c for c in plan.chunks if not c.request_id.startswith("s")]
        assert len(prompts) == 1 and prompts[0].num_tokens <= MIN_CHUNK_TOKENS  # p first, q waits behind it
    assert [c.num_tokens for p in plans[:4] for c in p.chunks if c.request_id == "p"] == [16, 16, 16, 2]
    assert plans[4].chunks[-1].request_id == "q"
    assert policy.num_guarded_steps == 8 and policy.num_decode_overruns == 8


def test_a_target_below_any_step_still_finishes_everything() -> None:
    sched = make_scheduler(timed(1e-9, Linear()), max_num_seqs=4, block_size=4, num_blocks=40)
    for r in (Request("a", 30, 3), Request("b", 5, 2), Request("c", 17, 4)):
        sched.add_request(r)
    run(sched)
    assert not sched.has_unfinished_requests() and sched.block_manager.num_used_blocks == 0


def test_token_cap_holds_with_a_generous_target() -> None:
    sched = make_scheduler(timed(1e9, Linear(), token_budget=24), max_num_seqs=4)
    sched.add_request(Request("a", 100, 2))
    plans = run(sched)
    assert max(p.num_tokens for p in plans) == 24
    chunk_cap = make_scheduler(timed(1e9, Linear(), chunk_tokens=10))
    chunk_cap.add_request(Request("a", 25, 2))
    assert [p.num_prefill_tokens for p in run(chunk_cap)][:3] == [10, 10, 5]


def test_predictor_calls_per_step_are_bounded() -> None:
    predictor = Linear(key=1e-6)
    sched = make_scheduler(timed(10.0, predictor, token_budget=16384), max_num_seqs=8)
    sched.add_request(Request("p", 16000, 1))
    plans = []
    while sched.has_unfinished_requests():
        before = predictor.calls
        plan = sched.schedule()
        assert predictor.calls - before <= 2 + (16384 // CHUNK_GRANULE).bit_length()
        plans.append(plan)
        sched.update_from_output(plan, one_second(plan))
    assert len(plans) > 2


def test_steadiness_repeats_only_decode_steps() -> None:
    policy = timed(10.0, Linear())
    sched = make_scheduler(policy, max_num_seqs=4)
    sched.add_request(Request("a", 40, 50))
    first = sched.schedule()
    assert policy.steadiness(first, sched.num_running) is Steadiness.NONE  # a prompt chunk
    sched.update_from_output(first, one_second(first))
    decode = sched.schedule()
    assert policy.steadiness(decode, sched.num_running) is Steadiness.UNTIL_ARRIVAL


def test_configuration_errors_are_clear() -> None:
    with pytest.raises(ValueError, match="needs a step-time predictor"):
        ChunkedPolicy(step_budget_s=0.04)
    with pytest.raises(ValueError, match="needs a step_budget_s"):
        ChunkedPolicy(token_budget=64, predictor=Linear())
    with pytest.raises(ValueError, match="positive and finite"):
        ChunkedPolicy(step_budget_s=0.0, predictor=Linear())
    with pytest.raises(ValueError, match="chunked policy only"):
        make_policy("prefill-first", step_budget_s=0.04, predictor=Linear())
    with pytest.raises(ValueError, match="chunked policy only"):
        ServingConfig(policy="decode-first", step_budget_ms=40)
    with pytest.raises(ValueError, match="must be positive"):
        ServingConfig(step_budget_ms=-1)
    with pytest.raises(ValueError, match="step_budget_ms needs a step-time predictor"):
        ServingConfig(step_budget_ms=40).make_scheduler(8192)


def test_serving_config_caps_a_time_budget_and_passes_the_predictor() -> None:
    alone = ServingConfig(step_budget_ms=40)
    assert alone.token_budget == 16384 and alone.step_budget_s == 0.04 and alone.num_seqs_limit == 256
    policy = alone.make_scheduler(8192, predictor=Linear()).policy
    assert isinstance(policy, ChunkedPolicy) and policy.step_budget_s == 0.04 and policy.token_budget == 16384
    capped = ServingConfig(step_budget_ms=40, max_num_batched_tokens=2048).make_policy(8192, Linear())
    assert isinstance(capped, ChunkedPolicy) and capped.token_budget == 2048
    # without a step budget a predictor is simply not used
    plain = ServingConfig().make_policy(8192, Linear())
    assert isinstance(plain, ChunkedPolicy) and plain.predictor is None and plain.token_budget == 512


# -- properties ---------------------------------------------------------------------------------

BLOCK = 4


@st.composite
def timed_cases(draw: st.DrawFn) -> tuple[ChunkedPolicy, Linear, SchedulerConfig, CacheConfig, list[Request]]:
    predictor = Linear(
        fixed=draw(st.sampled_from([0.0, 1.0])),
        token=draw(st.sampled_from([0.01, 0.1])),
        decode=draw(st.sampled_from([0.0, 0.2])),
        key=draw(st.sampled_from([0.0, 1e-3])),
    )
    max_num_seqs = draw(st.integers(1, 8))
    cap = draw(st.sampled_from(["none", "token_budget", "chunk_tokens"]))
    kw = {} if cap == "none" else {cap: draw(st.integers(max_num_seqs, 96))}
    policy = timed(draw(st.sampled_from([0.5, 1.5, 3.0, 10.0])), predictor, **kw)
    cache = CacheConfig(block_size=BLOCK, num_blocks=draw(st.integers(8, 64)), watermark=0.0)
    reqs = [
        Request(str(i), draw(st.integers(1, 120)), draw(st.integers(1, 20)), draw(st.floats(0, 10)))
        for i in range(draw(st.integers(1, 10)))
    ]
    return policy, predictor, SchedulerConfig(max_num_seqs=max_num_seqs), cache, reqs


@settings(max_examples=150, deadline=None)
@given(timed_cases())
def test_time_budget_properties(
    case: tuple[ChunkedPolicy, Linear, SchedulerConfig, CacheConfig, list[Request]],
) -> None:
    """A step goes over the target only through its decodes or the starvation guard's one chunk of
    at most MIN_CHUNK_TOKENS (so every step whose decodes plus a minimum chunk fit stays within
    it); decodes are never skipped; every prompt finishes; caps hold; no block leaks."""
    policy, predictor, config, cache, reqs = case
    target = policy.step_budget_s
    assert target is not None
    sched = Scheduler(config, cache, policy)

    def check(plan: StepPlan, decoding: set[str]) -> None:
        assert_stall_free(plan, decoding)
        decodes = tuple(c for c in plan.chunks if c.request_id in decoding)
        prompts = [c for c in plan.chunks if c.request_id not in decoding]
        if policy.token_budget is not None:
            assert plan.num_tokens <= policy.token_budget
        if policy.chunk_tokens is not None:
            assert sum(c.num_tokens for c in prompts) <= policy.chunk_tokens
        if predictor(plan) > target:
            # over the target only through the decodes or the guard's one minimum chunk
            assert len(prompts) <= 1 and all(c.num_tokens <= MIN_CHUNK_TOKENS for c in prompts)
        elif predictor(StepPlan(decodes)) <= target and prompts:
            # within the target: no prompt chunk could have taken one more granule (unless capped)
            assert len({c.request_id for c in prompts}) == len(prompts)

    events, rejected = run_on_step_counter(sched, reqs, check, max_steps=20_000)
    finished = {rid for e in events for rid, _ in e.finished}
    assert finished | set(rejected) == {r.request_id for r in reqs}
    assert sched.block_manager.num_used_blocks == 0
