"""The FastAPI application: OpenAI routes over one :class:`EngineThread`.

Handlers run on the event loop and never touch the engine: they validate, tokenize, hand the
request to the engine thread and relay its outputs (SSE chunks or one JSON body). Every error a
client can cause is an OpenAI error body (400 bad request, 401 bad key, 429 overloaded with
``Retry-After``, 503 engine dead); a stream that ends early (client gone) aborts its request.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from stallfree.core import SamplingParams
from stallfree.server import protocol as p
from stallfree.server.engine_thread import (
    EngineDeadError,
    EngineThread,
    OverloadedError,
    RequestRejected,
    RequestStream,
)

RETRY_AFTER_S = 1


@dataclass(frozen=True, slots=True)
class ServerConfig:
    served_model_name: str
    api_key: str | None = None


@dataclass(frozen=True, slots=True)
class _Prepared:
    prompt_token_ids: list[int]
    params: SamplingParams
    stream: bool
    include_usage: bool


def build_app(engine_thread: EngineThread, config: ServerConfig) -> FastAPI:
    """The app; its lifespan starts and stops ``engine_thread``."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        engine_thread.start()
        try:
            yield
        finally:
            engine_thread.stop()

    app = FastAPI(title="stallfree", lifespan=lifespan)
    app.state.engine_thread = engine_thread
    engine = engine_thread.engine
    tokenizer = engine.tokenizer
    max_model_len = engine.max_model_len
    model_name = config.served_model_name

    @app.exception_handler(p.ServerError)
    async def _server_error(_request: Request, exc: p.ServerError) -> JSONResponse:
        return _error_response(exc.status_code, exc.message, exc.param, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        if first.get("type") == "json_invalid":  # its loc is a character offset, not a parameter
            offset = next((part for part in first.get("loc", ()) if isinstance(part, int)), None)
            where = f" at character {offset}" if offset is not None else ""
            return _error_response(400, f"the request body is not valid JSON ({first['msg']}{where})")
        loc = [str(part) for part in first.get("loc", ()) if part != "body"]
        where = ".".join(loc)
        return _error_response(400, f"{where}: {first['msg']}" if where else str(first["msg"]), where or None)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error_response(exc.status_code, str(exc.detail))

    @app.middleware("http")
    async def _check_api_key(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        if config.api_key is not None and request.url.path.startswith(("/v1", "/tokenize")):
            scheme, _, token = request.headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(token.encode(), config.api_key.encode()):
                return _error_response(
                    401, "invalid or missing API key (expected 'Authorization: Bearer <key>')"
                )
        return await call_next(request)

    @app.get("/health")
    async def health() -> Response:
        if engine_thread.is_healthy:
            return JSONResponse({"status": "ok"})
        return _error_response(503, engine_thread.dead_reason or "the engine is not running")

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(engine_thread.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": model_name, "object": "model", "created": 0, "owned_by": "stallfree"}
        return {"object": "list", "data": [{**card, "max_model_len": max_model_len}]}

    @app.post("/tokenize")
    async def tokenize(body: p.TokenizeRequest) -> dict[str, Any]:
        """vLLM's route: the prompt's token ids as /v1/completions would count them."""
        ids = tokenizer.encode(body.prompt)
        return {"count": len(ids), "max_model_len": max_model_len, "tokens": ids}

    def check_common(body: p.CompletionRequest | p.ChatCompletionRequest) -> None:
        if body.model != model_name:
            raise p.ServerError(
                400, f"model {body.model!r} is not served here; use {model_name!r}", param="model"
            )
        if body.n != 1:
            raise p.ServerError(400, "n > 1 is not supported", param="n")
        if body.logprobs:
            raise p.ServerError(400, "logprobs are not supported", param="logprobs")

    def prepare(
        body: p.CompletionRequest | p.ChatCompletionRequest,
        ids: list[int],
        param: str,
        max_tokens: int | None,
    ) -> _Prepared:
        if not ids:
            raise p.ServerError(400, "the prompt is empty", param=param)
        if len(ids) >= max_model_len:
            raise p.ServerError(
                400, f"the prompt has {len(ids)} tokens; the context is {max_model_len} tokens", param=param
            )
        room = max_model_len - len(ids)
        if max_tokens is None:
            max_tokens = room
        elif max_tokens > room:
            raise p.ServerError(
                400,
                f"prompt ({len(ids)} tokens) + max_tokens ({max_tokens}) exceeds the context of {max_model_len} tokens",
                param="max_tokens",
            )
        try:
            params = body.sampling_params(max_tokens)
        except ValueError as exc:
            raise p.ServerError(400, str(exc)) from None
        return _Prepared(ids, params, body.stream, body.include_usage)

    @app.post("/v1/completions", response_model=None)
    async def completions(body: p.CompletionRequest, request: Request) -> Response:
        check_common(body)
        if body.echo:
            raise p.ServerError(400, "echo is not supported", param="echo")
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise p.ServerError(400, "one prompt per request is supported", param="prompt")
            prompt = prompt[0]
        ids = tokenizer.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        prepared = prepare(body, ids, "prompt", 16 if body.max_tokens is None else body.max_tokens)
        return await _respond(engine_thread, prepared, request, model_name, chat=False)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(body: p.ChatCompletionRequest, request: Request) -> Response:
        check_common(body)
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        try:
            ids = tokenizer.encode_chat(messages)
        except Exception as exc:  # a template error is the request's fault, never the server's
            raise p.ServerError(400, f"cannot render the chat template: {exc}", param="messages") from None
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        prepared = prepare(body, ids, "messages", max_tokens)
        return await _respond(engine_thread, prepared, request, model_name, chat=True)

    return app


async def _respond(
    engine_thread: EngineThread, prepared: _Prepared, request: Request, model_name: str, *, chat: bool
) -> Response:
    try:
        stream = await engine_thread.add(prepared.prompt_token_ids, prepared.params)
    except OverloadedError as exc:
        raise p.ServerError(
            429, f"the server is overloaded ({exc}); retry later", headers={"Retry-After": str(RETRY_AFTER_S)}
        ) from None
    except EngineDeadError as exc:
        raise p.ServerError(503, str(exc)) from None
    except RequestRejected as exc:
        raise p.ServerError(400, str(exc)) from None
    num_prompt_tokens = len(prepared.prompt_token_ids)
    response_id = f"chat{stream.request_id}" if chat else stream.request_id  # chatcmpl-..., as OpenAI
    if prepared.stream:
        chunks = _sse(
            engine_thread, stream, response_id, model_name, num_prompt_tokens, chat, prepared.include_usage
        )
        return StreamingResponse(chunks, media_type="text/event-stream")
    return await _whole(engine_thread, stream, request, response_id, model_name, num_prompt_tokens, chat)


async def _whole(
    engine_thread: EngineThread,
    stream: RequestStream,
    request: Request,
    response_id: str,
    model_name: str,
    num_prompt_tokens: int,
    chat: bool,
) -> Response:
    """Wait for the whole answer; a client that disconnects meanwhile aborts the request."""

    async def collect() -> tuple[str, int, str | None]:
        text, num_tokens, reason = "", 0, None
        async for out in stream:
            engine_thread.got_first_output(stream)
            text, num_tokens, reason = out.text, len(out.token_ids), out.finish_reason
        return text, num_tokens, reason

    collector = asyncio.ensure_future(collect())
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait((collector, watcher), return_when=asyncio.FIRST_COMPLETED)
        if not collector.done():
            return Response(status_code=499)  # nobody is listening any more
        text, num_tokens, reason = collector.result()
    except EngineDeadError as exc:
        return _error_response(503, str(exc))
    finally:
        for task in (collector, watcher):
            task.cancel()
        engine_thread.release(stream)
    usage = p.usage(num_prompt_tokens, num_tokens)
    body = (p.chat_body if chat else p.completion_body)(response_id, model_name, text, reason, usage)
    return JSONResponse(body)


async def _wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _sse(
    engine_thread: EngineThread,
    stream: RequestStream,
    rid: str,
    model_name: str,
    num_prompt_tokens: int,
    chat: bool,
    include_usage: bool,
) -> AsyncIterator[str]:
    """SSE events, one per engine step; Starlette cancels this when the client disconnects."""
    num_tokens = 0
    try:
        if chat:
            yield _event(p.chat_chunk(rid, model_name, {"role": "assistant", "content": ""}, None))
        async for out in stream:
            engine_thread.got_first_output(stream)
            num_tokens = len(out.token_ids)
            if chat:
                yield _event(p.chat_chunk(rid, model_name, {"content": out.new_text}, out.finish_reason))
            else:
                yield _event(p.completion_body(rid, model_name, out.new_text, out.finish_reason, None))
        if include_usage:
            yield _event(p.usage_chunk(rid, model_name, chat, p.usage(num_prompt_tokens, num_tokens)))
    except EngineDeadError as exc:
        yield _event(p.error_body(503, str(exc)))
    finally:
        engine_thread.release(stream)
    yield "data: [DONE]\n\n"


def _event(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False, separators=(',', ':'))}\n\n"


def _error_response(
    status_code: int, message: str, param: str | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(p.error_body(status_code, message, param), status_code=status_code, headers=headers)
