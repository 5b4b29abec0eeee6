"""logprobs, n > 1, prompt lists and echo through the official ``openai`` client (random:tiny)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from stallfree.server.launch import ServerThread, build_server

MODEL = "random:tiny"
NO_EOS = {"ignore_eos": True}


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    app = build_server(MODEL, dtype="float32", device="cpu", token_budget=128, num_blocks=1024)
    with ServerThread(app) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0)


def test_completion_logprobs_whole_and_streamed(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "prompt": "the cat",
        "max_tokens": 6,
        "temperature": 0,
        "logprobs": 3,
    }
    whole = client.completions.create(**kwargs, extra_body=NO_EOS)
    lp = whole.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None
    assert lp.top_logprobs is not None and lp.text_offset is not None
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    assert "".join(lp.tokens) == whole.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(6)]
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert logprob <= 0 and 1 <= len(top) <= 4  # 3 alternatives (+ the sampled token)
        assert math.isclose(max(top.values()), logprob, abs_tol=1e-5)  # greedy: the sampled is the top
        assert top[token] == logprob
        assert sum(math.exp(v) for v in top.values()) <= 1 + 1e-4

    chunks = [c for c in client.completions.create(**kwargs, stream=True, extra_body=NO_EOS) if c.choices]
    streamed = [t for c in chunks for t in (c.choices[0].logprobs.token_logprobs or [])]
    assert streamed == pytest.approx(lp.token_logprobs, abs=1e-5)
    offsets = [o for c in chunks for o in (c.choices[0].logprobs.text_offset or [])]
    assert offsets == lp.text_offset


def test_completion_without_logprobs_has_none(client: openai.OpenAI) -> None:
    out = client.completions.create(model=MODEL, prompt="x", max_tokens=2)
    assert out.choices[0].logprobs is None


def test_chat_logprobs_and_top_logprobs(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "hello"}]
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": 5,
        "seed": 4,
        "logprobs": True,
    }
    whole = client.chat.completions.create(**kwargs, top_logprobs=2, extra_body=NO_EOS)
    content = whole.choices[0].logprobs.content
    assert content is not None and len(content) == 5
    assert "".join(t.token for t in content) == whole.choices[0].message.content
    for entry in content:
        assert entry.logprob <= 0 and entry.bytes == list(entry.token.encode())
        assert len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
    plain = client.chat.completions.create(**kwargs, extra_body=NO_EOS)
    assert all(e.top_logprobs == [] for e in plain.choices[0].logprobs.content)

    stream = client.chat.completions.create(**kwargs, top_logprobs=2, stream=True, extra_body=NO_EOS)
    streamed = [
        e for c in stream if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content
    ]
    assert [e.token for e in streamed] == [e.token for e in content]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in content], abs=1e-5)


def test_n_samples_are_seeded_independent_requests(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {"model": MODEL, "prompt": "once upon", "max_tokens": 8, "extra_body": NO_EOS}
    many = client.completions.create(**kwargs, n=3, seed=10)
    assert [c.index for c in many.choices] == [0, 1, 2]
    singles = [client.completions.create(**kwargs, seed=10 + j).choices[0].text for j in range(3)]
    assert [c.text for c in many.choices] == singles  # choice j is the request with seed + j
    assert len(set(singles)) > 1  # independent samples
    one = client.completions.create(**kwargs, seed=10)
    assert many.usage is not None and one.usage is not None
    assert many.usage.completion_tokens == 3 * 8
    assert many.usage.prompt_tokens == one.usage.prompt_tokens  # the prompt counts once

    stream = client.completions.create(**kwargs, n=3, seed=10, stream=True)
    texts: dict[int, str] = defaultdict(str)
    finishes: dict[int, str | None] = {}
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            finishes[choice.index] = choice.finish_reason
    assert [texts[i] for i in range(3)] == singles
    assert finishes == {0: "length", 1: "length", 2: "length"}


def test_chat_n_streams_carry_their_index(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "hi"}]
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": 4,
        "seed": 1,
        "extra_body": NO_EOS,
    }
    whole = client.chat.completions.create(**kwargs, n=2)
    assert [c.index for c in whole.choices] == [0, 1]
    texts: dict[int, str] = defaultdict(str)
    for chunk in client.chat.completions.create(**kwargs, n=2, stream=True):
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    assert [texts[0], texts[1]] == [c.message.content for c in whole.choices]


def test_prompt_list_choices_in_prompt_order_times_n(client: openai.OpenAI) -> None:
    prompts = ["alpha beta", "gamma", "delta epsilon zeta"]
    kwargs: dict[str, Any] = {"model": MODEL, "max_tokens": 5, "temperature": 0, "extra_body": NO_EOS}
    out = client.completions.create(prompt=prompts, n=2, **kwargs)
    assert [c.index for c in out.choices] == list(range(6))
    alone = [client.completions.create(prompt=p, **kwargs) for p in prompts]
    assert [c.text for c in out.choices] == [a.choices[0].text for a in alone for _ in range(2)]
    assert out.usage is not None
    assert out.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert out.usage.completion_tokens == 6 * 5
    ids = client.completions.create(prompt=[[1, 5, 9], [1, 7]], **kwargs)
    assert len(ids.choices) == 2 and ids.usage is not None and ids.usage.prompt_tokens == 5


def test_echo_prepends_the_prompt(client: openai.OpenAI) -> None:
    prompt = "echo this"
    kwargs: dict[str, Any] = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": 4,
        "temperature": 0,
        "extra_body": NO_EOS,
    }
    plain = client.completions.create(**kwargs)
    echoed = client.completions.create(**kwargs, echo=True, logprobs=1)
    assert echoed.choices[0].text == prompt + plain.choices[0].text
    lp = echoed.choices[0].logprobs
    assert lp is not None and lp.token_logprobs is not None and lp.top_logprobs is not None
    num_prompt = echoed.usage.prompt_tokens
    assert len(lp.token_logprobs) == num_prompt + 4
    assert lp.token_logprobs[:num_prompt] == [None] * num_prompt  # prompt positions are not scored
    assert lp.top_logprobs[:num_prompt] == [None] * num_prompt
    assert all(v is not None for v in lp.token_logprobs[num_prompt:])
    streamed = "".join(
        c.choices[0].text for c in client.completions.create(**kwargs, echo=True, stream=True) if c.choices
    )
    assert streamed == echoed.choices[0].text


@pytest.mark.parametrize(
    ("route", "body", "param"),
    [
        ("chat/completions", {"messages": [{"role": "user", "content": "x"}], "echo": True}, "echo"),
        ("chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 0}, "n"),
        ("chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 100}, "n"),
        (
            "chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 21},
            "top_logprobs",
        ),
        (
            "chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
            "top_logprobs",
        ),
        ("completions", {"prompt": "x", "logprobs": 50}, "logprobs"),
        ("completions", {"prompt": "x", "n": 0}, "n"),
    ],
)
def test_bad_feature_values_are_openai_400s(
    server: ServerThread, route: str, body: dict[str, object], param: str
) -> None:
    response = httpx.post(f"{server.base_url}/v1/{route}", json={"model": MODEL, **body})
    assert response.status_code == 400
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["code"] == 400
    assert error["param"] == param and error["message"]
