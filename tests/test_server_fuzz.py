"""Hypothesis fuzz of request bodies against a real server: never a 5xx, and the engine survives.

(schemathesis is not installed; these strategies mix the fields of the OpenAPI schema with
wrong types, out-of-range values and junk keys.)
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stallfree.server.launch import ServerThread, build_server

MODEL = "random:tiny"

_junk = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
_small_tokens = st.integers(min_value=-2, max_value=4)
_fields: dict[str, st.SearchStrategy[Any]] = {
    "model": st.sampled_from([MODEL, "other", ""]) | _junk,
    "max_tokens": _small_tokens | st.sampled_from([10**30, 2000]) | _junk,
    "max_completion_tokens": _small_tokens | _junk,
    "temperature": st.floats(min_value=-1, max_value=1e300) | st.sampled_from([0, 1e-300, 1e-6]) | _junk,
    "top_p": st.floats(min_value=-1, max_value=2) | _junk,
    "top_k": st.integers(min_value=-3, max_value=2000) | _junk,
    "n": st.integers(min_value=-1, max_value=3) | _junk,
    "seed": st.integers(min_value=-(2**65), max_value=2**65) | _junk,
    "stop": st.text(max_size=3) | st.lists(st.text(max_size=3), max_size=3) | _junk,
    "stream": st.booleans() | _junk,
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans() | _junk}) | _junk,
    "ignore_eos": st.booleans() | _junk,
    "logprobs": st.none() | st.booleans() | st.integers(0, 3) | _junk,
    "echo": st.booleans() | _junk,
}
_prompt = (
    st.text(max_size=40)
    | st.lists(st.integers(min_value=-5, max_value=2000), max_size=8)
    | st.lists(st.text(max_size=10), max_size=3)
    | _junk
)
_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant"]) | _junk},
    optional={
        "content": st.text(max_size=30)
        | st.lists(
            st.fixed_dictionaries({"type": st.just("text") | _junk, "text": st.text(max_size=10)}), max_size=2
        )
        | _junk
    },
)


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    app = build_server(MODEL, dtype="float32", device="cpu", token_budget=64, num_blocks=2048)
    with ServerThread(app) as server, httpx.Client(base_url=server.base_url, timeout=30) as http:
        yield http
        assert http.get("/health").status_code == 200  # the engine thread survived everything


def _post(client: httpx.Client, path: str, body: Any) -> None:
    # json.dumps writes NaN / Infinity too: bodies a sloppy client may send.
    headers = {"content-type": "application/json"}
    response = client.post(path, content=json.dumps(body), headers=headers)
    assert response.status_code < 500, response.text
    if response.status_code != 200:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["code"] == response.status_code or (response.status_code, error["code"]) == (
            404,
            "model_not_found",
        )


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.fixed_dictionaries({}, optional={**_fields, "prompt": _prompt}) | _junk)
def test_completion_bodies_never_5xx(client: httpx.Client, body: Any) -> None:
    _post(client, "/v1/completions", body)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    body=st.fixed_dictionaries({}, optional={**_fields, "messages": st.lists(_message, max_size=3) | _junk})
    | _junk
)
def test_chat_bodies_never_5xx(client: httpx.Client, body: Any) -> None:
    _post(client, "/v1/chat/completions", body)


# Well-formed values at their edges: these requests reach the engine and must not break it.
_edge_fields: dict[str, st.SearchStrategy[Any]] = {
    "temperature": st.sampled_from([0, 1e-300, 1e-6, 1e-5, 0.5, 1, 1e30, 1e300]) | st.floats(0, 10),
    "top_p": st.sampled_from([1e-300, 1e-9, 0.5, 1]) | st.floats(1e-9, 1),
    "top_k": st.sampled_from([0, 1, 1023, 1024, 10**9]),
    "seed": st.sampled_from([0, 2**63 - 1]) | st.integers(0, 2**63 - 1),
    "stop": st.lists(st.text(max_size=3), max_size=4),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "ignore_eos": st.booleans(),
}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    body=st.fixed_dictionaries(
        {
            "model": st.just(MODEL),
            "max_tokens": st.integers(min_value=1, max_value=4),
            "prompt": st.text(min_size=1, max_size=30) | st.lists(st.integers(0, 1023), min_size=1),
        },
        optional=_edge_fields,
    )
)
def test_edge_value_completions_never_5xx(client: httpx.Client, body: Any) -> None:
    _post(client, "/v1/completions", body)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    body=st.fixed_dictionaries(
        {
            "model": st.just(MODEL),
            "max_tokens": st.integers(min_value=1, max_value=4),
            "messages": st.lists(
                st.fixed_dictionaries(
                    {"role": st.sampled_from(["user", "system"]), "content": st.text(max_size=20)}
                ),
                min_size=1,
                max_size=3,
            ),
        },
        optional=_edge_fields,
    )
)
def test_edge_value_chats_never_5xx(client: httpx.Client, body: Any) -> None:
    _post(client, "/v1/chat/completions", body)
