"""The offline tokenizer of random models, chat templates, incremental detokenization, sampling."""

from __future__ import annotations

import pytest
import torch

from stallfree.core import SamplingParams
from stallfree.engine.sampler import sample_tokens
from stallfree.engine.tokenizer import (
    RANDOM_BOS_ID,
    detokenize_incrementally,
    random_tokenizer,
)


def test_random_tokenizer_is_deterministic_and_exact_size() -> None:
    from stallfree.engine.tokenizer import _trained_bpe_json

    first = _trained_bpe_json(1024)
    _trained_bpe_json.cache_clear()
    assert _trained_bpe_json(1024) == first
    tokenizer = random_tokenizer(1024)
    assert tokenizer.vocab_size == 1024


def test_random_tokenizer_round_trips_ascii_and_decodes_every_id() -> None:
    tokenizer = random_tokenizer(1024)
    text = "Hello, world! kalo mefi\n  42 {x: y}"
    ids = tokenizer.encode(text)
    assert ids[0] == RANDOM_BOS_ID
    assert tokenizer.decode(ids) == text
    decoded = tokenizer.decode(list(range(3, 1024)))
    assert all(ch.isprintable() or ch == "\n" for ch in decoded)
    with pytest.raises(ValueError, match="vocab_size"):
        random_tokenizer(10)


def test_incremental_detokenization_matches_full_decode() -> None:
    tokenizer = random_tokenizer(1024)
    prompt = tokenizer.encode("Once upon a time")
    generated = tokenizer.encode(" kalo mefi tu, ba zo! and more text here", add_special_tokens=False)
    ids = list(prompt)
    prefix, read = max(0, len(prompt) - 5), len(prompt)
    text = ""
    for token in generated:
        ids.append(token)
        new, prefix, read = detokenize_incrementally(tokenizer, ids, prefix, read)
        text += new
    assert text == tokenizer.decode(generated)


def test_chat_template_renders_messages() -> None:
    tokenizer = random_tokenizer(1024)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi there"}])
    assert "hi there" in prompt and prompt.rstrip().endswith("<|assistant|>")
    tokenizer.chat_template = None
    with pytest.raises(ValueError, match="chat template"):
        tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])


def _generators(n: int, seed: int = 0) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(seed + i) for i in range(n)]


def test_greedy_top_k_1_and_tiny_top_p_pick_the_argmax() -> None:
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    params = [
        SamplingParams(temperature=0),
        SamplingParams(temperature=1.0, top_k=1),
        SamplingParams(temperature=2.0, top_p=1e-6),
        SamplingParams(temperature=0, logprobs=True),
    ]
    picks = sample_tokens(logits, params, _generators(4))
    assert [p.token_id for p in picks] == logits.argmax(-1).tolist()
    expected = torch.log_softmax(logits[3], -1).max().item()
    assert picks[3].logprob == pytest.approx(expected, abs=1e-5)
    assert picks[0].logprob is None


def test_top_k_and_top_p_restrict_the_support() -> None:
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0, -1.0]]).repeat(200, 1)
    top_k = sample_tokens(logits, [SamplingParams(temperature=5.0, top_k=2)] * 200, _generators(200))
    assert {p.token_id for p in top_k} == {0, 1}
    # softmax of [4, 3, 2, ...]: 0.64, 0.24, 0.09, ... -> top_p 0.8 keeps tokens 0 and 1.
    top_p = sample_tokens(logits, [SamplingParams(temperature=1.0, top_p=0.8)] * 200, _generators(200, 1000))
    assert {p.token_id for p in top_p} == {0, 1}


def test_same_generator_seed_same_sample() -> None:
    logits = torch.randn(1, 100, generator=torch.Generator().manual_seed(1))
    params = [SamplingParams(temperature=1.0)]
    draws = [sample_tokens(logits, params, _generators(1, 7))[0].token_id for _ in range(3)]
    assert len(set(draws)) == 1
