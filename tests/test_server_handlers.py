"""The server's request handling alone: bodies checked and turned into engine requests with no
engine, no thread and no HTTP (an AppState over a stand-in engine that only tokenizes)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from stallfree.server import protocol as p
from stallfree.server.app import AppState, ServerConfig, prepare_chat, prepare_completion
from stallfree.server.engine_thread import EngineThread
from stallfree.server.errors import ServerError


class _Tokenizer:
    """One token per character, ids from 10; a chat turn is its role's first letter then the text."""

    def encode(self, text: str) -> list[int]:
        return [10 + ord(c) % 50 for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids)

    def encode_chat(self, messages: list[dict[str, Any]]) -> list[int]:
        return [t for m in messages for t in self.encode(m["role"][0] + m["content"])]


def _state(max_model_len: int = 32) -> AppState:
    engine = SimpleNamespace(tokenizer=_Tokenizer(), max_model_len=max_model_len)
    return AppState(cast(EngineThread, SimpleNamespace(engine=engine)), ServerConfig("m"))


def test_completion_choices_per_prompt_and_n_with_seeds_apart() -> None:
    body = p.CompletionRequest(model="m", prompt=["ab", "cde"], n=2, seed=7, max_tokens=4)
    prepared = prepare_completion(_state(), body)
    assert [len(c.prompt_token_ids) for c in prepared.choices] == [2, 2, 3, 3]
    assert [c.params.seed for c in prepared.choices] == [7, 8, 7, 8]
    assert {c.params.max_tokens for c in prepared.choices} == {4}
    assert prepared.num_prompt_tokens == 5 and not prepared.chat


def test_chat_max_tokens_defaults_to_the_rest_of_the_context() -> None:
    body = p.ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}])
    prepared = prepare_chat(_state(max_model_len=20), body)
    (choice,) = prepared.choices
    assert len(choice.prompt_token_ids) == 3 and choice.params.max_tokens == 17 and prepared.chat


@pytest.mark.parametrize(
    ("body", "status", "param", "words"),
    [
        (p.CompletionRequest(model="other", prompt="a"), 404, None, "other"),
        (p.CompletionRequest(model="m", prompt=[]), 400, "prompt", "prompt list is empty"),
        (p.CompletionRequest(model="m", prompt=""), 400, "prompt", "prompt is empty"),
        (p.CompletionRequest(model="m", prompt="x" * 32), 400, "prompt", "context is 32 tokens"),
        (p.CompletionRequest(model="m", prompt="x" * 30, max_tokens=3), 400, "max_tokens", "exceeds"),
    ],
)
def test_completion_refusals(body: p.CompletionRequest, status: int, param: str | None, words: str) -> None:
    with pytest.raises(ServerError) as caught:
        prepare_completion(_state(), body)
    assert caught.value.status_code == status and words in caught.value.message
    if param is not None:
        assert caught.value.param == param


def test_chat_top_logprobs_needs_logprobs() -> None:
    body = p.ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], top_logprobs=2)
    with pytest.raises(ServerError, match="top_logprobs needs logprobs"):
        prepare_chat(_state(), body)
