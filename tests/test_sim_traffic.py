"""The continuous-traffic driver: golden runs by hand, properties under memory pressure, and the
fast path (steady runs) equal to scheduling every step."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stallfree.core import (
    CacheConfig,
    Request,
    Scheduler,
    SchedulerConfig,
    StepPlan,
    make_policy,
)
from stallfree.core.router import ROUTER_NAMES, make_router
from stallfree.costs.roofline import CostModel, CostModelConfig
from stallfree.metrics import RequestRecord, summarize
from stallfree.sim.fleet import run_fleet
from stallfree.sim.traffic import TrafficRun, run_traffic
from stallfree.specs import HARDWARE_PRESETS, load_model_spec
from tests.factories import OneSecondCosts, make_scheduler
from tests.strategies import policy_cases


def run(policy: str, requests: list[Request], fast: bool = True, **kw: int) -> TrafficRun:
    sched = make_scheduler(policy, max_num_seqs=4, **kw)
    return run_traffic(sched, OneSecondCosts(), requests, fast=fast)  # token times are step counts


def by_id(result: TrafficRun) -> dict[str, tuple[float | None, float, int, float]]:
    """request -> (first token, finish, output tokens, longest gap)."""
    return {
        r.request_id: (r.first_token_s, r.finish_s, r.num_output_tokens, r.max_itl_s) for r in result.records
    }


def itl_samples(result: TrafficRun) -> list[float]:
    return sorted(np.repeat(result.itl.values_s, result.itl.counts).tolist())


TRAFFIC = [Request("a", 4, 3), Request("b", 4, 3), Request("c", 2, 2, arrival_time_s=1.5)]


@pytest.mark.parametrize("fast", [True, False])
def test_prefill_first_golden(fast: bool) -> None:
    """Tokens: a and b at 1, 2, 4 (c's prefill [2,3] stalls them), c at 3, 4.
    Gaps: a: 1, 2; b: 1, 2; c: 1. c arrives at 1.5 and is first scheduled at 2."""
    result = run("prefill-first", TRAFFIC, fast)
    assert by_id(result) == {"a": (1, 4, 3, 2), "b": (1, 4, 3, 2), "c": (3, 4, 2, 1)}
    assert itl_samples(result) == [1, 1, 1, 2, 2]
    assert result.duration_s == 4
    c = next(r for r in result.records if r.request_id == "c")
    assert c.first_scheduled_s == 2.0 and c.arrival_s == 1.5


@pytest.mark.parametrize("fast", [True, False])
def test_decode_first_golden(fast: bool) -> None:
    """a, b decode to the end at 3; only then c prefills [3,4] and decodes [4,5]."""
    result = run("decode-first", TRAFFIC, fast)
    assert by_id(result) == {"a": (1, 3, 3, 1), "b": (1, 3, 3, 1), "c": (4, 5, 2, 1)}
    assert itl_samples(result) == [1, 1, 1, 1, 1]


@pytest.mark.parametrize("fast", [True, False])
def test_chunked_golden_long_prompt_rides_with_a_decode(fast: bool) -> None:
    """Budget 5: d's 5-token prompt fills step [0,1]; p (10 tokens, at t=1) then gets 4 tokens
    per step beside d's decode: 4 + 4 + 2, first token at 4. d decodes once per step to t=10:
    nine gaps of 1 s, none skipped."""
    reqs = [Request("d", 5, 10), Request("p", 10, 1, arrival_time_s=1.0)]
    result = run("chunked", reqs, fast, token_budget=5)
    assert by_id(result) == {"d": (1, 10, 10, 1), "p": (4, 4, 1, 0)}
    assert itl_samples(result) == [1] * 9
    assert result.num_steps == 10
    if fast:  # steps [1,3] repeat (decode + 4-token chunk) and so do [4,10]
        assert result.num_plans < result.num_steps


def test_rejected_requests_are_counted_by_reason() -> None:
    sched = make_scheduler("chunked", max_num_seqs=4, max_model_len=64, block_size=4, num_blocks=8)
    reqs = [Request("ok", 8, 4), Request("long", 60, 10), Request("longer", 70, 10), Request("big", 30, 10)]
    result = run_traffic(sched, OneSecondCosts(), reqs)
    reasons = {r.request_id: r.finish_reason for r in result.records}
    assert reasons == {"ok": "length", "long": "rejected", "longer": "rejected", "big": "rejected"}
    assert sum(result.rejected_reasons.values()) == 3
    assert any("max_model_len" in reason for reason in result.rejected_reasons)
    assert any("KV blocks" in reason for reason in result.rejected_reasons)
    # Numbers are replaced so one kind of rejection is one entry.
    assert result.rejected_reasons[next(r for r in result.rejected_reasons if "max_model_len" in r)] == 2


def test_requests_out_of_order_are_refused() -> None:
    with pytest.raises(ValueError, match="arrives before"):
        run("chunked", [Request("a", 4, 2, arrival_time_s=2.0), Request("b", 4, 2, arrival_time_s=1.0)])


# -- properties over random workloads under memory pressure -----------------------------------------

COSTS = {
    f"{kind}+{overhead_s}": CostModel(
        CostModelConfig(
            load_model_spec("llama-3-8b"), HARDWARE_PRESETS["a100-80gb"], kind=kind, overhead_s=overhead_s
        )
    )
    for kind in ("weights-only", "full")
    for overhead_s in (0.0, 0.003)
}


class CheckedScheduler(Scheduler):
    """Checks every plan it makes: budget, max seqs, stall-free decodes, blocks in range."""

    def __init__(self, policy: str, kw: dict[str, int], config: SchedulerConfig, cache: CacheConfig) -> None:
        super().__init__(config, cache, make_policy(policy, **kw))
        self.kw = kw

    def schedule(self) -> StepPlan:
        decoding = {s.request_id for s in self.running if s.is_decoding}
        plan = super().schedule()
        plan.validate()
        assert len(plan.chunks) <= self.config.max_num_seqs
        assert self.num_running <= self.config.max_num_seqs
        bm = self.block_manager
        assert bm.num_blocks is not None and 0 <= bm.num_used_blocks <= bm.num_blocks
        if self.policy.name == "chunked":
            if "token_budget" in self.kw:
                assert plan.num_tokens <= self.kw["token_budget"]
            else:
                assert plan.num_prefill_tokens <= self.kw["chunk_tokens"]
            scheduled = {c.request_id: c.num_tokens for c in plan.chunks}
            for rid in decoding:  # stall-free: every decoding request gets exactly one token
                assert scheduled.get(rid) == 1 or rid in plan.preempted_request_ids
        return plan


Case = tuple[str, dict[str, int], SchedulerConfig, CacheConfig, list[Request], str]


@st.composite
def cases(draw: st.DrawFn) -> Case:
    policy, kw, config = draw(policy_cases())
    reqs = sorted(
        (
            Request(str(i), draw(st.integers(1, 80)), draw(st.integers(1, 30)), draw(st.floats(0, 0.3)))
            for i in range(draw(st.integers(1, 14)))
        ),
        key=lambda r: r.arrival_time_s,
    )
    cache = CacheConfig(
        block_size=4, num_blocks=draw(st.integers(8, 64)), watermark=draw(st.sampled_from([0.0, 0.1]))
    )
    kind = draw(st.sampled_from(sorted(COSTS)))
    return policy, kw, config, cache, reqs, kind


def drive(case: Case, fast: bool) -> tuple[CheckedScheduler, TrafficRun]:
    policy, kw, config, cache, reqs, kind = case
    sched = CheckedScheduler(policy, kw, config, cache)
    return sched, run_traffic(sched, COSTS[kind], reqs, fast=fast)


@settings(max_examples=150, deadline=None)
@given(cases())
def test_every_request_completes_or_is_rejected_and_no_block_leaks(case: Case) -> None:
    sched, result = drive(case, fast=True)
    reqs = {r.request_id: r for r in case[4]}
    assert sorted(r.request_id for r in result.records) == sorted(reqs)
    for record in result.records:
        if record.finish_reason == "rejected":
            assert record.num_output_tokens == 0
        else:
            assert record.finish_reason == "length"
            assert record.num_output_tokens == reqs[record.request_id].max_tokens
            assert record.first_token_s is not None
            assert record.arrival_s <= record.first_token_s <= record.finish_s
    assert sum(result.rejected_reasons.values()) == sum(r.finish_reason == "rejected" for r in result.records)
    # Every gap of every completed request is an ITL sample: output tokens - 1 per request.
    assert result.itl.num_samples == sum(max(0, r.num_output_tokens - 1) for r in result.records)
    assert sched.block_manager.num_used_blocks == 0
    assert sched.block_manager.num_free_blocks == sched.block_manager.num_blocks
    assert not sched.has_unfinished_requests()


@settings(max_examples=150, deadline=None)
@given(cases())
def test_fast_path_equals_scheduling_every_step(case: Case) -> None:
    _, fast = drive(case, fast=True)
    _, slow = drive(case, fast=False)
    assert fast.records == slow.records
    assert fast.duration_s == slow.duration_s
    assert fast.num_steps == slow.num_steps
    assert fast.num_preemptions == slow.num_preemptions
    assert itl_samples(fast) == itl_samples(slow)
    if fast.duration_s > 0:
        a, b = (
            summarize(fast.records, fast.itl, fast.duration_s),
            summarize(slow.records, slow.itl, slow.duration_s),
        )
        assert a.keys() == b.keys()
        for key, value in a.items():  # means and stds may sum in another order
            assert value == (b[key] if b[key] is None else pytest.approx(b[key], rel=1e-12)), key


@settings(max_examples=80, deadline=None)
@given(cases(), st.integers(2, 4), st.sampled_from(ROUTER_NAMES), st.sampled_from([0.0, 0.002]))
def test_a_fleets_fast_path_equals_scheduling_every_step(
    case: Case, num_replicas: int, router: str, delay_s: float
) -> None:
    # A fleet's steady runs are cut only when a request reaches their replica, not at every
    # arrival: the same steps, tokens and times as scheduling every step.
    policy, kw, config, cache, reqs, kind = case

    def fleet(fast: bool) -> tuple[list[RequestRecord], float, list[float]]:
        schedulers = [CheckedScheduler(policy, kw, config, cache) for _ in range(num_replicas)]
        run = run_fleet(
            schedulers, [COSTS[kind]] * num_replicas, make_router(router, num_replicas), reqs,
            fast=fast, route_delay_s=delay_s,
        )  # fmt: skip
        assert all(not s.has_unfinished_requests() for s in schedulers)
        return run.records, run.duration_s, sorted(np.repeat(run.itl.values_s, run.itl.counts).tolist())

    assert fleet(fast=True) == fleet(fast=False)


@settings(max_examples=30, deadline=None)
@given(cases())
def test_same_input_same_result(case: Case) -> None:
    _, first = drive(case, fast=True)
    _, second = drive(case, fast=True)
    assert first.records == second.records
    assert itl_samples(first) == itl_samples(second)


def test_a_run_leaves_no_reference_cycles() -> None:
    """Whatever a run makes dies by reference counting: a cycle (in the compiled build, a nested
    function and its environment) would keep plans alive until the cycle collector passes."""
    sched = make_scheduler("chunked", max_num_seqs=4, block_size=4, num_blocks=64, chunk_tokens=8)
    reqs = [Request(str(i), 10 + 7 * i, 12, arrival_time_s=0.5 * i) for i in range(12)]
    gc.collect()
    gc.disable()
    try:
        result = run_traffic(sched, OneSecondCosts(), reqs)
        cycles = gc.collect()
    finally:
        gc.enable()
    assert len(result.records) == 12 and result.num_plans < result.num_steps  # steady runs ran
    assert cycles == 0


@pytest.mark.parametrize("fast", [True, False])
def test_chunked_admits_a_prompt_only_when_all_its_blocks_fit(fast: bool) -> None:
    """10 blocks of 4 tokens. a (20-token prompt, 20 outputs) prefills 4 tokens a step over
    [0,5), then decodes to t=24 holding 5..10 blocks. b's 24-token prompt needs 6 blocks: never
    free while a runs, so b waits (admitting it on its first chunk's one block would only get it
    preempted as a grows). b then prefills [24,30) and decodes to 33. No preemption."""
    sched = make_scheduler(
        "chunked", max_num_seqs=4, block_size=4, num_blocks=10, watermark=0.0, chunk_tokens=4
    )
    result = run_traffic(sched, OneSecondCosts(), [Request("a", 20, 20), Request("b", 24, 4)], fast=fast)
    assert by_id(result) == {"a": (5, 24, 20, 1), "b": (30, 33, 4, 1)}
    b = next(r for r in result.records if r.request_id == "b")
    assert b.first_scheduled_s == 24
    assert result.num_preemptions == 0
