"""The FastAPI application: OpenAI routes over one :class:`EngineThread`.

Handlers run on the event loop and never touch the engine: they validate, tokenize, and hand
one engine request per choice (prompts x ``n``) to :mod:`stallfree.server.responses`, which
relays their outputs (SSE chunks or one JSON body). Every error a
client can cause is an OpenAI error body (:mod:`stallfree.server.errors`: 400 bad request, 401
bad key, 404 ``model_not_found`` for any model but the served one, 429 overloaded with
``Retry-After``, 503 engine dead); a stream that ends early (client gone) aborts its request.
Fields no request model declares are accepted, as OpenAI does, and named: in the
``x-stallfree-ignored-fields`` header of the answer, and in one warning per distinct set of them
(the first :data:`MAX_LOGGED_FIELD_SETS` sets; a client cannot grow the server's memory or flood
its log).
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from stallfree.core import SamplingParams
from stallfree.server import protocol as p
from stallfree.server.engine_thread import EngineThread
from stallfree.server.errors import ServerError, error_response, model_not_found, validation_message
from stallfree.server.responses import Choice, Prepared, respond

_log = logging.getLogger(__name__)

IGNORED_FIELDS_HEADER = "x-stallfree-ignored-fields"
MAX_LISTED_FIELDS = 32  # names in the header at most; "..." ends a longer list
MAX_LOGGED_FIELD_SETS = 256

# Each POST route's body: its required parameters are named when a body comes empty.
_BODIES: dict[str, type[BaseModel]] = {
    "/v1/completions": p.CompletionRequest,
    "/v1/chat/completions": p.ChatCompletionRequest,
    "/tokenize": p.TokenizeRequest,
}


@dataclass(frozen=True, slots=True)
class ServerConfig:
    served_model_name: str
    api_key: str | None = None


class AppState:
    """What every handler reads: the engine thread, the served name, the tokenizer, the context;
    and the sets of ignored fields already logged. One per app, at ``app.state.stallfree``."""

    def __init__(self, engine_thread: EngineThread, config: ServerConfig) -> None:
        self.engine_thread = engine_thread
        self.config = config
        self.model_name = config.served_model_name
        self.tokenizer = engine_thread.engine.tokenizer
        self.max_model_len = engine_thread.engine.max_model_len
        self._logged_field_sets: set[str] = set()

    def ignored_header(self, body: BaseModel) -> dict[str, str]:
        """The header naming ``body``'s ignored fields (none: {}); a new set of them is logged once."""
        ignored = p.ignored_fields(body)
        if not ignored:
            return {}
        if len(ignored) > MAX_LISTED_FIELDS:
            ignored = [*ignored[:MAX_LISTED_FIELDS], "..."]
        listed = ",".join(ignored)
        if listed not in self._logged_field_sets and len(self._logged_field_sets) < MAX_LOGGED_FIELD_SETS:
            self._logged_field_sets.add(listed)
            _log.warning("ignored request fields (this server does not use them): %s", listed)
        return {IGNORED_FIELDS_HEADER: listed}

    def check_model(self, body: p.CompletionRequest | p.ChatCompletionRequest) -> None:
        if body.model != self.model_name:
            raise model_not_found(body.model, self.model_name)

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def sampling(
        self,
        body: p.CompletionRequest | p.ChatCompletionRequest,
        ids: list[int],
        param: str,
        max_tokens: int | None,
    ) -> SamplingParams:
        """``body``'s sampling for a prompt of ``ids``, checked against the context; ``max_tokens``
        None: what the context leaves."""
        if not ids:
            raise ServerError(400, "the prompt is empty", param=param)
        limit = self.max_model_len
        if len(ids) >= limit:
            raise ServerError(
                400, f"the prompt has {len(ids)} tokens; the context is {limit} tokens", param=param
            )
        room = limit - len(ids)
        if max_tokens is None:
            max_tokens = room
        elif max_tokens > room:
            raise ServerError(
                400,
                f"prompt ({len(ids)} tokens) + max_tokens ({max_tokens}) exceeds the context of {limit} tokens",
                param="max_tokens",
            )
        try:
            return body.sampling_params(max_tokens)
        except ValueError as exc:
            raise ServerError(400, str(exc)) from None


def _state(request: Request) -> AppState:
    state: AppState = request.app.state.stallfree
    return state


def _samples(params: SamplingParams, n: int) -> list[SamplingParams]:
    """n independent samples: a given seed becomes seed, seed + 1, ...; none: the engine's."""
    if params.seed is None:
        return [params] * n
    return [replace(params, seed=(params.seed + j) % 2**63) for j in range(n)]


def prepare_completion(state: AppState, body: p.CompletionRequest) -> Prepared:
    """A /v1/completions body as engine requests (one per prompt x ``n``), checked; no engine call."""
    state.check_model(body)
    prompts = body.prompts()
    if not prompts:
        raise ServerError(400, "the prompt list is empty", param="prompt")
    max_tokens = 16 if body.max_tokens is None else body.max_tokens
    choices: list[Choice] = []
    num_prompt_tokens = 0
    for prompt in prompts:
        ids = state.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        params = state.sampling(body, ids, "prompt", max_tokens)
        if body.logprobs is not None:
            params = replace(params, logprobs=True, top_logprobs=body.logprobs)
        echo = ""
        if body.echo:
            echo = prompt if isinstance(prompt, str) else state.tokenizer.decode(ids)
        choices += [Choice(ids, sample, echo, body.priority) for sample in _samples(params, body.n)]
        num_prompt_tokens += len(ids)
    return Prepared(choices, num_prompt_tokens, body.stream, body.include_usage, chat=False, echo=body.echo)


def prepare_chat(state: AppState, body: p.ChatCompletionRequest) -> Prepared:
    """A /v1/chat/completions body as engine requests (``n`` of them), checked; no engine call."""
    state.check_model(body)
    if body.top_logprobs is not None and not body.logprobs:
        raise ServerError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    messages = [{"role": m.role, "content": m.text()} for m in body.messages]
    try:
        ids = state.tokenizer.encode_chat(messages)
    except Exception as exc:  # a template error is the request's fault, never the server's
        raise ServerError(400, f"cannot render the chat template: {exc}", param="messages") from None
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    params = state.sampling(body, ids, "messages", max_tokens)
    if body.logprobs:
        params = replace(params, logprobs=True, top_logprobs=body.top_logprobs or 0)
    choices = [Choice(ids, sample, priority=body.priority) for sample in _samples(params, body.n)]
    return Prepared(choices, len(ids), body.stream, body.include_usage, chat=True)


router = APIRouter()


@router.get("/health")
async def health(request: Request) -> Response:
    thread = _state(request).engine_thread
    if thread.is_healthy:
        return JSONResponse({"status": "ok"})
    return error_response(503, thread.dead_reason or "the engine is not running")


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    text = _state(request).engine_thread.metrics.render()
    return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")


@router.get("/v1/models")
async def models(request: Request) -> dict[str, Any]:
    state = _state(request)
    card = {"id": state.model_name, "object": "model", "created": 0, "owned_by": "stallfree"}
    return {"object": "list", "data": [{**card, "max_model_len": state.max_model_len}]}


@router.post("/tokenize")
async def tokenize(body: p.TokenizeRequest, request: Request, response: Response) -> dict[str, Any]:
    """vLLM's route: the prompt's token ids as /v1/completions would count them."""
    state = _state(request)
    response.headers.update(state.ignored_header(body))
    ids = state.tokenizer.encode(body.prompt)
    return {"count": len(ids), "max_model_len": state.max_model_len, "tokens": ids}


@router.post("/v1/completions", response_model=None)
async def completions(body: p.CompletionRequest, request: Request) -> Response:
    state = _state(request)
    return await _answer(state, prepare_completion(state, body), body, request)


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(body: p.ChatCompletionRequest, request: Request) -> Response:
    state = _state(request)
    return await _answer(state, prepare_chat(state, body), body, request)


async def _answer(state: AppState, prepared: Prepared, body: BaseModel, request: Request) -> Response:
    answer = await respond(state.engine_thread, prepared, request, state.model_name, state.token_text)
    answer.headers.update(state.ignored_header(body))
    return answer


async def _server_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ServerError)
    return error_response(exc.status_code, exc.message, exc.param, exc.code, exc.headers)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    body = _BODIES.get(request.url.path)
    required = [name for name, field in body.model_fields.items() if field.is_required()] if body else []
    message, param = validation_message(exc.errors(), required, request.headers.get("content-type"))
    return error_response(400, message, param)


async def _http_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    return error_response(exc.status_code, str(exc.detail))


async def _check_api_key(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
    api_key = _state(request).config.api_key
    if api_key is not None and request.url.path.startswith(("/v1", "/tokenize")):
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.encode(), api_key.encode()):
            return error_response(401, "invalid or missing API key (expected 'Authorization: Bearer <key>')")
    return await call_next(request)


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
    app.state.stallfree = AppState(engine_thread, config)
    app.state.engine_thread = engine_thread
    app.state.served_model_name = config.served_model_name
    app.add_exception_handler(ServerError, _server_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.middleware("http")(_check_api_key)
    app.include_router(router)
    return app
