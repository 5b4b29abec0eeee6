"""The OpenAI wire format: pydantic request models, response and chunk bodies.

Request models accept OpenAI's fields plus the vLLM extras ``top_k`` and ``ignore_eos``; other
fields are accepted and ignored, as OpenAI and vLLM do, and :func:`ignored_fields` names them.
Floats must be finite (``NaN`` or ``Infinity`` in a body is a 400, never a sampler crash). ``n``
is capped at :data:`MAX_N` and top logprobs at :data:`MAX_LOGPROBS` (OpenAI's cap). Logprobs are
under the model's raw distribution (before temperature, top-k, top-p); a completions
``top_logprobs`` entry holds the ``logprobs`` most likely tokens and the sampled one (so up to
``logprobs + 1`` keys, as OpenAI's). Error bodies live in :mod:`stallfree.server.errors`. Everything
here is pure: no engine, no I/O.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Literal
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict, Field, field_validator

from stallfree.core import SamplingParams

_MAX_SEED = 2**63 - 1
MAX_N = 16  # choices per prompt: n engine requests, so a cap keeps one body from flooding the queue
MAX_LOGPROBS = 20  # OpenAI's cap on top logprobs


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)  # kept, to be named, never used


def ignored_fields(body: BaseModel) -> list[str]:
    """The fields of ``body`` (nested ones too: ``stream_options.x``, ``messages[].name``) that no
    model declares, sorted, each name percent-encoded (safe in a header and a log line)."""
    names: set[str] = set()

    def walk(model: BaseModel, prefix: str) -> None:
        names.update(
            prefix + quote(name, safe="", errors="backslashreplace") for name in model.model_extra or {}
        )
        for name in type(model).model_fields:
            value = getattr(model, name)
            items = value if isinstance(value, list) else [value]
            suffix = "[]" if isinstance(value, list) else ""
            for item in items:
                if isinstance(item, BaseModel):
                    walk(item, f"{prefix}{name}{suffix}.")

    walk(body, "")
    return sorted(names)


class StreamOptions(_Body):
    include_usage: bool = False


class _SamplingFields(_Body):
    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    n: int = Field(default=1, ge=1, le=MAX_N)
    seed: int | None = Field(default=None, ge=0, le=_MAX_SEED)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    # vLLM's extra: lower runs first under --scheduling-policy priority (ignored under fcfs)
    priority: int = Field(default=0, strict=True)

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            seed=self.seed,
            stop=tuple(s for s in stop if s),
            ignore_eos=self.ignore_eos,
        )

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_SamplingFields):
    """``POST /v1/completions``: a prompt (text or token ids) or a list of them; ``max_tokens``
    defaults to 16. ``echo`` prepends the prompt's text to each choice."""

    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False

    def prompts(self) -> list[str | list[int]]:
        """The prompts in order: one string or token-id list each."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if prompt and all(isinstance(t, int) for t in prompt):
            return [[int(t) for t in prompt]]  # type: ignore[arg-type]
        return list(prompt)  # type: ignore[arg-type]


class TokenizeRequest(_Body):
    """``POST /tokenize`` (vLLM's): a completions prompt to count."""

    prompt: str
    model: str | None = None


class TextPart(_Body):
    type: Literal["text"]
    text: str


# OpenAI's chat roles; anything else is a 400, as OpenAI answers.
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")


class ChatMessage(_Body):
    role: str
    content: str | list[TextPart] | None = None

    @field_validator("role")
    @classmethod
    def _known_role(cls, role: str) -> str:
        if role not in CHAT_ROLES:
            raise ValueError(f"unknown role {role!r}; expected one of {', '.join(CHAT_ROLES)}")
        return role

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatCompletionRequest(_SamplingFields):
    """``POST /v1/chat/completions``; ``max_tokens`` defaults to the rest of the context."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, echo: bool) -> bool:
        if echo:
            raise ValueError("echo is a completions parameter; chat completions do not take it")
        return echo


def usage(num_prompt_tokens: int, num_output_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": num_prompt_tokens,
        "completion_tokens": num_output_tokens,
        "total_tokens": num_prompt_tokens + num_output_tokens,
    }


TokenText = Callable[[int], str]


def completion_choice(
    index: int, text: str, finish_reason: str | None, logprobs: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}


def completion_body(
    request_id: str, model: str, choices: list[dict[str, Any]], usage_: dict[str, int] | None
) -> dict[str, Any]:
    """A ``text_completion`` object: the whole answer, or one streamed chunk of it."""
    return {
        "id": request_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage_,
    }


def completion_logprobs(
    token_text: TokenText,
    token_ids: Sequence[int],
    logprobs: Sequence[float | None],
    top_logprobs: Sequence[Sequence[tuple[int, float]] | None],
    text_offset: int,
) -> dict[str, Any]:
    """Completions' ``logprobs``: per token its text, logprob, top alternatives, character offset.

    A position without a logprob (an echoed prompt token: the engine scores only the positions
    it samples) has null ``token_logprobs`` and ``top_logprobs`` entries.
    """
    tokens = [token_text(t) for t in token_ids]
    offsets = []
    for token in tokens:
        offsets.append(text_offset)
        text_offset += len(token)
    tops: list[dict[str, float] | None] = []
    for token, logprob, top in zip(tokens, logprobs, top_logprobs, strict=True):
        if logprob is None:
            tops.append(None)
            continue
        entry = {token_text(t): lp for t, lp in top or ()}
        entry.setdefault(token, logprob)  # the sampled token is always there, as OpenAI's
        tops.append(entry)
    return {
        "tokens": tokens,
        "token_logprobs": list(logprobs),
        "top_logprobs": tops,
        "text_offset": offsets,
    }


def chat_logprobs(
    token_text: TokenText,
    token_ids: Sequence[int],
    logprobs: Sequence[float],
    top_logprobs: Sequence[Sequence[tuple[int, float]]] | None,
) -> dict[str, Any]:
    """Chat's ``logprobs``: ``{"content": [{token, logprob, bytes, top_logprobs}], "refusal"}``."""

    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        token = token_text(token_id)
        return {"token": token, "logprob": logprob, "bytes": list(token.encode())}

    tops = top_logprobs if top_logprobs is not None else [()] * len(token_ids)
    content = [
        {**entry(t, lp), "top_logprobs": [entry(a, alp) for a, alp in top]}
        for t, lp, top in zip(token_ids, logprobs, tops, strict=True)
    ]
    return {"content": content, "refusal": None}


def chat_choice(
    index: int, text: str, finish_reason: str | None, logprobs: dict[str, Any] | None = None
) -> dict[str, Any]:
    message = {"role": "assistant", "content": text}
    return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish_reason}


def chat_body(
    request_id: str, model: str, choices: list[dict[str, Any]], usage_: dict[str, int]
) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage_,
    }


def chat_chunk(
    request_id: str,
    model: str,
    index: int,
    delta: dict[str, str],
    finish_reason: str | None,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
    return {
        "id": request_id,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
    }


def usage_chunk(request_id: str, model: str, chat: bool, usage_: dict[str, int]) -> dict[str, Any]:
    """The last chunk when ``stream_options.include_usage``: no choices, only usage."""
    kind = "chat.completion.chunk" if chat else "text_completion"
    return {
        "id": request_id,
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": [],
        "usage": usage_,
    }
