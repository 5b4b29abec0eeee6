"""Time-budgeted chunks in the simulator: the cost model is the predictor; steps over the target
are counted; the fast path still equals scheduling every step."""

from __future__ import annotations

import json

import numpy as np
import pytest

from stallfree.cli import main
from stallfree.core import Request
from stallfree.core.serving import ServingConfig
from stallfree.costs.choice import CostChoice
from stallfree.sim import Deployment, simulate
from stallfree.workload import TraceLengths, Workload, poisson


def _long_prompt_into_streams(prompt_tokens: int) -> list[Request]:
    """16 streams decoding (short prompts, long outputs), then one long prompt arrives at 1 s."""
    streams = [Request(f"s{i}", 512, 400, 0.0) for i in range(16)]
    return [*streams, Request("long", prompt_tokens, 4, 1.0)]


def test_a_time_budget_holds_every_step_where_a_fixed_budget_grows_with_the_context() -> None:
    h100 = CostChoice(kind="full", model="llama-3.1-8b", hardware="h100-sxm")
    timed = simulate(
        _long_prompt_into_streams(32768),
        Deployment(costs=h100, serving=ServingConfig(step_budget_ms=40)),
        keep_steps=True,
    )
    s = timed.summary
    assert s["completed"] == 17 and s["step_budget_ms"] == 40
    assert s["num_steps_over_budget"] == 0 and s["max_step_ms"] <= 40.0 and s["max_itl_ms"] <= 40.0
    # the prompt's chunks shrink as attention over its earlier chunks grows
    assert timed.steps is not None
    prefill = np.frombuffer(timed.steps.num_prefill_tokens, dtype=np.int64)
    start = np.frombuffer(timed.steps.start_s, dtype=np.float64)
    chunks = prefill[(prefill > 0) & (start >= 1.0)]  # the long prompt's (the streams' came first)
    assert chunks[0] > 1.3 * chunks[-2] and sum(chunks) == 32768
    # a fixed budget as large as the first time-sized step: its later steps run past 40 ms
    fixed = simulate(
        _long_prompt_into_streams(32768),
        Deployment(costs=h100, serving=ServingConfig(max_num_batched_tokens=int(chunks[0]) + 16)),
    ).summary
    assert fixed["max_step_ms"] > 45.0 and "num_steps_over_budget" not in fixed


def test_the_fast_path_equals_the_slow_one_under_memory_pressure() -> None:
    deployment = Deployment(serving=ServingConfig(step_budget_ms=30), gpu_memory_utilization=0.22)
    heavy = Workload(poisson(4.0), TraceLengths("arxiv"))
    fast = simulate(heavy, deployment, num_requests=100)
    slow = simulate(heavy, deployment, num_requests=100, fast=False)
    assert fast.summary["num_preemptions"] > 0 and fast.summary["completed"] == 100
    assert fast.records == slow.records
    assert fast.summary.keys() == slow.summary.keys()
    for key, value in fast.summary.items():
        expected = slow.summary[key]
        assert value == (pytest.approx(expected, rel=1e-12) if isinstance(expected, float) else expected), key
    assert fast.summary["num_steps"] == slow.summary["num_steps"]


def test_a_target_below_the_decode_step_is_counted_not_obeyed() -> None:
    s = simulate(
        _long_prompt_into_streams(2048),
        Deployment(costs=CostChoice(kind="full"), serving=ServingConfig(step_budget_ms=2)),
    ).summary
    assert s["completed"] == 17  # the guard still moves the prompt
    assert s["num_steps_over_budget"] == s["num_steps"]  # a decode step alone takes ~8 ms
    # every prompt (the streams, then the long one) moves by the guard's 16 tokens a step
    assert s["num_guarded_steps"] >= s["num_decode_overruns"] > 2048 // 16 - 2


def test_simulate_cli_reports_the_budget(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--num-requests", "30", "--qps", "4", "--step-budget-ms", "30"]
    assert main([*args, "--policy", "chunked,prefill-first"]) == 0
    out = capsys.readouterr().out
    assert "chunked step budget 30 ms (cap: token budget 16384)" in out
    assert "steps over budget" in out and "step max (ms)" in out
    assert main([*args, "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    summary = body["policies"]["chunked"]
    assert body["scenario"]["step_budget_ms"] == 30
    assert summary["num_steps_over_budget"] == 0 and summary["max_step_ms"] <= 30


def test_simulate_cli_refuses_a_step_budget_on_bad_values(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["simulate", "--step-budget-ms", "0"])
    assert "must be positive" in capsys.readouterr().err
