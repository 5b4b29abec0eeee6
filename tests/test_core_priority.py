"""The priority scheduling policy (vLLM V1's ``--scheduling-policy priority``) on hand-built queues:
the waiting queue's order, which running request is preempted under KV pressure, what happens
to a victim already in the step, and that ``fcfs`` ignores priorities."""

from __future__ import annotations

import random

import pytest

from stallfree.core import Request, SchedulerConfig, StepPlan, StepResult, run_step
from stallfree.core.scheduler import Scheduler
from tests.factories import make_scheduler, one_second


def _plans(sched: Scheduler, limit: int = 500) -> list[StepPlan]:
    plans = []
    while (out := run_step(sched, one_second)) is not None:
        plans.append(out[0])
        assert len(plans) < limit
    return plans


def _first_chunk_order(plans: list[StepPlan]) -> list[str]:
    order: list[str] = []
    for plan in plans:
        order += [c.request_id for c in plan.chunks if c.request_id not in order]
    return order


def _one_at_a_time(policy: str, requests: list[Request]) -> list[str]:
    sched = make_scheduler("chunked", max_num_seqs=1, token_budget=64, scheduling_policy=policy)
    for request in requests:
        assert sched.add_request(request) is None
    return _first_chunk_order(_plans(sched))


def test_waiting_requests_run_by_priority_then_arrival_then_first_queued() -> None:
    requests = [
        Request("late-urgent", 8, 2, arrival_time_s=0.0, priority=-1),
        Request("batch", 8, 2, arrival_time_s=0.0, priority=10),
        Request("chat-b", 8, 2, arrival_time_s=0.0, priority=0),
        Request("chat-a", 8, 2, arrival_time_s=0.0, priority=0),
    ]
    # Equal priority and arrival: first queued first (chat-b was added before chat-a).
    assert _one_at_a_time("priority", requests) == ["late-urgent", "chat-b", "chat-a", "batch"]
    assert _one_at_a_time("fcfs", requests) == ["late-urgent", "batch", "chat-b", "chat-a"]


def test_fcfs_ignores_priorities() -> None:
    """The same requests with random priorities give fcfs exactly the plans they give without."""
    rng = random.Random(7)
    base = [
        Request(str(i), rng.randint(1, 40), rng.randint(1, 12), arrival_time_s=i * 0.3) for i in range(30)
    ]
    prioritized = [
        Request(
            r.request_id, r.num_prompt_tokens, r.max_tokens, r.arrival_time_s, priority=rng.randint(-3, 3)
        )
        for r in base
    ]

    def plans(requests: list[Request]) -> list[tuple[object, ...]]:
        sched = make_scheduler("chunked", max_num_seqs=6, block_size=4, num_blocks=24, token_budget=16)
        for r in requests:
            assert sched.add_request(r) is None
        return [(p.chunks, p.preempted_request_ids) for p in _plans(sched, 2000)]

    assert plans(prioritized) == plans(base)


def _pressed(policy: str) -> tuple[Scheduler, list[StepPlan]]:
    """Blocks of 2 tokens, 6 of them: three 3-token prompts take 2 blocks each after their first
    decode; the next decode needs a block, so someone is preempted."""
    sched = make_scheduler(
        "chunked",
        max_num_seqs=4,
        block_size=2,
        num_blocks=6,
        watermark=0.0,
        token_budget=16,
        scheduling_policy=policy,
    )
    for rid, arrival, priority in (("chat-1", 0.0, 0), ("batch", 0.1, 5), ("chat-2", 0.2, 0)):
        assert sched.add_request(Request(rid, 3, 4, arrival_time_s=arrival, priority=priority)) is None
    return sched, _plans(sched)


def test_kv_pressure_preempts_the_lowest_priority_not_the_newest() -> None:
    _, fcfs = _pressed("fcfs")
    assert next(p.preempted_request_ids for p in fcfs if p.preempted_request_ids) == ("chat-2",)
    sched, prio = _pressed("priority")
    victims = [p.preempted_request_ids for p in prio if p.preempted_request_ids]
    assert victims[0] == ("batch",)
    assert sched.block_manager.num_used_blocks == 0  # everyone finished, every block back


def test_a_victim_already_in_the_step_leaves_it_and_gives_back_its_tokens() -> None:
    """vLLM's priority rule looks at every running request, scheduled ones included. The batch
    request, admitted first, decodes first in the step; the chat's decode then needs a block,
    none is free, and the batch request, lowest priority, is taken out of the step and preempted."""
    sched = make_scheduler(
        "chunked",
        max_num_seqs=4,
        block_size=8,
        num_blocks=2,
        watermark=0.0,
        token_budget=16,
        scheduling_policy="priority",
    )
    assert sched.add_request(Request("batch", 2, 4, arrival_time_s=0.0, priority=9)) is None
    assert run_step(sched, one_second) is not None  # batch's prompt: block 1
    assert sched.add_request(Request("chat", 8, 4, arrival_time_s=1.0, priority=0)) is None
    assert run_step(sched, one_second) is not None  # batch decodes, chat's prompt fills block 2
    plan = sched.schedule()  # batch decodes in its block; chat's decode needs a third block
    assert plan.preempted_request_ids == ("batch",)
    assert [(c.request_id, c.num_tokens) for c in plan.chunks] == [("chat", 1)]
    assert list(plan.new_block_ids) == ["chat"]
    fcfs = make_scheduler(
        "chunked", max_num_seqs=4, block_size=8, num_blocks=2, watermark=0.0, token_budget=16
    )
    fcfs.add_request(Request("batch", 2, 4, arrival_time_s=0.0, priority=9))
    run_step(fcfs, one_second)
    fcfs.add_request(Request("chat", 8, 4, arrival_time_s=1.0, priority=0))
    run_step(fcfs, one_second)
    plan = fcfs.schedule()  # fcfs never takes a request already in the step: chat preempts itself
    assert plan.preempted_request_ids == ("chat",)
    assert [(c.request_id, c.num_tokens) for c in plan.chunks] == [("batch", 1)]


def _urgent_after_batch(policy: str, batch_priority: int) -> tuple[Scheduler, StepPlan]:
    """A batch request fills 3 of 4 blocks; an urgent one (priority 0) needing 2 arrives: the
    scheduler and the plan of the step after it arrived."""
    sched = make_scheduler(
        "chunked",
        max_num_seqs=4,
        block_size=4,
        num_blocks=4,
        watermark=0.0,
        token_budget=32,
        scheduling_policy=policy,
    )
    assert sched.add_request(Request("batch", 12, 2, priority=batch_priority)) is None
    assert run_step(sched, one_second) is not None  # batch: 3 blocks
    assert sched.add_request(Request("urgent", 8, 2, arrival_time_s=1.0, priority=0)) is None
    return sched, sched.schedule()


def test_a_waiting_urgent_request_does_not_preempt_running_ones() -> None:
    """As in vLLM V1: priority orders the queue and picks victims for running requests that need
    blocks; a waiting request that does not fit waits, whatever its priority."""
    sched, plan = _urgent_after_batch("priority", 50)
    assert [c.request_id for c in plan.chunks] == ["batch"] and not plan.preempted_request_ids
    sched.update_from_output(plan, StepResult(1.0))
    assert _first_chunk_order(_plans(sched)) == ["urgent"]


def test_unknown_policy_and_non_integer_priority_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown scheduling policy 'lifo'; choose from: fcfs, priority"):
        SchedulerConfig(scheduling_policy="lifo")
    with pytest.raises(ValueError, match="priority must be an integer"):
        Request("x", 4, 4, priority=1.5)  # type: ignore[arg-type]


@pytest.mark.parametrize(("batch_priority", "preempted"), [(11, True), (10, False)])
def test_sglangs_rule_lets_a_much_more_urgent_request_preempt_to_get_in(
    batch_priority: int, preempted: bool
) -> None:
    """``sglang-priority``: the urgent request finds no blocks; the batch request's priority is
    more than 10 below (11 vs 0): it is preempted and the urgent one admitted in the same step. At
    exactly 10 apart it waits, as under vLLM's rule."""
    _, plan = _urgent_after_batch("sglang-priority", batch_priority)
    if preempted:
        assert plan.preempted_request_ids == ("batch",)
        assert [(c.request_id, c.num_tokens) for c in plan.chunks] == [("urgent", 8)]
    else:
        assert not plan.preempted_request_ids
        assert [c.request_id for c in plan.chunks] == ["batch"]


def test_sglangs_rule_preempts_nobody_when_the_victims_cannot_free_enough() -> None:
    """The urgent prompt lacks blocks; only the request 50 below may go (the one 5 below may not),
    and its one block would not do: nobody is preempted, the urgent prompt waits."""
    sched = make_scheduler(
        "chunked",
        max_num_seqs=4,
        block_size=4,
        num_blocks=8,
        watermark=0.0,
        token_budget=64,
        scheduling_policy="sglang-priority",
    )
    assert sched.add_request(Request("mid", 16, 2, priority=5)) is None
    assert sched.add_request(Request("low", 3, 2, priority=50)) is None
    assert run_step(sched, one_second) is not None  # mid 4 blocks, low 1: 3 free
    assert sched.add_request(Request("high", 20, 1, arrival_time_s=1.0, priority=0)) is None
    plan = sched.schedule()  # mid's decode takes a 5th block; high needs 5 of the 2 left
    assert not plan.preempted_request_ids
    assert {c.request_id for c in plan.chunks} == {"mid", "low"}
