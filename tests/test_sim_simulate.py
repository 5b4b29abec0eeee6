"""``stallfree.sim.simulate`` end to end: policies on long-prompt traffic, memory pressure, seeds."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from stallfree.core import Request
from stallfree.core.serving import ServingConfig
from stallfree.costs.choice import CostChoice
from stallfree.sim import Deployment, simulate
from stallfree.workload import AllAtOnce, FixedLengths, ReplayArrivals, TraceLengths, Workload, poisson

ARXIV = Workload(poisson(2.0), TraceLengths("arxiv"))  # prompts of ~2,600 tokens, outputs ~290


def test_chunked_has_a_far_lower_p99_itl_than_prefill_first_at_equal_throughput() -> None:
    runs = {
        p: simulate(
            ARXIV,
            Deployment(costs=CostChoice(kind="full"), serving=ServingConfig(policy=p)),
            num_requests=300,
        ).summary
        for p in ("chunked", "prefill-first")
    }
    chunked, prefill_first = runs["chunked"], runs["prefill-first"]
    assert chunked["completed"] == prefill_first["completed"] == 300
    assert chunked["request_throughput"] == pytest.approx(prefill_first["request_throughput"], rel=0.02)
    assert chunked["output_throughput"] == pytest.approx(prefill_first["output_throughput"], rel=0.02)
    # Prefill-first stops every stream for each whole prompt; chunked caps a step at 512 tokens.
    assert chunked["p99_itl_ms"] * 3 < prefill_first["p99_itl_ms"]
    assert chunked["max_itl_ms"] * 10 < prefill_first["max_itl_ms"]


def test_decode_first_starves_new_prompts() -> None:
    chunked = simulate(
        ARXIV,
        Deployment(costs=CostChoice(kind="full"), serving=ServingConfig(policy="chunked")),
        num_requests=200,
    ).summary
    decode_first = simulate(
        ARXIV,
        Deployment(costs=CostChoice(kind="full"), serving=ServingConfig(policy="decode-first")),
        num_requests=200,
    ).summary
    assert decode_first["mean_ttft_ms"] > 10 * chunked["mean_ttft_ms"]
    assert decode_first["max_itl_ms"] <= chunked["max_itl_ms"]  # nothing ever interrupts its decodes


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for key, value in a.items():
        expected = b[key]
        assert value == (pytest.approx(expected, rel=1e-12) if isinstance(expected, float) else expected), key


def test_memory_pressure_preempts_and_the_fast_path_still_equals_the_slow_one() -> None:
    """A quarter of the GPU leaves room for ~19K tokens of KV: a few long prompts fill it."""
    deployment = Deployment(serving=ServingConfig(policy="chunked"), gpu_memory_utilization=0.22)
    heavy = Workload(poisson(4.0), TraceLengths("arxiv"))
    fast = simulate(heavy, deployment, num_requests=120)
    slow = simulate(heavy, deployment, num_requests=120, fast=False)
    assert fast.summary["num_preemptions"] > 0
    assert fast.summary["completed"] == 120
    assert fast.records == slow.records
    _same(fast.summary, slow.summary)


@pytest.mark.parametrize("policy", ["chunked", "prefill-first"])
def test_prefix_caching_on_mooncake_cuts_ttft_and_the_fast_path_still_equals_the_slow_one(
    policy: str,
) -> None:
    """Mooncake's conversation slice (hash ids per 512 tokens) under a small KV pool: hits,
    evictions and preemptions, the fast path equal to scheduling every step; the cache never
    finds more than an unbounded one would, and without it nothing is found."""
    trace = "mooncake-conversation"
    heavy = Workload(ReplayArrivals(trace), TraceLengths(trace, "in-order"))
    costs = CostChoice(kind="full", model="llama-3-8b", hardware="h100-sxm")
    kw: dict[str, Any] = {"num_requests": 200}
    serving = ServingConfig(policy=policy, max_num_batched_tokens=2048)
    fast = simulate(heavy, Deployment(costs=costs, serving=serving, gpu_memory_utilization=0.5), **kw)
    slow = simulate(
        heavy, Deployment(costs=costs, serving=serving, gpu_memory_utilization=0.5), fast=False, **kw
    )
    assert fast.records == slow.records
    _same(fast.summary, slow.summary)
    unbounded = simulate(
        heavy,
        Deployment(costs=costs, serving=replace(serving, num_blocks=1 << 22), gpu_memory_utilization=0.5),
        **kw,
    ).summary
    plain = simulate(
        heavy,
        Deployment(
            costs=costs, serving=replace(serving, enable_prefix_caching=False), gpu_memory_utilization=0.5
        ),
        **kw,
    ).summary
    cached = fast.summary
    assert cached["enable_prefix_caching"] and not plain["enable_prefix_caching"]
    assert plain["prefix_cache_hit_tokens"] == 0 and plain["prefix_cache_hit_rate"] is None
    assert 0.05 < cached["prefix_cache_hit_rate"] <= unbounded["prefix_cache_hit_rate"] < 0.5
    assert cached["mean_ttft_ms"] < 0.9 * plain["mean_ttft_ms"]


def test_requests_that_can_never_fit_are_rejected_and_counted() -> None:
    """Llama-3-8B's context is 8,192 tokens: a 9,000-token prompt can never run."""
    reqs = [
        Request("0", 100, 10),
        Request("1", 9000, 10, 0.1),
        Request("2", 8000, 500, 0.2),
        Request("3", 10, 5, 0.3),
    ]
    s = simulate(reqs).summary
    assert (s["completed"], s["rejected"]) == (2, 2)
    assert list(s["rejected_reasons"].values()) == [2]
    # The first rejection's own text, no placeholders; both prompts of that kind counted under it.
    assert next(iter(s["rejected_reasons"])) == "prompt (9000) + max_tokens (10) exceeds max_model_len (8192)"


@pytest.mark.parametrize(
    "workload",
    [
        Workload(poisson(1.0), FixedLengths(9000, 10)),  # one request: it arrives at 0
        Workload(AllAtOnce(), FixedLengths(9000, 10)),  # every request at 0
        Workload(poisson(50.0), FixedLengths(9000, 10)),  # later arrivals: a positive duration
    ],
)
@pytest.mark.parametrize("num_requests", [1, 5])
def test_every_request_rejected_is_a_result_with_no_latencies(workload: Workload, num_requests: int) -> None:
    s = simulate(workload, num_requests=num_requests).summary
    assert (s["completed"], s["rejected"]) == (0, num_requests)
    assert s["p99_ttft_ms"] is None and s["mean_itl_ms"] is None and s["max_itl_ms"] is None
    assert s["request_throughput"] == 0.0 and s["duration"] >= 0
    assert list(s["rejected_reasons"].values()) == [num_requests]
    with pytest.raises(ValueError, match="the workload is empty"):
        simulate([])


def test_same_seed_same_result_other_seed_other_result() -> None:
    a = simulate(ARXIV, num_requests=100, seed=3)
    b = simulate(ARXIV, num_requests=100, seed=3)
    c = simulate(ARXIV, num_requests=100, seed=4)
    assert a.records == b.records and a.summary == b.summary
    assert a.records != c.records


def test_goodput_and_steps() -> None:
    result = simulate(ARXIV, num_requests=100, goodput={"ttft": 1e9, "tpot": 1e9}, keep_steps=True)
    s = result.summary
    assert s["request_goodput"] == pytest.approx(s["request_throughput"])
    assert result.steps is not None
    assert sum(result.steps.num_steps) == s["num_steps"]
    assert result.steps.end_s[-1] == s["duration"]
    assert max(result.steps.kv_blocks_used) <= s["num_kv_blocks"]


def test_the_readme_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    section = readme[readme.index("## simulate") :]
    code = section[
        section.index("```python") + len("```python") : section.index("```", section.index("```python") + 9)
    ]
    exec(compile(code, "README.md", "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0].strip() for line in lines] == ["prefill-first", "chunked"]
