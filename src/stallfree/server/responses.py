"""Answering one API request from its engine requests: one JSON body or SSE chunks.

A request becomes one engine request per choice (``prompts x n``, choice ``i * n + j`` is
prompt ``i``'s ``j``-th sample). Every stream is handed back to the engine thread when the
answer ends, however it ends (client gone, engine dead), so unfinished choices are aborted and
their KV blocks freed. Usage counts each prompt once and every choice's generated tokens, as
OpenAI and vLLM do. Streamed chunks carry one choice each, with its index; ``echo`` sends the
prompt's text as each choice's first chunk.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from stallfree.core import SamplingParams
from stallfree.server import protocol as p
from stallfree.server.engine_thread import (
    EngineDeadError,
    EngineThread,
    OverloadedError,
    RequestRejected,
    RequestStream,
)
from stallfree.server.errors import ServerError, error_body, error_response

if TYPE_CHECKING:
    from stallfree.core.outputs import RequestOutput

RETRY_AFTER_S = 1


@dataclass(frozen=True, slots=True)
class Choice:
    """One engine request: a prompt's ids, its sampling, and what ``echo`` prepends."""

    prompt_token_ids: list[int]
    params: SamplingParams
    echo_text: str = ""
    priority: int = 0  # lower first under --scheduling-policy priority


@dataclass(frozen=True, slots=True)
class Prepared:
    """A validated API request, ready for the engine."""

    choices: list[Choice]
    num_prompt_tokens: int  # each prompt once
    stream: bool
    include_usage: bool
    chat: bool
    echo: bool = False


async def respond(
    engine_thread: EngineThread,
    prepared: Prepared,
    request: Request,
    model_name: str,
    token_text: p.TokenText,
) -> Response:
    streams = await _add_all(engine_thread, prepared.choices)
    first = streams[0].request_id
    response_id = f"chat{first}" if prepared.chat else first  # chatcmpl-..., as OpenAI
    answer = _Answer(engine_thread, prepared, streams, response_id, model_name, token_text)
    if prepared.stream:
        return StreamingResponse(answer.sse(), media_type="text/event-stream")
    return await answer.whole(request)


async def _add_all(engine_thread: EngineThread, choices: Sequence[Choice]) -> list[RequestStream]:
    """Queue every choice at once (one engine step takes them all); all or none."""
    results = await asyncio.gather(
        *(engine_thread.add(c.prompt_token_ids, c.params, c.priority) for c in choices),
        return_exceptions=True,
    )
    streams = [r for r in results if isinstance(r, RequestStream)]
    error = next((r for r in results if isinstance(r, BaseException)), None)
    if error is None:
        return streams
    for stream in streams:
        engine_thread.release(stream)
    if isinstance(error, OverloadedError):
        raise ServerError(
            429,
            f"the server is overloaded ({error}); retry later",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        ) from None
    if isinstance(error, EngineDeadError):
        raise ServerError(503, str(error)) from None
    if isinstance(error, RequestRejected):
        raise ServerError(400, str(error)) from None
    raise error


class _Answer:
    def __init__(
        self,
        engine_thread: EngineThread,
        prepared: Prepared,
        streams: list[RequestStream],
        response_id: str,
        model_name: str,
        token_text: p.TokenText,
    ) -> None:
        self.engine_thread = engine_thread
        self.prepared = prepared
        self.streams = streams
        self.response_id = response_id
        self.model_name = model_name
        self.token_text = token_text

    def _release(self) -> None:
        for stream in self.streams:
            self.engine_thread.release(stream)

    async def _outputs(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        """(choice index, output) as the engine steps, every stream merged."""
        if len(self.streams) == 1:
            async for out in self.streams[0]:
                self.engine_thread.got_first_output(self.streams[0])
                yield 0, out
            return
        queue: asyncio.Queue[tuple[int, RequestOutput] | BaseException | None] = asyncio.Queue()

        async def pump(index: int, stream: RequestStream) -> None:
            try:
                async for out in stream:
                    queue.put_nowait((index, out))
            except Exception as exc:  # the engine died: the consumer raises it
                queue.put_nowait(exc)
            queue.put_nowait(None)

        tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(self.streams)]
        try:
            running = len(tasks)
            while running:
                item = await queue.get()
                if item is None:
                    running -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    self.engine_thread.got_first_output(self.streams[item[0]])
                    yield item
        finally:
            for task in tasks:
                task.cancel()

    # -- one JSON body ---------------------------------------------------------------------

    async def whole(self, request: Request) -> Response:
        """Wait for every choice; a client that disconnects meanwhile aborts them all."""

        async def collect() -> dict[int, RequestOutput]:
            last: dict[int, RequestOutput] = {}
            async for index, out in self._outputs():
                last[index] = out
            return last

        collector = asyncio.ensure_future(collect())
        watcher = asyncio.ensure_future(_wait_for_disconnect(request))
        try:
            await asyncio.wait((collector, watcher), return_when=asyncio.FIRST_COMPLETED)
            if not collector.done():
                return Response(status_code=499)  # nobody is listening any more
            last = collector.result()
        except EngineDeadError as exc:
            return error_response(503, str(exc))
        finally:
            for task in (collector, watcher):
                task.cancel()
            self._release()
        choices = [self._whole_choice(i, last[i]) for i in range(len(self.streams))]
        num_generated = sum(len(out.token_ids) for out in last.values())
        usage = p.usage(self.prepared.num_prompt_tokens, num_generated)
        build = p.chat_body if self.prepared.chat else p.completion_body
        return JSONResponse(build(self.response_id, self.model_name, choices, usage))

    def _whole_choice(self, index: int, out: RequestOutput) -> dict[str, Any]:
        choice = self.prepared.choices[index]
        if self.prepared.chat:
            return p.chat_choice(index, out.text, out.finish_reason, self._chat_logprobs(out, 0))
        logprobs = None
        if choice.params.logprobs:
            logprobs = self._completion_logprobs(choice, out, 0, len(choice.echo_text))
            if self.prepared.echo:
                echoed = self._completion_logprobs(choice, None, 0, 0)
                logprobs = {key: echoed[key] + logprobs[key] for key in logprobs}
        return p.completion_choice(index, choice.echo_text + out.text, out.finish_reason, logprobs)

    # -- logprobs of the tokens from ``start`` on --------------------------------------------

    def _chat_logprobs(self, out: RequestOutput, start: int) -> dict[str, Any] | None:
        if out.logprobs is None:
            return None
        tops = out.top_logprobs[start:] if out.top_logprobs is not None else None
        return p.chat_logprobs(self.token_text, out.token_ids[start:], out.logprobs[start:], tops)

    def _completion_logprobs(
        self, choice: Choice, out: RequestOutput | None, start: int, text_offset: int
    ) -> dict[str, Any]:
        """The generated tokens from ``start`` (None: the echoed prompt, no logprobs)."""
        if out is None:
            ids = choice.prompt_token_ids
            none: list[float | None] = [None] * len(ids)
            return p.completion_logprobs(self.token_text, ids, none, [None] * len(ids), text_offset)
        ids = list(out.token_ids[start:])
        logprobs: list[float | None] = list((out.logprobs or ())[start:])
        tops = list(out.top_logprobs[start:]) if out.top_logprobs is not None else [()] * len(ids)
        return p.completion_logprobs(self.token_text, ids, logprobs, tops, text_offset)

    # -- SSE ---------------------------------------------------------------------------------

    async def sse(self) -> AsyncIterator[str]:
        """SSE events, one per choice per engine step; Starlette cancels this when the client goes."""
        rid, model, chat = self.response_id, self.model_name, self.prepared.chat
        num_tokens = [0] * len(self.streams)
        offsets = [0] * len(self.streams)  # completions' text_offset: characters sent so far
        try:
            for index, choice in enumerate(self.prepared.choices):
                if chat:
                    yield _event(p.chat_chunk(rid, model, index, {"role": "assistant", "content": ""}, None))
                elif self.prepared.echo:
                    logprobs = None
                    if choice.params.logprobs:
                        logprobs = self._completion_logprobs(choice, None, 0, 0)
                    offsets[index] = len(choice.echo_text)
                    body = p.completion_choice(index, choice.echo_text, None, logprobs)
                    yield _event(p.completion_body(rid, model, [body], None))
            async for index, out in self._outputs():
                start = num_tokens[index]
                num_tokens[index] = len(out.token_ids)
                if chat:
                    logprobs = self._chat_logprobs(out, start)
                    yield _event(
                        p.chat_chunk(
                            rid, model, index, {"content": out.new_text}, out.finish_reason, logprobs
                        )
                    )
                    continue
                logprobs = None
                if out.logprobs is not None:
                    logprobs = self._completion_logprobs(
                        self.prepared.choices[index], out, start, offsets[index]
                    )
                    offsets[index] += sum(logprobs_len(logprobs))
                body = p.completion_choice(index, out.new_text, out.finish_reason, logprobs)
                yield _event(p.completion_body(rid, model, [body], None))
            if self.prepared.include_usage:
                usage = p.usage(self.prepared.num_prompt_tokens, sum(num_tokens))
                yield _event(p.usage_chunk(rid, model, chat, usage))
        except EngineDeadError as exc:
            yield _event(error_body(503, str(exc)))
        finally:
            self._release()
        yield "data: [DONE]\n\n"


def logprobs_len(logprobs: dict[str, Any]) -> list[int]:
    """Characters of each token in a completions ``logprobs`` object."""
    return [len(token) for token in logprobs["tokens"]]


async def _wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _event(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False, separators=(',', ':'))}\n\n"
