"""The HTTP side of the benchmark: find the model, stream one completion, stamp every chunk.

Speaks only the OpenAI API (``GET /v1/models``, ``POST /v1/completions`` with ``stream: true``
and ``stream_options.include_usage``), so it works against any compatible server. ``extra_body``
carries optional hints such as vLLM's ``ignore_eos``. Times are ``time.perf_counter()`` seconds;
callers subtract their own start. A request never raises: failures are in the result.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

# Errors meaning "this request can never run" (vLLM and we answer 400 for a too-long prompt).
REJECTED_STATUS = (400, 413, 422)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where to send requests and what every body carries besides prompt and max_tokens."""

    base_url: str
    model: str
    api_key: str | None = None
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    max_model_len: int | None = None  # when /v1/models says (vLLM and stallfree do)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


@dataclass(frozen=True, slots=True)
class StreamResult:
    """One request as the client saw it; ``chunk_times_s`` stamps each chunk that had choices."""

    sent_s: float
    chunk_times_s: tuple[float, ...]
    finish_reason: str  # the server's, or "rejected" / "failed" / "length" when the client stopped
    num_prompt_tokens: int | None  # from usage; None if the server did not say
    num_output_tokens: int | None
    error: str | None = None
    text: str = ""  # what the server streamed (a multi-turn session sends it back next turn)


def client(timeout_s: float = 600.0) -> httpx.AsyncClient:
    """An async client with no connection cap (a cap would queue requests on the client side)."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
    return httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=10.0), limits=limits)


async def discover(
    http: httpx.AsyncClient, base_url: str, api_key: str | None, model: str | None
) -> tuple[str, int | None]:
    """The model to use (``model`` or the server's first) and its context if listed.

    ValueError, one line, when the server cannot be reached or does not speak the API.
    """
    base_url = base_url.rstrip("/")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = await http.get(f"{base_url}/v1/models", headers=headers, timeout=10.0)
    except httpx.HTTPError as exc:
        raise ValueError(f"cannot reach {base_url}: {type(exc).__name__}: {exc or 'no answer'}") from None
    if response.status_code == 401:
        if api_key:
            raise ValueError(f"{base_url} rejected the API key given with --api-key (401)")
        raise ValueError(f"{base_url} wants an API key (pass --api-key)")
    try:
        response.raise_for_status()
        cards = response.json()["data"]
        listed = {str(card["id"]): _context_size(card) for card in cards}
    except (httpx.HTTPStatusError, ValueError, KeyError, TypeError):
        raise ValueError(
            f"{base_url}/v1/models answered {response.status_code} without a model list: "
            "is this an OpenAI-compatible server?"
        ) from None
    if model is None:
        if not listed:
            raise ValueError(f"{base_url} lists no models")
        model = next(iter(listed))
    elif listed and model not in listed:
        raise ValueError(f"{base_url} does not serve {model!r}; it serves: {', '.join(listed)}")
    return model, listed.get(model)


def _context_size(card: Mapping[str, Any]) -> int | None:
    """Where servers list the context: vLLM and stallfree ``max_model_len``, llama.cpp's
    llama-server ``meta.n_ctx`` (its slots' context, not the model's ``n_ctx_train``)."""
    meta = card.get("meta")
    for value in (card.get("max_model_len"), meta.get("n_ctx") if isinstance(meta, Mapping) else None):
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


async def count_tokens(http: httpx.AsyncClient, endpoint: Endpoint, text: str) -> int | None:
    """The server's own count of ``text`` as a completions prompt, from its tokenize route
    (vLLM, SGLang and stallfree ``POST /tokenize`` -> ``count``; llama.cpp ``POST /tokenize``
    -> ``tokens``, asked with ``add_special`` so the BOS a completion adds is counted); None when
    the server has no such route."""
    body = {
        "model": endpoint.model,
        "prompt": text,
        "add_special_tokens": True,
        "content": text,
        "add_special": True,
    }
    try:
        response = await http.post(f"{endpoint.base_url}/tokenize", json=body, headers=endpoint.headers)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    try:
        answer = response.json()
    except ValueError:
        return None
    count = answer.get("count") if isinstance(answer, dict) else None
    if isinstance(count, int):
        return count
    tokens = answer.get("tokens") if isinstance(answer, dict) else None
    return len(tokens) if isinstance(tokens, list) else None


async def complete(
    http: httpx.AsyncClient, endpoint: Endpoint, prompt: str, max_tokens: int
) -> dict[str, Any]:
    """A non-streamed completion's JSON (used to calibrate prompt sizes); ValueError on failure."""
    body = {**endpoint.extra_body, "model": endpoint.model, "prompt": prompt, "max_tokens": max_tokens}
    try:
        response = await http.post(f"{endpoint.base_url}/v1/completions", json=body, headers=endpoint.headers)
    except httpx.HTTPError as exc:
        raise ValueError(f"cannot reach {endpoint.base_url}: {type(exc).__name__}: {exc}") from None
    if response.status_code != 200:
        raise ValueError(
            f"calibration request failed with {response.status_code}: {_error_text(response.text)}"
        )
    result: dict[str, Any] = response.json()
    return result


async def stream_completion(
    http: httpx.AsyncClient,
    endpoint: Endpoint,
    prompt: str,
    max_tokens: int,
    *,
    on_chunk: Callable[[int], None] | None = None,
    stop: asyncio.Event | None = None,
    interrupt: asyncio.Event | None = None,
) -> StreamResult:
    """Stream one completion. ``on_chunk(n)`` is called after the n-th chunk; once ``stop`` is set
    the client hangs up after the next chunk (the result then counts as completed at ``length``).
    Once ``interrupt`` is set (a Ctrl-C) it hangs up at once, without waiting for a chunk: the
    result holds the chunks that had come, at ``length`` as for ``stop``."""
    body = {
        **endpoint.extra_body,
        "model": endpoint.model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    times: list[float] = []  # shared with _receive: what came is known even if it is cancelled
    pieces: list[str] = []
    usage: dict[str, Any] = {}
    sent_s = time.perf_counter()
    receiving = _receive(http, endpoint, body, sent_s, (times, pieces), usage, on_chunk, stop)
    if interrupt is None:
        return await receiving
    task = asyncio.ensure_future(receiving)
    waiter = asyncio.ensure_future(interrupt.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        if not task.done():
            task.cancel()  # closes the stream: the server sees the client go
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task.cancelled():
        return _partial(sent_s, (times, pieces), "length", usage, None)
    return task.result()


async def _receive(
    http: httpx.AsyncClient,
    endpoint: Endpoint,
    body: Mapping[str, Any],
    sent_s: float,
    received: tuple[list[float], list[str]],
    usage: dict[str, Any],
    on_chunk: Callable[[int], None] | None,
    stop: asyncio.Event | None,
) -> StreamResult:
    """Send ``body``; stamp each chunk into ``received``'s times and its text into its pieces
    (``usage`` gets the server's usage)."""
    times, pieces = received
    empty_close = False  # the last chunk had a finish_reason and no text
    finish_reason: str | None = None
    url = f"{endpoint.base_url}/v1/completions"
    try:
        async with http.stream("POST", url, json=body, headers=endpoint.headers) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                reason = "rejected" if response.status_code in REJECTED_STATUS else "failed"
                return StreamResult(
                    sent_s, (), reason, None, None, f"{response.status_code}: {_error_text(text)}"
                )
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                now_s = time.perf_counter()
                chunk = json.loads(data)
                if "error" in chunk:
                    return _partial(sent_s, received, "failed", usage, _error_text(data))
                if chunk.get("choices"):
                    choice = chunk["choices"][0]
                    finish_reason = choice.get("finish_reason") or finish_reason
                    pieces.append(_chunk_text(choice))
                    empty_close = finish_reason is not None and not pieces[-1]
                    times.append(now_s)
                    if on_chunk is not None:
                        on_chunk(len(times))
                    if stop is not None and stop.is_set() and finish_reason is None:
                        return _partial(sent_s, received, "length", usage, None)
                if chunk.get("usage"):
                    usage.update(chunk["usage"])
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        return _partial(sent_s, received, "failed", usage, f"{type(exc).__name__}: {exc}")
    # llama.cpp closes a stream with an extra chunk of no text that only carries finish_reason:
    # not a token (stamping it adds a fake near-zero gap). A last token whose text is empty (a
    # special token, a held-back partial character) is one: usage tells them apart.
    num_output = usage.get("completion_tokens")
    if empty_close and len(times) > (num_output if isinstance(num_output, int) else 1):
        times.pop()
    if finish_reason is None:
        return _partial(sent_s, received, "failed", usage, "the stream ended without a finish_reason")
    return _partial(sent_s, received, finish_reason, usage, None)


def _chunk_text(choice: Mapping[str, Any]) -> str:
    text = choice.get("text")
    if text is None and isinstance(choice.get("delta"), Mapping):
        text = choice["delta"].get("content")
    return text if isinstance(text, str) else ""


def _partial(
    sent_s: float,
    received: tuple[list[float], list[str]],
    reason: str,
    usage: Mapping[str, Any],
    error: str | None,
) -> StreamResult:
    prompt_tokens = usage.get("prompt_tokens")
    output_tokens = usage.get("completion_tokens")
    return StreamResult(
        sent_s,
        tuple(received[0]),
        reason,
        int(prompt_tokens) if isinstance(prompt_tokens, int) else None,
        int(output_tokens) if isinstance(output_tokens, int) else None,
        error,
        "".join(received[1]),
    )


def _error_text(text: str) -> str:
    """The message of an OpenAI error body, else the text itself (one line, shortened)."""
    try:
        message = str(json.loads(text)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        message = text
    message = " ".join(message.split())
    return message if len(message) <= 200 else message[:197] + "..."
