"""A real server on 127.0.0.1 (random:tiny, fp32) driven by the official ``openai`` client."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import openai
import pytest

from stallfree.server.launch import ServerThread, build_server

MODEL = "random:tiny"
KEY = "test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    app = build_server(
        MODEL,
        api_key=KEY,
        dtype="float32",
        device="cpu",
        token_budget=128,
        num_blocks=1024,
        max_waiting_requests=512,
    )
    with ServerThread(app) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=KEY, max_retries=0)


def _tokenizer(server: ServerThread):  # type: ignore[no-untyped-def]
    return server.app.state.engine_thread.engine.tokenizer


def test_completion_whole_and_streamed_agree(server: ServerThread, client: openai.OpenAI) -> None:
    prompt = "the quick brown fox"
    extra = {"ignore_eos": True}
    whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, seed=7, extra_body=extra)
    assert whole.object == "text_completion"
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage is not None
    assert whole.usage.completion_tokens == 12
    assert whole.usage.prompt_tokens == len(_tokenizer(server).encode(prompt))

    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt=prompt,
            max_tokens=12,
            seed=7,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=extra,
        )
    )
    text_chunks = [c for c in chunks if c.choices]
    assert len(text_chunks) == 12  # one chunk per sampled token
    assert "".join(c.choices[0].text for c in text_chunks) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in text_chunks][-1] == "length"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.total_tokens == whole.usage.total_tokens


def test_completion_accepts_token_ids(client: openai.OpenAI) -> None:
    out = client.completions.create(
        model=MODEL, prompt=[1, 50, 60, 70], max_tokens=3, extra_body={"ignore_eos": True}
    )
    assert out.usage is not None
    assert out.usage.prompt_tokens == 4
    assert out.usage.completion_tokens == 3


def test_chat_whole_and_streamed_agree(client: openai.OpenAI) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, seed=3)  # type: ignore[arg-type]
    assert whole.object == "chat.completion"
    assert whole.id.startswith("chatcmpl-")
    assert whole.choices[0].message.role == "assistant"
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=8,
        seed=3,
        stream=True,
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_stop_string_ends_the_completion(client: openai.OpenAI) -> None:
    free = client.completions.create(model=MODEL, prompt="abc", max_tokens=40, seed=1, temperature=0)
    text = free.choices[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    if not stop.strip():
        pytest.skip("greedy text has no usable stop string")
    cut = client.completions.create(
        model=MODEL, prompt="abc", max_tokens=40, seed=1, temperature=0, stop=[stop]
    )
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == text[: text.find(stop)]


def test_models_health_and_metrics(server: ServerThread, client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]
    assert httpx.get(f"{server.base_url}/health").status_code == 200
    client.completions.create(model=MODEL, prompt="count me", max_tokens=4, extra_body={"ignore_eos": True})
    text = httpx.get(f"{server.base_url}/metrics").text
    values = {
        line.split(" ")[0].split("{")[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    assert values["stallfree:generation_tokens_total"] >= 4
    assert values["stallfree:time_to_first_token_seconds_count"] >= 1
    assert values["stallfree:inter_token_latency_seconds_count"] >= 3
    assert "stallfree:kv_cache_usage_perc" in values
    assert "stallfree:num_requests_running" in values


def test_64_concurrent_streams_all_finish(server: ServerThread) -> None:
    async def one(client: openai.AsyncOpenAI, i: int) -> tuple[int, str | None]:
        stream = await client.completions.create(
            model=MODEL, prompt=f"stream {i}", max_tokens=10, stream=True, extra_body={"ignore_eos": True}
        )
        chunks = [c async for c in stream]
        return len(chunks), chunks[-1].choices[0].finish_reason

    async def main() -> list[tuple[int, str | None]]:
        client = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key=KEY, max_retries=0)
        async with client:
            return await asyncio.gather(*(one(client, i) for i in range(64)))

    assert asyncio.run(main()) == [(10, "length")] * 64


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": MODEL, "prompt": "hi", "max_tokens": "many"}, "max_tokens"),
        ({"model": MODEL, "prompt": 12}, "prompt"),
        ({"model": MODEL, "prompt": "hi", "max_tokens": 0}, "max_tokens"),
        ({"model": MODEL, "prompt": "hi", "max_tokens": 2000}, "max_tokens"),
        ({"model": MODEL, "prompt": "zq " * 1500}, "prompt"),
        ({"model": MODEL, "prompt": "hi", "n": 0}, "n"),
        ({"model": MODEL, "prompt": "hi", "n": 17}, "n"),
        ({"model": MODEL, "prompt": "hi", "logprobs": 21}, "logprobs"),
        ({"model": MODEL, "prompt": "hi", "logprobs": -1}, "logprobs"),
        ({"model": MODEL, "prompt": []}, "prompt"),
        ({"model": MODEL, "prompt": ["a", "zq " * 1500]}, "prompt"),
        ({"model": MODEL, "prompt": "hi", "temperature": -1}, "temperature"),
        ({"prompt": "hi"}, "model"),
    ],
)
def test_bad_completion_requests_are_400_with_openai_shape(
    server: ServerThread, body: dict[str, object], param: str
) -> None:
    response = httpx.post(f"{server.base_url}/v1/completions", json=body, headers=AUTH)
    assert response.status_code == 400
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["param"] is not None and error["param"].split(".")[0] == param
    assert error["message"]


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b"[1, 2]",
        b'{"model": "random:tiny", "prompt": "x", "temperature": NaN}',
        b'{"model": "random:tiny", "prompt": [1, 999999]}',
    ],
)
def test_malformed_bodies_are_400(server: ServerThread, content: bytes) -> None:
    response = httpx.post(
        f"{server.base_url}/v1/completions",
        content=content,
        headers={**AUTH, "content-type": "application/json"},
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == 400


def test_chat_validation(server: ServerThread) -> None:
    url = f"{server.base_url}/v1/chat/completions"
    assert httpx.post(url, json={"model": MODEL, "messages": []}, headers=AUTH).status_code == 400
    bad_role = {"model": MODEL, "messages": [{"role": 3, "content": "x"}]}
    assert httpx.post(url, json=bad_role, headers=AUTH).status_code == 400


def test_api_key_is_required_on_v1_routes(server: ServerThread) -> None:
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 1}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        response = httpx.post(f"{server.base_url}/v1/completions", json=body, headers=headers)
        assert response.status_code == 401
        assert response.json()["error"]["type"] == "authentication_error"
    wrong = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    assert httpx.get(f"{server.base_url}/health").status_code == 200  # probes need no key


def test_unknown_routes_and_methods_answer_openai_errors(server: ServerThread) -> None:
    for response in (
        httpx.get(f"{server.base_url}/nope"),
        httpx.get(f"{server.base_url}/v1/completions", headers=AUTH),
    ):
        assert response.status_code in (404, 405)
        assert response.json()["error"]["type"] in ("not_found_error", "invalid_request_error")
    assert httpx.get(f"{server.base_url}/openapi.json").json()["paths"].keys() >= {
        "/v1/completions",
        "/v1/chat/completions",
    }


def test_malformed_json_error_names_no_parameter(server: ServerThread) -> None:
    response = httpx.post(
        f"{server.base_url}/v1/completions",
        content=b'{"model": "random:tiny", "prompt": "hi",,}',
        headers={**AUTH, "content-type": "application/json"},
    )
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] is None
    assert (
        error["message"].startswith("the request body is not valid JSON")
        and "at character" in error["message"]
    )


def test_unknown_chat_role_is_400(server: ServerThread) -> None:
    body = {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}], "max_tokens": 1}
    response = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, headers=AUTH)
    assert response.status_code == 400
    assert "unknown role 'wizard'" in response.json()["error"]["message"]


def test_health_has_a_body(server: ServerThread) -> None:
    response = httpx.get(f"{server.base_url}/health")
    assert response.status_code == 200 and response.json() == {"status": "ok"}


def test_tokenize_counts_as_completions_do(server: ServerThread, client: openai.OpenAI) -> None:
    prompt = "count these words, please"
    response = httpx.post(
        f"{server.base_url}/tokenize", json={"model": MODEL, "prompt": prompt}, headers=AUTH
    )
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1)
    assert out.usage is not None and response.json()["count"] == out.usage.prompt_tokens
    assert httpx.post(f"{server.base_url}/tokenize", json={"prompt": prompt}).status_code == 401


def _metric(server: ServerThread, name: str) -> float:
    for line in httpx.get(f"{server.base_url}/metrics").text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def test_a_repeated_prompt_is_served_from_the_prefix_cache(
    server: ServerThread, client: openai.OpenAI
) -> None:
    """The server caches prompt prefixes by default (as vLLM): the second of two equal prompts
    finds all its full blocks but the last token's in the cache, and /metrics counts them."""
    prompt = "a long shared system prompt, " * 8
    num_tokens = len(_tokenizer(server).encode(prompt))
    before = _metric(server, "stallfree:prefix_cache_hits_total")
    texts = [
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=5, temperature=0).choices[0].text
        for _ in range(2)
    ]
    assert texts[0] == texts[1]
    hits = _metric(server, "stallfree:prefix_cache_hits_total") - before
    assert hits == (num_tokens - 1) // 16 * 16
    assert _metric(server, "stallfree:prefix_cache_queries_total") >= 2 * num_tokens
