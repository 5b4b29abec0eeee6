"""The bench client against scripted servers (httpx.MockTransport): chunks, usage, failures."""

from __future__ import annotations

import asyncio
import json
import random

import httpx
import pytest

from stallfree.bench.client import Endpoint, discover, stream_completion
from stallfree.bench.prompts import PromptSizer, synthetic_text

ENDPOINT = Endpoint(base_url="http://test", model="m", extra_body={"ignore_eos": True})


def _sse(*events: object) -> bytes:
    return b"".join(f"data: {json.dumps(e) if not isinstance(e, str) else e}\n\n".encode() for e in events)


def _chunk(text: str, reason: str | None = None) -> dict[str, object]:
    return {"choices": [{"index": 0, "text": text, "finish_reason": reason}]}


def _run(handler: httpx.MockTransport, **kwargs: object):  # type: ignore[no-untyped-def]
    async def main():  # type: ignore[no-untyped-def]
        async with httpx.AsyncClient(transport=handler) as http:
            return await stream_completion(http, ENDPOINT, "hi", 3, **kwargs)  # type: ignore[arg-type]

    return asyncio.run(main())


def test_every_chunk_is_stamped_and_usage_read() -> None:
    bodies: list[dict[str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        usage = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}}
        return httpx.Response(
            200, content=_sse(_chunk("a"), _chunk("b"), _chunk("c", "length"), usage, "[DONE]")
        )

    result = _run(httpx.MockTransport(handler))
    assert len(result.chunk_times_s) == 3
    assert list(result.chunk_times_s) == sorted(result.chunk_times_s)
    assert (result.finish_reason, result.num_prompt_tokens, result.num_output_tokens) == ("length", 5, 3)
    assert bodies[0]["stream"] is True and bodies[0]["ignore_eos"] is True
    assert bodies[0]["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize(
    ("response", "reason"),
    [
        (httpx.Response(400, json={"error": {"message": "too long"}}), "rejected"),
        (httpx.Response(429, json={"error": {"message": "busy"}}), "failed"),
        (httpx.Response(200, content=_sse(_chunk("a"), {"error": {"message": "died"}})), "failed"),
        (httpx.Response(200, content=_sse(_chunk("a"))), "failed"),  # ended without a finish_reason
    ],
)
def test_failures_are_results_not_exceptions(response: httpx.Response, reason: str) -> None:
    result = _run(httpx.MockTransport(lambda _request: response))
    assert result.finish_reason == reason
    assert result.error


def test_unreachable_server_is_one_clear_error() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    async def main() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(refuse)) as http:
            await discover(http, "http://nowhere:1", None, None)

    with pytest.raises(ValueError, match="cannot reach http://nowhere:1"):
        asyncio.run(main())


def test_discover_picks_the_listed_model_and_context() -> None:
    cards = {"object": "list", "data": [{"id": "a", "max_model_len": 2048}, {"id": "b"}]}
    transport = httpx.MockTransport(lambda _request: httpx.Response(200, json=cards))

    async def main(model: str | None) -> tuple[str, int | None]:
        async with httpx.AsyncClient(transport=transport) as http:
            return await discover(http, "http://x/", None, model)

    assert asyncio.run(main(None)) == ("a", 2048)
    assert asyncio.run(main("b")) == ("b", None)
    with pytest.raises(ValueError, match="does not serve 'c'"):
        asyncio.run(main("c"))


def test_synthetic_text_has_the_asked_length_and_differs_per_seed() -> None:
    for n in (1, 7, 100, 5000):
        assert len(synthetic_text(n, random.Random(0))) == n
    assert synthetic_text(200, random.Random(1)) != synthetic_text(200, random.Random(2))


def test_prompt_sizer_inverts_its_line() -> None:
    sizer = PromptSizer(tokens_per_char=0.25, fixed_tokens=1)
    assert sizer.num_chars(101) == 400
    assert sizer.num_chars(0) == 1  # never an empty prompt
    with pytest.raises(ValueError):
        PromptSizer(tokens_per_char=0)
