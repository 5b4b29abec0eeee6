"""The engine's speculative decoding: n-gram drafts verified for real, greedy output unchanged,
sampling's distribution kept, KV slots of rejected drafts handed back."""

from __future__ import annotations

import random

import pytest
import torch

from stallfree.core import SamplingParams
from stallfree.engine import LLMEngine
from stallfree.engine.drafts import DraftCost, DraftHistory, propose_ngram
from stallfree.engine.sampler import verify_drafts

MODEL = "random:tiny"  # fp32 below: the decode and chunk kernels then round alike
# Prompts whose continuation repeats them (lookup pays), and ones where it does not.
REPEATING = ["kalo mefi tu ba " * 6, "a b c d e f g a b c d e f g a b c", "the quick brown fox " * 4]
FREE = ["Hello there", "x"]


def reference_ngram(tokens: list[int], k: int, low: int, high: int) -> list[int]:
    """The rule in plain Python: the longest suffix of low..high tokens seen before, its latest
    earlier occurrence, the k tokens after it."""
    for n in range(min(high, len(tokens) - 1), low - 1, -1):
        suffix = tokens[len(tokens) - n :]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + k]
    return []


def test_ngram_lookup_follows_the_rule() -> None:
    assert propose_ngram([1, 2, 3, 4, 5, 1, 2, 3], 3, 1, 3) == [4, 5, 1]
    assert propose_ngram([5, 6, 7], 2, 1, 2) == []
    rng = random.Random(0)
    for _ in range(3000):  # token ids whose bytes straddle: 256 and 65536 share bytes with 1 and 0
        tokens = [rng.choice([0, 1, 7, 256, 65536]) for _ in range(rng.randint(0, 14))]
        k, low = rng.randint(0, 4), rng.randint(1, 3)
        high = rng.randint(low, 4)
        assert propose_ngram(tokens, k, low, high) == reference_ngram(tokens, k, low, high)


def run(
    prompts: list[str], params: SamplingParams, k: int, **options: object
) -> tuple[list[list[int]], LLMEngine, dict[str, int]]:
    """Each prompt's output tokens, the engine, and how many drafts were accepted and how many
    steps carried both drafts and a prompt chunk."""
    engine = LLMEngine(
        MODEL,
        dtype="float32",
        device="cpu",
        block_size=4,
        num_blocks=256,
        token_budget=24,
        max_num_seqs=8,
        num_speculative_tokens=k,
        prompt_lookup_min=1,
        prompt_lookup_max=3,
        adaptive_drafts=False,  # every draft a lookup finds, whatever this machine's load
        **options,
    )
    ids = [engine.add_request(prompt=p, sampling_params=params) for p in prompts]
    out: dict[str, list[int]] = {}
    seen = {"accepted": 0, "mixed": 0}
    while engine.has_unfinished_requests():
        step = engine.step()
        for o in step.outputs:
            out[o.request_id] = list(o.token_ids)
        if step.step is not None:
            plan = step.step.plan
            seen["accepted"] += sum(step.step.events.num_accepted_drafts.values())
            seen["mixed"] += bool(plan.num_draft_tokens and plan.num_prefill_tokens)
        assert (
            engine.scheduler.block_manager.num_used_blocks
            == sum(
                engine.scheduler.block_manager.blocks_for(s.num_computed_tokens)
                for s in engine.scheduler.running
            )
            or step.step is None
            or any(c.num_draft_tokens for c in step.step.plan.chunks) is False
        )
        runner, bm = engine.model_runner, engine.scheduler.block_manager
        for seq in engine.scheduler.running:  # the runner's tables follow the scheduler's trims
            assert runner.block_tables.get(seq.request_id, [])[: len(bm.block_table(seq.request_id))] == list(
                bm.block_table(seq.request_id)
            )
    return [out[i] for i in ids], engine, seen


def test_greedy_output_is_the_same_with_drafts_and_drafts_are_accepted() -> None:
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    prompts = REPEATING + FREE  # several streams, chunks and drafts in the same steps (budget 24)
    plain, _, _ = run(prompts, params, 0)
    drafted, engine, seen = run(prompts, params, 4)
    assert drafted == plain
    assert seen["accepted"] > 10 and seen["mixed"] > 0
    last = engine.last_step
    assert last is not None


def test_drafts_shorten_the_run_where_lookup_pays() -> None:
    params = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
    steps = {}
    for k in (0, 4):
        engine = LLMEngine(
            MODEL,
            dtype="float32",
            device="cpu",
            block_size=4,
            num_blocks=256,
            num_speculative_tokens=k,
            prompt_lookup_min=1,
            prompt_lookup_max=3,
            adaptive_drafts=False,
        )
        engine.add_request(prompt=REPEATING[2], sampling_params=params)
        n = accepted = 0
        while engine.has_unfinished_requests():
            out = engine.step()
            n += out.ran
            if out.step is not None:
                accepted += sum(out.step.events.num_accepted_drafts.values())
        steps[k] = (n, accepted)
    # the tiny random model repeats itself: lookup guesses right often enough to save steps
    assert steps[4][1] > 0 and steps[4][0] + steps[4][1] == steps[0][0]


def test_a_stop_among_accepted_drafts_ends_the_request_there() -> None:
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    (plain,), _, _ = run([REPEATING[0]], params, 0)
    stop_at = plain[10]
    stopping = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, stop_token_ids=(stop_at,))
    (a,), _, _ = run([REPEATING[0]], stopping, 0)
    (b,), engine, _ = run([REPEATING[0]], stopping, 4)
    assert a == b == plain[: plain.index(stop_at) + 1]
    assert engine.scheduler.block_manager.num_used_blocks == 0


def test_sampling_with_drafts_keeps_the_distribution() -> None:
    # Speculative sampling: whatever the drafts, each emitted token follows the target p.
    torch.manual_seed(0)
    vocab = 6
    logits = torch.randn(3, vocab) * 1.5
    params = SamplingParams(temperature=0.8, top_k=5, max_tokens=4)
    target = [
        torch.softmax(torch.where(row < row.topk(5).values[-1], float("-inf"), row / 0.8), -1)
        for row in logits
    ]
    drafts = [int(target[0].argmin()) if target[0].argmin() < vocab else 0, 2]
    generator = torch.Generator().manual_seed(1)
    n = 40_000
    first = torch.zeros(vocab)
    second = torch.zeros(vocab)
    num_second = 0
    for _ in range(n):
        tokens = verify_drafts(logits, drafts, params, generator)
        first[tokens[0]] += 1
        if tokens[0] == drafts[0]:
            num_second += 1
            second[tokens[1]] += 1
    for counts, total, p in ((first, n, target[0]), (second, num_second, target[1])):
        expected = p * total
        sigma = torch.sqrt(total * p * (1 - p)) + 1e-9
        assert torch.all((counts - expected).abs() <= 5 * sigma + 1), (counts, expected)
    assert first[5 - 0].item() >= 0  # every index reachable is counted (shape check)


def test_greedy_verification_keeps_the_argmax_prefix() -> None:
    logits = torch.full((4, 5), -1.0)
    for row, best in enumerate([2, 3, 4, 1]):
        logits[row, best] = 1.0
    greedy = SamplingParams(temperature=0)
    assert verify_drafts(logits, [2, 3, 4], greedy, torch.Generator()) == [2, 3, 4, 1]
    assert verify_drafts(logits, [2, 0, 4], greedy, torch.Generator()) == [2, 3]
    assert verify_drafts(logits, [0, 3, 4], greedy, torch.Generator()) == [2]


@pytest.mark.parametrize("k", [0, 3])
def test_the_engine_refuses_a_bad_lookup_range(k: int) -> None:
    with pytest.raises(ValueError, match="prompt_lookup_min 4 must be <= prompt_lookup_max 2"):
        LLMEngine("random:tiny", prompt_lookup_min=4, prompt_lookup_max=2, num_speculative_tokens=k)


def test_drafts_are_proposed_where_they_pay_for_their_rows() -> None:
    cost = DraftCost(step_s=0.020, row_s=0.002)
    assert cost.threshold(1) == pytest.approx(0.1)  # one stream: a row is a tenth of the step
    assert cost.threshold(16) == pytest.approx(0.032 / 0.050)  # sixteen: rows are most of it
    history = DraftHistory()  # prior: one in two
    assert history.length(4, cost.threshold(1)) == 3  # 0.5 ** 3 >= 0.1 > 0.5 ** 4
    for _ in range(10):
        history.verified(4, 0)  # every first draft rejected
    # stopped, but probes with one draft now and then, and recovers once guesses land
    probes = [history.length(4, cost.threshold(1)) for _ in range(DraftHistory.PROBE_EVERY)]
    assert probes == [0] * (DraftHistory.PROBE_EVERY - 1) + [1]
    for _ in range(10):
        history.verified(4, 4)
    assert history.length(4, cost.threshold(16)) == 4


def test_adaptive_drafts_measure_a_rows_cost_and_start_from_the_prior() -> None:
    engine = LLMEngine(MODEL, dtype="float32", device="cpu", num_blocks=64, num_speculative_tokens=3)
    cost = engine.draft_cost
    assert cost is not None and cost.step_s > 0 and cost.row_s >= 0
    fixed = LLMEngine(
        MODEL, dtype="float32", device="cpu", num_blocks=64, num_speculative_tokens=3, adaptive_drafts=False
    )
    assert fixed.draft_cost is None
