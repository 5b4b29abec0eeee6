"""The scheduler's side of disaggregated serving: a decode server's request arrives with its
prompt's KV (``num_external_tokens``), a prefill server's keeps its KV after it finishes until a
decode server has it (``sends_kv``, ``Scheduler.release_kv``)."""

from __future__ import annotations

import pytest

from stallfree.core import Request, StepResult
from tests.factories import make_scheduler


def test_a_request_with_its_prompts_kv_runs_only_its_last_token_for_logits() -> None:
    scheduler = make_scheduler(token_budget=512, num_blocks=100)
    scheduler.add_request(Request("a", 100, 4, num_external_tokens=100))
    plan = scheduler.schedule()
    (chunk,) = plan.chunks
    assert (chunk.num_computed_tokens, chunk.num_tokens, chunk.emits_token) == (99, 1, True)
    assert plan.num_tokens == 1  # the KV that came with it costs no budget
    assert len(scheduler.block_manager.block_table("a")) == 7  # blocks for all 100 tokens
    events = scheduler.update_from_output(plan, StepResult(1.0))
    assert events.new_token_request_ids == ("a",)
    assert scheduler.schedule().chunks[0].is_decode


def test_the_kv_that_came_is_lost_to_a_preemption() -> None:
    scheduler = make_scheduler(token_budget=512)
    scheduler.add_request(Request("a", 100, 4, num_external_tokens=100))
    scheduler.update_from_output(scheduler.schedule(), StepResult(1.0))
    scheduler.state.preempt(scheduler.state.running_by_id["a"])
    (chunk,) = scheduler.schedule().chunks
    assert (chunk.num_computed_tokens, chunk.num_tokens) == (0, 101)  # prompt and its token again


def test_external_tokens_are_checked() -> None:
    with pytest.raises(ValueError, match="num_external_tokens"):
        Request("a", 10, 1, num_external_tokens=11)


def test_a_request_that_sends_its_kv_holds_its_blocks_until_released() -> None:
    scheduler = make_scheduler(token_budget=512, num_blocks=20)
    scheduler.add_request(Request("a", 100, 1, sends_kv=True))
    plan = scheduler.schedule()
    events = scheduler.update_from_output(plan, StepResult(1.0))
    assert events.finished and not scheduler.has_unfinished_requests()
    assert scheduler.num_held_kv == 1
    assert scheduler.block_manager.num_used_blocks == 7
    assert scheduler.schedule().freed_request_ids == ()  # not freed yet
    scheduler.release_kv("a")
    assert scheduler.num_held_kv == 0 and scheduler.block_manager.num_used_blocks == 0
    assert scheduler.schedule().freed_request_ids == ("a",)
    with pytest.raises(ValueError, match="holds no KV"):
        scheduler.release_kv("a")


def test_held_blocks_keep_a_waiting_prompt_out_until_released() -> None:
    scheduler = make_scheduler(token_budget=512, num_blocks=10, watermark=0.0)
    scheduler.add_request(Request("a", 100, 1, sends_kv=True))
    scheduler.update_from_output(scheduler.schedule(), StepResult(1.0))
    scheduler.add_request(Request("b", 100, 1, sends_kv=True))  # 7 blocks; 3 are free
    assert scheduler.schedule().chunks == ()
    scheduler.release_kv("a")
    assert [c.request_id for c in scheduler.schedule().chunks] == ["b"]


def test_an_aborted_request_frees_what_it_would_have_sent() -> None:
    scheduler = make_scheduler(token_budget=64, max_num_seqs=8, num_blocks=20)
    scheduler.add_request(Request("a", 100, 1, sends_kv=True))
    scheduler.update_from_output(scheduler.schedule(), StepResult(1.0))  # part of the prompt
    assert scheduler.abort_request("a")
    assert scheduler.num_held_kv == 0 and scheduler.block_manager.num_used_blocks == 0
