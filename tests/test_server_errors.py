"""Errors a client can act on: bodies that are not JSON or not objects, missing parameters named,
an unknown model answered as OpenAI does (404 ``model_not_found``), unknown fields accepted but named."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import httpx
import openai
import pytest

from stallfree.server.app import IGNORED_FIELDS_HEADER, MAX_LISTED_FIELDS
from stallfree.server.launch import ServerThread, build_server

MODEL = "random:tiny"
APP_LOGGER = "stallfree.server.app"


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    app = build_server(MODEL, dtype="float32", device="cpu", token_budget=64, num_blocks=256)
    with ServerThread(app) as running:
        yield running


def _error(response: httpx.Response, status_code: int) -> dict[str, object]:
    assert response.status_code == status_code, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    return error  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("content", "content_type", "sent"),
    [
        (b"hello", None, "no content-type"),
        (b'{"model": "random:tiny", "prompt": "hi"}', None, "no content-type"),
        (b'{"model": "random:tiny", "prompt": "hi"}', "application/x-www-form-urlencoded", "content-type "),
        (b"model=random:tiny", "text/plain", "content-type text/plain"),
    ],
)
def test_a_body_not_sent_as_json_says_so(
    server: ServerThread, content: bytes, content_type: str | None, sent: str
) -> None:
    headers = {"content-type": content_type} if content_type else {}
    response = httpx.post(f"{server.base_url}/v1/completions", content=content, headers=headers)
    error = _error(response, 400)
    assert "valid dictionary" not in str(error["message"])
    assert str(error["message"]).startswith("the request body is not JSON")
    assert sent in str(error["message"]) and "Content-Type: application/json" in str(error["message"])
    assert error["param"] is None and error["code"] == 400


@pytest.mark.parametrize(
    ("content", "what"),
    [(b"hello", None), (b"[1, 2]", "an array"), (b'"hi"', "a string"), (b"null", "null"), (b"3", "a number")],
)
def test_json_bodies_that_are_not_objects_say_what_they_are(
    server: ServerThread, content: bytes, what: str | None
) -> None:
    response = httpx.post(
        f"{server.base_url}/v1/chat/completions",
        content=content,
        headers={"content-type": "application/json"},
    )
    message = str(_error(response, 400)["message"])
    if what is None:
        assert message.startswith("the request body is not valid JSON")
    else:
        assert message == f"the request body must be a JSON object, not {what}"


@pytest.mark.parametrize(
    ("route", "required"),
    [
        ("/v1/completions", ["model", "prompt"]),
        ("/v1/chat/completions", ["model", "messages"]),
        ("/tokenize", ["prompt"]),
    ],
)
@pytest.mark.parametrize("content_type", [None, "application/json"])
def test_an_empty_body_names_the_missing_parameters(
    server: ServerThread, route: str, required: list[str], content_type: str | None
) -> None:
    headers = {"content-type": content_type} if content_type else {}
    error = _error(httpx.post(f"{server.base_url}{route}", content=b"", headers=headers), 400)
    assert error["param"] == ",".join(required)
    message = str(error["message"])
    assert message.startswith("the request body is empty") and "Field required" not in message
    assert all(f"'{name}'" in message for name in required)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "model,prompt"),
        ({"prompt": "hi"}, "model"),
        ({"model": MODEL}, "prompt"),
        ({"model": MODEL, "prompt": "hi", "stream_options": {}}, None),  # include_usage has a default
    ],
)
def test_missing_parameters_are_named(
    server: ServerThread, body: dict[str, object], param: str | None
) -> None:
    response = httpx.post(f"{server.base_url}/v1/completions", json={"max_tokens": 1, **body})
    if param is None:
        assert response.status_code == 200
        return
    error = _error(response, 400)
    assert error["param"] == param
    assert all(f"'{name}'" in str(error["message"]) for name in param.split(","))
    assert str(error["message"]).startswith("missing required parameter")


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_an_unknown_model_is_404_model_not_found(server: ServerThread, route: str, stream: bool) -> None:
    body = {
        "model": "gpt-4",
        "prompt": "hi",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": stream,
    }
    error = _error(httpx.post(f"{server.base_url}{route}", json=body), 404)
    assert error["code"] == "model_not_found" and error["param"] == "model"
    assert error["message"] == f"The model `gpt-4` does not exist; this server serves `{MODEL}`."


def test_the_openai_client_sees_not_found_with_its_code(server: ServerThread) -> None:
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.NotFoundError) as caught:
        client.completions.create(model="gpt-4", prompt="hi", max_tokens=1)
    assert caught.value.code == "model_not_found"


def _ignored_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == APP_LOGGER and r.levelno == logging.WARNING]


def test_unknown_fields_are_accepted_named_in_a_header_and_logged_once(
    server: ServerThread, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=APP_LOGGER)
    url = f"{server.base_url}/v1/completions"
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 1, "frobnicate": 1, "presence_penalty": 0.5}
    for _ in range(3):
        response = httpx.post(url, json=body)
        assert response.status_code == 200
        assert response.headers[IGNORED_FIELDS_HEADER] == "frobnicate,presence_penalty"
    assert _ignored_warnings(caplog) == [
        "ignored request fields (this server does not use them): frobnicate,presence_penalty"
    ]
    other = httpx.post(url, json={**body, "suffix": "x"})  # a new set of fields: logged too
    assert other.headers[IGNORED_FIELDS_HEADER] == "frobnicate,presence_penalty,suffix"
    assert len(_ignored_warnings(caplog)) == 2

    known = httpx.post(url, json={"model": MODEL, "prompt": "hi", "max_tokens": 1, "ignore_eos": True})
    assert known.status_code == 200 and IGNORED_FIELDS_HEADER not in known.headers


def test_nested_and_streamed_unknown_fields_are_named(server: ServerThread) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi", "name": "ann"}, {"role": "user", "content": "x"}],
        "max_tokens": 2,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "user": "u-1",
    }
    with httpx.stream("POST", f"{server.base_url}/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers[IGNORED_FIELDS_HEADER] == (
            "messages[].name,stream_options.continuous_usage_stats,user"
        )
        assert list(response.iter_lines())[-2] == "data: [DONE]"


def test_odd_field_names_are_percent_encoded_and_long_lists_cut(server: ServerThread) -> None:
    odd = {"a,b": 1, "x\r\nSet-Cookie: y": 2, "caf\u00e9": 3}
    response = httpx.post(f"{server.base_url}/tokenize", json={"prompt": "hi", **odd})
    assert response.status_code == 200 and response.json()["count"] > 0
    assert response.headers[IGNORED_FIELDS_HEADER] == "a%2Cb,caf%C3%A9,x%0D%0ASet-Cookie%3A%20y"
    assert "set-cookie" not in response.headers

    many = {f"f{i:03d}": i for i in range(MAX_LISTED_FIELDS + 5)}
    response = httpx.post(f"{server.base_url}/tokenize", json={"prompt": "hi", **many})
    listed = response.headers[IGNORED_FIELDS_HEADER].split(",")
    assert listed == [*sorted(many)[:MAX_LISTED_FIELDS], "..."]
