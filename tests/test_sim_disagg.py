"""Prefill and decode pools on the one clock (:mod:`stallfree.sim.disagg`): hand-worked timelines,
the pools' accounting (no request lost, KV freed on both sides), shared links, and the CLI."""

from __future__ import annotations

import json
import random

import pytest

from stallfree.cli import main
from stallfree.core import Request, Scheduler
from stallfree.core.router import make_router
from stallfree.costs.kv_transfer import KvLink, PoolShape
from stallfree.sim.disagg import DisaggRun, run_disaggregated
from tests.factories import OneSecondCosts, make_scheduler

LINK = KvLink("test", bytes_per_s=100.0, latency_s=0.0)  # a KV byte a token: 100 tokens a second


def _run(
    shape: PoolShape,
    requests: list[Request],
    *,
    prefill: list[Scheduler] | None = None,
    decode: list[Scheduler] | None = None,
    link: KvLink = LINK,
    fast: bool = True,
) -> tuple[DisaggRun, list[Scheduler], list[Scheduler]]:
    p = prefill or [make_scheduler(token_budget=512) for _ in range(shape.num_prefill)]
    d = decode or [make_scheduler(token_budget=512) for _ in range(shape.num_decode)]
    run = run_disaggregated(
        shape,
        (p, [OneSecondCosts()] * len(p)),
        (d, [OneSecondCosts()] * len(d)),
        (make_router("round-robin", len(p)), make_router("round-robin", len(d))),
        link,
        lambda num_tokens: num_tokens,
        requests,
        fast=fast,
    )
    return run, p, d


def test_a_request_goes_prefill_link_decode_and_its_first_token_comes_from_decode() -> None:
    # prefill step 0-1; 200 bytes at 100 B/s: there at 3; decode runs the last prompt token 3-4
    # (the first token), then two more decode steps
    run, _, _ = _run(PoolShape(1, 1), [Request("a", 200, 3)])
    (rec,) = run.records
    assert (rec.first_scheduled_s, rec.first_token_s, rec.finish_s) == (0.0, 4.0, 6.0)
    assert rec.num_output_tokens == 3 and rec.max_itl_s == 1.0
    assert (run.prefill_s, run.transfer_s, run.decode_queue_s) == ([1.0], [2.0], [0.0])
    assert run.kv_bytes == 200


def test_transfers_from_one_prefill_replica_share_its_link() -> None:
    # both prompts in the step 0-1; two transfers at half the rate each: 4 s, there at 5
    run, _, _ = _run(PoolShape(1, 1), [Request("a", 200, 1), Request("b", 200, 1)])
    assert [r.first_token_s for r in run.records] == [6.0, 6.0]
    assert run.link_busy_s == 4.0


def test_a_decode_replica_with_more_gpus_takes_two_transfers_at_full_rate() -> None:
    # two prefill replicas of 1 GPU send to one decode replica of 2 GPUs: each link its own
    shape = PoolShape(2, 1, tp_prefill=1, tp_decode=2)
    run, _, _ = _run(shape, [Request("a", 200, 1), Request("b", 200, 1)])
    assert [r.first_token_s for r in run.records] == [4.0, 4.0]
    # a decode replica of 1 GPU receives them one link's worth at a time
    run, _, _ = _run(PoolShape(2, 1), [Request("a", 200, 1), Request("b", 200, 1)])
    assert [r.first_token_s for r in run.records] == [6.0, 6.0]


def test_a_full_decode_pool_backs_up_into_the_prefill_replicas_kv() -> None:
    # decode holds one request at a time (8 blocks of 16 = 128 tokens); prefill holds two prompts
    decode = [make_scheduler(token_budget=512, num_blocks=8, watermark=0.0)]
    prefill = [make_scheduler(token_budget=512, num_blocks=14, watermark=0.0)]
    requests = [Request(f"r{i}", 100, 20, arrival_time_s=0.0) for i in range(4)]
    run, p, d = _run(PoolShape(1, 1), requests, prefill=prefill, decode=decode, link=KvLink("x", 1e9, 0.0))
    firsts = [r.first_token_s for r in run.records]
    assert firsts == sorted(firsts) and len(set(firsts)) == 4  # one after another
    # r2's prompt waited for r0's KV to leave the prefill replica, which waited for a decode slot
    assert run.records[2].first_scheduled_s is not None and run.records[2].first_scheduled_s > 1.0
    assert all(r.num_output_tokens == 20 for r in run.records)
    for s in (*p, *d):
        assert s.num_held_kv == 0 and s.block_manager.num_used_blocks == 0


def test_refused_by_either_pool_is_one_rejected_record() -> None:
    # fits the prefill replica (prompt + 1) but not the decode one (prompt + max_tokens)
    decode = [make_scheduler(token_budget=512, num_blocks=8, watermark=0.0)]
    prefill = [make_scheduler(token_budget=512, num_blocks=100, watermark=0.0)]
    run, p, _ = _run(
        PoolShape(1, 1), [Request("big", 100, 100), Request("ok", 50, 2, 0.5)], prefill=prefill, decode=decode
    )
    assert [(r.request_id, r.finish_reason) for r in run.records] == [("big", "rejected"), ("ok", "length")]
    assert p[0].num_held_kv == 0 and p[0].block_manager.num_used_blocks == 0


def _random_requests(rng: random.Random, n: int) -> list[Request]:
    t, out = 0.0, []
    for i in range(n):
        t += rng.expovariate(2.0)
        out.append(Request(f"r{i}", rng.randint(1, 300), rng.randint(1, 40), round(t, 3)))
    return out


@pytest.mark.parametrize("seed", range(12))
def test_random_pools_lose_nothing_free_everything_and_fast_equals_every_step(seed: int) -> None:
    rng = random.Random(seed)
    shape = PoolShape(rng.randint(1, 3), rng.randint(1, 3), rng.randint(1, 2), rng.randint(1, 2))
    requests = _random_requests(rng, 60)
    runs = []
    for fast in (True, False):
        pools = random.Random(seed)  # the same pools both times
        p, d = (
            [
                make_scheduler(
                    token_budget=pools.choice([64, 128, 512]),
                    max_num_seqs=32,
                    num_blocks=pools.randint(30, 80),
                )
                for _ in range(n)
            ]
            for n in (shape.num_prefill, shape.num_decode)
        )
        run, p, d = _run(shape, requests, prefill=p, decode=d, fast=fast)
        assert sorted(r.request_id for r in run.records) == sorted(r.request_id for r in requests)
        for rec, req in zip(run.records, requests, strict=True):
            assert rec.request_id == req.request_id
            assert rec.finish_reason == "rejected" or rec.num_output_tokens == req.max_tokens
        for s in (*p, *d):
            assert not s.has_unfinished_requests() and s.num_held_kv == 0
            assert s.block_manager.num_used_blocks == 0
        runs.append(run)
    assert runs[0].records == runs[1].records
    assert runs[0].itl.values_s.tolist() == runs[1].itl.values_s.tolist()


def test_cli_runs_aggregated_and_disaggregated_on_the_same_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "simulate",
        "--cost-model",
        "full",
        "--qps",
        "6",
        "--num-requests",
        "80",
        "--lengths",
        "fixed:1500,60",
    ]
    assert main([*argv, "--policy", "chunked,disagg:1P2D", "--kv-link", "ib-400", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["scenario"]["replicas"] == 3 and out["scenario"]["gpus"] == 3
    disagg = out["policies"]["disagg:1P2D"]
    assert disagg["completed"] == 80 and disagg["disaggregation"]["num_kv_transfers"] == 80
    assert disagg["disaggregation"]["kv_link"] == "ib-400"
    assert main([*argv, "--disaggregate", "1P2D"]) == 0
    text = capsys.readouterr().out
    assert "1 prefill replica (1 GPU each, token budget 512)" in text and "KV over nvlink" in text
    assert main([*argv, "--disaggregate", "2X3"]) == 2
    assert "xPyD" in capsys.readouterr().err
    assert main([*argv, "--kv-link", "ib-400"]) == 2
    assert "applies with --disaggregate" in capsys.readouterr().err


def test_steps_past_the_step_budget_are_counted_in_both_pools() -> None:
    from stallfree.core.serving import ServingConfig
    from stallfree.costs.choice import CostChoice
    from stallfree.sim import Deployment, simulate
    from stallfree.sim.disagg import Disaggregation
    from stallfree.workload import Workload, parse_lengths, poisson

    costs = CostChoice(kind="full", model="llama-3.1-8b", hardware="h100-sxm")
    result = simulate(
        Workload(poisson(4.0), parse_lengths("fixed:2000,50")),
        Deployment(
            costs=costs,
            serving=ServingConfig(step_budget_ms=4.0),
            disaggregate=Disaggregation(PoolShape(1, 1)),
        ),
        num_requests=40,
    )
    assert result.summary["completed"] == 40
    assert result.summary["num_steps_over_budget"] > 0
