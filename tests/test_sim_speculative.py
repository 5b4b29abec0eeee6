"""The simulator's speculative decoding: the acceptance model, the counters, and the trade a
long prompt makes visible under vLLM's and SGLang's rules."""

from __future__ import annotations

import math

import pytest

from stallfree.core import Request, StepPlan, synthetic_plan
from stallfree.core.serving import ServingConfig
from stallfree.costs.choice import CostChoice
from stallfree.sim import Deployment, Speculation, simulate
from stallfree.sim.speculative import Acceptance, DraftVerifier

ROOFLINE = CostChoice(kind="full", model="llama-3-8b", hardware="a100-80gb")


def test_acceptance_per_token_and_per_position() -> None:
    a = Acceptance.per_token(0.7, 3)
    assert a.rates == pytest.approx((0.7, 0.49, 0.343))
    # expected tokens per verify step: (1 - alpha^(k+1)) / (1 - alpha)
    assert 1 + a.mean_accepted(3) == pytest.approx((1 - 0.7**4) / 0.3)
    assert Acceptance.parse("0.8,0.5", 2).rates == (0.8, 0.5)
    assert Acceptance.parse("0.8,0.5", 2).rate(5) == 0.0
    for bad, match in (
        ("0.5,0.7", "must not rise"),
        ("1.5", r"\[0, 1\]"),
        ("x", "a number"),
        ("0.9,0.5", "3 needed"),
    ):
        with pytest.raises(ValueError, match=match):
            Acceptance.parse(bad, 3)


def test_the_verifier_accepts_as_the_model_says_and_counts_like_vllm() -> None:
    acceptance = Acceptance((0.8, 0.5, 0.3, 0.1))
    verifier = DraftVerifier(acceptance, 4, seed=1)
    plan = synthetic_plan(1, 100)
    verify = StepPlan(tuple(c.__class__(c.request_id, 100, 5, 101, num_draft_tokens=4) for c in plan.chunks))
    n = 20_000
    for _ in range(n):
        result = verifier.result(verify, 0.01)
        assert result.num_proposed_drafts == {"decode-0": 4}
    stats = verifier.stats.summary()
    assert stats["spec_decode_num_drafts"] == n and stats["spec_decode_num_draft_tokens"] == 4 * n
    for measured, rate in zip(stats["spec_decode_acceptance_per_position"], acceptance.rates, strict=True):
        assert abs(measured - rate) < 4 * math.sqrt(rate * (1 - rate) / n) + 1e-9
    assert stats["spec_decode_mean_acceptance_length"] == pytest.approx(
        1 + acceptance.mean_accepted(4), abs=0.03
    )
    assert stats["spec_decode_wasted_draft_tokens"] == 4 * n - stats["spec_decode_num_accepted_tokens"]


def streams_and_a_prompt(prompt_tokens: int = 7_000) -> list[Request]:
    """The seed's scenario: 16 streams decoding, then one long prompt arrives."""
    streams = [Request(f"s{i}", 512, 400, 0.0) for i in range(16)]
    return [*streams, Request("long", prompt_tokens, 16, 1.0)]


def run(k: int, rule: str = "vllm", alpha: float = 0.7) -> dict[str, object]:
    serving = ServingConfig(max_num_batched_tokens=512, num_speculative_tokens=k, speculative_rule=rule)
    result = simulate(
        streams_and_a_prompt(),
        Deployment(
            costs=ROOFLINE,
            serving=serving,
            speculation=Speculation(Acceptance.per_token(alpha, k)) if k else None,
        ),
    )
    records = {r.request_id: r for r in result.records}
    assert all(r.num_output_tokens == (16 if rid == "long" else 400) for rid, r in records.items())
    long = records["long"]
    assert long.first_token_s is not None
    streams = [r for rid, r in records.items() if rid != "long"]
    return {
        "ttft_s": long.first_token_s - long.arrival_s,
        "streams_e2e_s": max(r.finish_s for r in streams),
        "max_gap_s": max(r.max_itl_s for r in streams),
        **result.summary,
    }


def test_drafts_speed_the_streams_and_slow_the_prompt_under_vllms_rule() -> None:
    plain, drafted = run(0), run(4)
    assert drafted["streams_e2e_s"] < 0.7 * plain["streams_e2e_s"]  # type: ignore[operator]
    assert drafted["ttft_s"] > 1.1 * plain["ttft_s"]  # type: ignore[operator]
    # no stall either way: the prompt rides in chunks beside the decodes
    assert drafted["max_gap_s"] < 0.2 and plain["max_gap_s"] < 0.2  # type: ignore[operator]
    assert drafted["spec_decode_num_drafts"] and not plain.get("spec_decode_num_drafts")


def test_sglangs_rule_stalls_the_streams_for_the_whole_prompt() -> None:
    vllm, sglang = run(4, "vllm"), run(4, "sglang")
    # prompts run in steps of their own, back to back: every stream waits for the whole prompt
    assert sglang["max_gap_s"] > 0.9 * sglang["ttft_s"] > 5 * vllm["max_gap_s"]  # type: ignore[operator]
    assert sglang["ttft_s"] < vllm["ttft_s"]  # type: ignore[operator]


def test_a_fleet_speculates_on_every_replica() -> None:
    serving = ServingConfig(max_num_batched_tokens=512, num_speculative_tokens=2)
    requests = [Request(f"r{i}", 200, 50, i * 0.05) for i in range(40)]
    result = simulate(
        requests,
        Deployment(
            costs=ROOFLINE, serving=serving, replicas=2, speculation=Speculation(Acceptance.per_token(0.6, 2))
        ),
    )
    assert result.summary["completed"] == 40 and result.summary["total_output_tokens"] == 40 * 50
    assert result.summary["spec_decode_num_drafts"] > 0
    assert all(r["spec_decode_num_drafts"] > 0 for r in result.summary["replicas"])


def test_speculation_needs_an_acceptance_model() -> None:
    with pytest.raises(ValueError, match="acceptance rate"):
        simulate(
            [Request("r", 10, 5)], Deployment(costs=ROOFLINE, serving=ServingConfig(num_speculative_tokens=2))
        )


def test_drafting_is_priced_by_method_and_lengthens_the_step() -> None:
    from stallfree.costs.choice import pick_cost_model
    from stallfree.sim.speculative import draft_pricer

    target = pick_cost_model(CostChoice(kind="full", model="llama-3.1-70b", hardware="a100-80gb", tp=4))
    acceptance = Acceptance.per_token(0.7, 3)
    plan = synthetic_plan(8, 1000)
    assert DraftVerifier(acceptance, 3, draft_pass=draft_pricer("ngram", target)).drafting_s(plan) == 0.0
    eagle = DraftVerifier(acceptance, 3, draft_pass=draft_pricer("eagle", target)).drafting_s(plan)
    # three passes of one of the 80 layers' share of the 8-stream decode step
    assert eagle == pytest.approx(3 * target.pricer.decode_step_s(8, 1001) / 80)
    model = DraftVerifier(acceptance, 3, draft_pass=draft_pricer("model:llama-3-8b", target)).drafting_s(plan)
    draft = pick_cost_model(CostChoice(kind="full", model="llama-3-8b", hardware="a100-80gb", tp=4))
    assert model == pytest.approx(3 * draft.pricer.decode_step_s(8, 1001)) and model > eagle
    serving = ServingConfig(max_num_batched_tokens=512, num_speculative_tokens=3)
    requests = [Request(f"r{i}", 300, 60, 0.0) for i in range(8)]
    runs = {
        d: simulate(
            requests, Deployment(costs=ROOFLINE, serving=serving, speculation=Speculation(acceptance, d))
        ).summary["median_tpot_ms"]
        for d in ("ngram", "eagle", "model:llama-3-8b")
    }
    assert runs["ngram"] < runs["eagle"] < runs["model:llama-3-8b"]
    with pytest.raises(ValueError, match="unknown draft method"):
        draft_pricer("medusa", target)


def test_acceptance_from_a_bench_results_counters() -> None:
    # 4 requests, 100 tokens each: 396 tokens after the first ones, 96 of them accepted drafts, so
    # 300 decode steps; 60 of them verified drafts
    result = {
        "total_output_tokens": 400,
        "completed": 4,
        "spec_decode": {"num_drafts": 60, "num_accepted_tokens": 96, "acceptance_per_position": [0.9, 0.7]},
    }
    acceptance = Acceptance.from_bench_result(result)
    assert acceptance.rates == (0.9, 0.7) and acceptance.proposal_rate == pytest.approx(60 / 300)
    with pytest.raises(ValueError, match="no spec-decode counters"):
        Acceptance.from_bench_result({"total_output_tokens": 10, "completed": 1})
