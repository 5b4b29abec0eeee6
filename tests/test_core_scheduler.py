"""Golden timelines with a constant-cost executor: exact token timestamps, worked by hand."""

from __future__ import annotations

import pytest

from stallfree.core import (
    FinishReason,
    Request,
    StepResult,
    make_policy,
    run_step,
)
from stallfree.sim.timeline import simulate_timeline
from tests.factories import make_scheduler, one_second


def token_times(policy: str, requests: list[Request], **policy_kw: int) -> dict[str, list[float]]:
    sched = make_scheduler(policy, max_num_seqs=8, **policy_kw)
    tl = simulate_timeline(sched, one_second, requests)
    assert not sched.has_unfinished_requests()
    return tl.token_times_s


TRAFFIC = [Request("a", 4, 3), Request("b", 4, 3), Request("c", 2, 2, arrival_time_s=1.5)]


def test_prefill_first_stalls_running_streams() -> None:
    """Step [0,1]: a+b prefill whole. [1,2]: decode. c arrives at 1.5, so [2,3] is c's
    prefill alone (a and b get nothing: the stall), [3,4]: everyone decodes."""
    assert token_times("prefill-first", TRAFFIC) == {"a": [1, 2, 4], "b": [1, 2, 4], "c": [3, 4]}


def test_decode_first_starves_the_new_prompt() -> None:
    """c waits until a and b finish at t=3, then prefills [3,4] and decodes [4,5]."""
    assert token_times("decode-first", TRAFFIC) == {"a": [1, 2, 3], "b": [1, 2, 3], "c": [4, 5]}


def test_chunked_never_skips_a_decode() -> None:
    """4 prompt tokens per step on top of decodes: a [0,1]; b rides with a's decode [1,2];
    c rides with both decodes [2,3]; then b and c finish together [3,4]."""
    times = token_times("chunked", TRAFFIC, chunk_tokens=4)
    assert times == {"a": [1, 2, 3], "b": [2, 3, 4], "c": [3, 4]}


def test_chunked_splits_a_long_prompt_under_a_token_budget() -> None:
    """Budget 5 with one decoder: each step carries 1 decode + 4 prompt tokens, so a
    10-token prompt takes ceil(10/4) = 3 steps and its first token lands at t = 1 + 3."""
    sched = make_scheduler("chunked", max_num_seqs=4, token_budget=5)
    reqs = [Request("d", 5, 10), Request("p", 10, 1, arrival_time_s=1.0)]
    tl = simulate_timeline(sched, one_second, reqs)
    assert tl.token_times_s["p"] == [4.0]
    assert tl.token_times_s["d"][:5] == [1, 2, 3, 4, 5]
    assert [s.tokens_by_request for s in tl.steps[1:4]] == [
        (("d", 1), ("p", 4)),
        (("d", 1), ("p", 4)),
        (("d", 1), ("p", 2)),
    ]


def test_preemption_frees_newest_and_recomputes() -> None:
    """4 blocks of 2 tokens. a and b (3-token prompts) fill all 4 blocks after prefill and
    their first decode (4 tokens each). a's second decode needs a 3rd block, so b (newest)
    is preempted and later recomputes its prompt + 2 generated tokens in one chunk."""
    sched = make_scheduler(
        "chunked", max_num_seqs=4, block_size=2, num_blocks=4, watermark=0.0, token_budget=8
    )
    for rid in ("a", "b"):
        assert sched.add_request(Request(rid, 3, 3)) is None
    plans = []
    while (out := run_step(sched, one_second)) is not None:
        plans.append(out[0])
        assert sched.block_manager.num_used_blocks <= 4
    preempted = [p.preempted_request_ids for p in plans if p.preempted_request_ids]
    assert preempted == [("b",)]
    # b comes back with its prompt and generated token recomputed in one chunk.
    recompute = next(c for p in plans for c in p.chunks if c.request_id == "b" and c.num_tokens == 5)
    assert recompute.num_computed_tokens == 0 and recompute.num_known_tokens == 5
    assert sched.block_manager.num_used_blocks == 0


def test_requests_that_can_never_fit_are_rejected_with_a_reason() -> None:
    sched = make_scheduler("chunked", max_model_len=100, num_blocks=4)
    too_long = sched.add_request(Request("x", 90, 20))
    assert too_long is not None and "max_model_len" in too_long
    too_big = sched.add_request(Request("y", 60, 20))
    assert too_big is not None and "KV blocks" in too_big
    assert sched.add_request(Request("z", 40, 10)) is None
    assert sched.num_rejected == 2


def test_stop_and_abort_free_blocks() -> None:
    sched = make_scheduler("chunked", block_size=4, num_blocks=16)
    assert sched.add_request(Request("s", 6, 10)) is None
    assert sched.add_request(Request("k", 6, 10)) is None
    out = run_step(sched, lambda p: StepResult(0.1, stopped_request_ids=frozenset({"s"})))
    assert out is not None
    assert out[2].finished == (("s", FinishReason.STOP),)
    assert sched.abort_request("k") and not sched.abort_request("k")
    assert sched.block_manager.num_used_blocks == 0
    assert set(sched.schedule().freed_request_ids) == {"s", "k"}
    assert not sched.has_unfinished_requests()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"token_budget": 0}, "positive"),
        ({"token_budget": 8, "chunk_tokens": 8}, "exactly one"),
    ],
)
def test_chunked_policy_rejects_bad_budgets(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_policy("chunked", **kwargs)


def test_budget_below_max_num_seqs_is_refused() -> None:
    with pytest.raises(ValueError, match="smaller than max_num_seqs"):
        make_scheduler("chunked", max_num_seqs=64, token_budget=32)


def test_unknown_policy_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="chunked, prefill-first, decode-first"):
        make_policy("fastest")


def test_duplicate_request_id_is_refused() -> None:
    sched = make_scheduler("chunked")
    sched.add_request(Request("a", 4, 4))
    with pytest.raises(ValueError, match="already"):
        sched.add_request(Request("a", 4, 4))


def test_preemption_never_takes_a_request_already_in_the_plan() -> None:
    """A policy that admits first and decodes after: the decode must not preempt the request
    it just admitted (its chunk would run on freed blocks, handed to the decode)."""
    from stallfree.core import Policy
    from stallfree.core.context import StepContext

    class AdmitThenDecode(Policy):
        name = "admit-then-decode"

        def schedule(self, ctx: StepContext) -> None:
            ctx.admit(100)
            for seq in ctx.running:
                ctx.schedule_running(seq, 1, preempt=True)

    sched = make_scheduler(AdmitThenDecode(), max_num_seqs=4, block_size=4, num_blocks=3, watermark=0.0)
    sched.add_request(Request("a", 4, 8))
    first = run_step(sched, one_second)  # a's prompt: one full block
    assert first is not None
    sched.add_request(Request("b", 8, 1))
    plan = sched.schedule()
    owners: dict[int, str] = {}
    for rid, blocks in plan.new_block_ids.items():
        for block in blocks:
            assert owners.setdefault(block, rid) == rid, f"block {block} given to {owners[block]} and {rid}"
    scheduled = {c.request_id for c in plan.chunks}
    assert not scheduled & set(plan.preempted_request_ids)


@pytest.mark.parametrize("arrival", [float("nan"), float("inf"), -1.0])
def test_arrival_times_must_be_real_moments(arrival: float) -> None:
    """A NaN arrival never compares <= the clock: drivers would wait for it forever."""
    with pytest.raises(ValueError, match="arrival_time_s"):
        Request("a", 4, 4, arrival)
