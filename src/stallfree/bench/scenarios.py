"""Benchmark scenarios against a live endpoint; each returns a :class:`BenchRun`.

- :func:`run_workload`: requests from a :class:`~stallfree.workload.WorkloadArrays` (Poisson,
  gamma or replayed arrivals; lengths from a trace or a distribution), each sent at its arrival
  time, so a slow server cannot slow the arrivals down (an open loop, as ``vllm bench serve``).
- :func:`run_sessions`: multi-turn chat sessions, closed loop: each turn's prompt is the previous
  turn's prompt, the server's answer to it and a new message, sent once the answer is back (and
  the think time has passed), so a server's prefix cache sees what a chat's would.
- :func:`run_long_prompt`: the seed's experiment. N streams decode; once each has
  ``lead_steps`` chunks, one long prompt arrives; after its first token and ``tail_steps``
  more chunks per stream the client hangs up on the streams. Reports the streams' longest and
  median gap and the prompt's TTFT (and, first, its TTFT alone on an idle server).

Records go through :func:`stallfree.metrics.record_from_token_times`, one token time per
streamed chunk, so a run is scored by the same code as a simulated one.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import httpx
import numpy as np

from stallfree.bench.client import Endpoint, StreamResult, stream_completion
from stallfree.bench.prompts import PromptSizer, fallback_target, fit_prompts
from stallfree.metrics import ItlAccumulator, RequestRecord, record_from_token_times
from stallfree.workload import Sessions, WorkloadArrays
from stallfree.workload.long_prompt import LongPrompt


@dataclass(slots=True)
class BenchRun:
    """What a scenario measured; ``extra`` holds scenario-specific numbers (ms unless named)."""

    records: list[RequestRecord]
    itl: ItlAccumulator
    duration_s: float
    results: list[StreamResult]
    requested_prompt_tokens: list[int]
    extra: dict[str, Any] = field(default_factory=dict)

    def per_request(self) -> dict[str, list[Any]]:
        """vLLM's per-request arrays (seconds), plus our arrival times (from the run's start),
        requested lengths and errors: enough for ``stallfree simulate --replay`` / ``validate``."""
        return {
            "arrival_times": [r.arrival_s for r in self.records],
            "input_lens": [r.num_prompt_tokens for r in self.records],
            "output_lens": [r.num_output_tokens for r in self.records],
            "ttfts": [
                None if r.first_token_s is None else r.first_token_s - r.arrival_s for r in self.records
            ],
            "itls": [np.diff(res.chunk_times_s).tolist() for res in self.results],
            "requested_input_lens": self.requested_prompt_tokens,
            "errors": [res.error or "" for res in self.results],
        }


def _record(
    request_id: str, result: StreamResult, start_s: float, requested_prompt: int, itl: ItlAccumulator
) -> RequestRecord:
    times = [t - start_s for t in result.chunk_times_s]
    num_output = result.num_output_tokens if result.num_output_tokens is not None else len(times)
    return record_from_token_times(
        request_id=request_id,
        arrival_s=result.sent_s - start_s,
        token_times_s=times,
        num_prompt_tokens=result.num_prompt_tokens
        if result.num_prompt_tokens is not None
        else requested_prompt,
        num_output_tokens=num_output if times else 0,
        itl=itl,
        finish_reason=result.finish_reason
        if times or result.finish_reason in ("rejected", "failed")
        else "failed",
    )


def build_run(results: list[StreamResult], prompts: list[int], start_s: float, end_s: float) -> BenchRun:
    itl = ItlAccumulator()
    records = [
        _record(str(i), res, start_s, p, itl) for i, (res, p) in enumerate(zip(results, prompts, strict=True))
    ]
    return BenchRun(records, itl, max(end_s - start_s, 1e-9), results, prompts)


async def run_until_stopped(tasks: Sequence[asyncio.Future[Any]], stop: asyncio.Event | None) -> None:
    """Wait for every task, or until ``stop`` is set (Ctrl-C): then cancel the rest and wait for
    them to wind up."""
    if stop is None:
        await asyncio.gather(*tasks)
        return
    await wait_any(stop, tasks)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def run_workload(
    http: httpx.AsyncClient,
    endpoint: Endpoint,
    arrays: WorkloadArrays,
    sizer: PromptSizer,
    *,
    seed: int = 0,
    on_done: Callable[[], None] | None = None,
    texts: Sequence[str] | None = None,
    stop: asyncio.Event | None = None,
    priorities: Sequence[int] | None = None,
) -> BenchRun:
    """Send row ``i`` at ``arrival_time_s[i]`` seconds after the start (with ``priorities[i]`` as
    its body's ``priority``, vLLM's field, where given); wait for all, or until ``stop`` is set
    (Ctrl-C): then the requests in flight are cancelled and the run holds the ones that had
    finished (``extra["interrupted"]`` says how many of how many)."""
    rng = random.Random(seed)
    prompts = arrays.num_prompt_tokens.tolist()
    if texts is None:
        texts = [sizer.prompt(n, rng) for n in prompts]  # built up front: arrivals stay on time

    async def one(i: int, delay_s: float, max_tokens: int) -> StreamResult:
        await asyncio.sleep(max(0.0, start_s + delay_s - time.perf_counter()))
        target = endpoint
        if priorities is not None:
            target = replace(endpoint, extra_body={**endpoint.extra_body, "priority": priorities[i]})
        result = await stream_completion(http, target, texts[i], max_tokens)
        if on_done is not None:
            on_done()
        return result

    start_s = time.perf_counter()
    tasks = [
        asyncio.ensure_future(one(i, delay_s, max_tokens))
        for i, (delay_s, max_tokens) in enumerate(
            zip(arrays.arrival_time_s.tolist(), arrays.max_tokens.tolist(), strict=True)
        )
    ]
    if stop is None:
        results = list(await asyncio.gather(*tasks))
        return build_run(results, prompts, start_s, time.perf_counter())
    await wait_any(stop, tasks)
    end_s = time.perf_counter()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    finished = [i for i, task in enumerate(tasks) if not task.cancelled() and task.exception() is None]
    run = build_run([tasks[i].result() for i in finished], [prompts[i] for i in finished], start_s, end_s)
    if len(finished) < len(tasks):
        run.extra["interrupted"] = {"finished": len(finished), "requests": len(tasks)}
    return run


async def run_sessions(
    http: httpx.AsyncClient,
    endpoint: Endpoint,
    sessions: Sessions,
    starts_s: Sequence[float],
    messages: Sequence[int],
    answers: Sequence[int],
    sizer: PromptSizer,
    *,
    seed: int = 0,
    on_done: Callable[[], None] | None = None,
    stop: asyncio.Event | None = None,
) -> BenchRun:
    """Session ``i`` starts ``starts_s[i]`` seconds after the start; its turn ``t`` sends a new
    message of ``messages[i * turns + t]`` tokens and asks for ``answers[...]`` tokens. The run's
    records are in send order; ``extra`` holds each request's session and turn (for replay)."""
    rng = random.Random(seed)
    turns = sessions.turns
    system = sizer.prompt(sessions.system_prompt_tokens, rng) + " " if sessions.system_prompt_tokens else ""
    texts = [sizer.prompt(n, rng) for n in messages]  # built up front: sends stay on time
    sent: list[tuple[int, int, StreamResult, int]] = []  # session, turn, result, requested prompt

    async def session(i: int) -> None:
        await asyncio.sleep(max(0.0, start_s + starts_s[i] - time.perf_counter()))
        history = system
        for t in range(turns):
            prompt = history + texts[i * turns + t]
            result = await stream_completion(http, endpoint, prompt, answers[i * turns + t])
            requested = sessions.system_prompt_tokens + sum(messages[i * turns : i * turns + t + 1])
            sent.append((i, t, result, requested + sum(answers[i * turns : i * turns + t])))
            if on_done is not None:
                on_done()
            if result.error is not None:
                return  # the conversation cannot go on without the answer
            history = prompt + result.text + " "
            await asyncio.sleep(sessions.think_time_s)

    start_s = time.perf_counter()
    tasks = [asyncio.ensure_future(session(i)) for i in range(len(starts_s))]
    await run_until_stopped(tasks, stop)
    sent.sort(key=lambda row: row[2].sent_s)
    run = build_run([r for _, _, r, _ in sent], [n for _, _, _, n in sent], start_s, time.perf_counter())
    run.extra["sessions"] = {
        "turns": turns,
        "system_prompt_tokens": sessions.system_prompt_tokens,
        "think_time_s": sessions.think_time_s,
    }
    run.extra["session_ids"] = [i for i, _, _, _ in sent]
    run.extra["turn_ids"] = [t for _, t, _, _ in sent]
    if stop is not None and stop.is_set():
        run.extra["interrupted"] = {"finished": len(sent), "requests": len(messages)}
    return run


@dataclass(frozen=True, slots=True, kw_only=True)
class LongPromptOptions(LongPrompt):
    """The seed's experiment (:class:`~stallfree.workload.long_prompt.LongPrompt`) against a live
    server: ``lead_steps`` and ``tail_steps`` count the streams' chunks, and the requests' output
    lengths say how long the streams decode and how many tokens the prompt asks for."""

    prompt_tokens: int = 4096
    context_tokens: int = 32
    lead_steps: int = 8
    tail_steps: int = 16
    stream_max_tokens: int = 512
    prompt_max_tokens: int = 8

    def __post_init__(self) -> None:
        super(LongPromptOptions, self).__post_init__()
        for name in ("stream_max_tokens", "prompt_max_tokens"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.tail_steps < 1:
            raise ValueError(f"tail_steps must be >= 1, got {self.tail_steps}")
        if self.lead_steps + self.tail_steps >= self.stream_max_tokens:
            raise ValueError(
                f"stream_max_tokens ({self.stream_max_tokens}) must exceed lead + tail steps "
                f"({self.lead_steps + self.tail_steps}): the streams must still decode when the prompt lands"
            )


class _LongPromptWatch:
    """The streams' chunk counts as they come: ``warmed`` once each has ``warmup`` chunks,
    ``first_token`` at the prompt's first token (the counts then are the marks), ``tail_done``
    once each has ``tail`` more."""

    def __init__(self, num_streams: int, warmup: int, tail: int) -> None:
        self.counts = [0] * num_streams
        self.warmup, self.tail = warmup, tail
        self.marks: list[int] | None = None
        self.warmed, self.first_token, self.tail_done = asyncio.Event(), asyncio.Event(), asyncio.Event()

    def stream(self, i: int) -> Callable[[int], None]:
        def seen(count: int) -> None:
            self.counts[i] = count
            if not self.warmed.is_set() and min(self.counts) >= self.warmup:
                self.warmed.set()
            marks = self.marks
            if marks is not None and all(c >= m + self.tail for c, m in zip(self.counts, marks, strict=True)):
                self.tail_done.set()

        return seen

    def prompt(self, count: int) -> None:
        if count == 1:
            self.marks = list(self.counts)
            self.first_token.set()


async def run_long_prompt(
    http: httpx.AsyncClient,
    endpoint: Endpoint,
    sizer: PromptSizer,
    options: LongPromptOptions,
    *,
    seed: int = 0,
    interrupt: asyncio.Event | None = None,
) -> BenchRun:
    """The seed's experiment against a live server (see the module docstring). Once ``interrupt``
    is set (Ctrl-C) every request hangs up at once and nothing new is sent: the run holds what was
    measured by then (requests with no chunk left out) and ``extra["interrupted"]`` says in which
    phase: ``alone``, ``warm-up``, ``prompt`` (before its first token) or ``tail``."""
    rng = random.Random(seed)
    long_text, alone_text, cap = await _long_prompts(http, endpoint, sizer, options, rng)
    stream_texts = [sizer.prompt(options.context_tokens, rng) for _ in range(options.streams)]
    interrupted = interrupt.is_set if interrupt is not None else lambda: False
    alone = await stream_completion(http, endpoint, alone_text, 1, interrupt=interrupt)
    if not alone.chunk_times_s and not interrupted():
        raise ValueError(f"the long prompt failed on an idle server: {alone.error or alone.finish_reason}")

    n = options.streams
    watch = _LongPromptWatch(n, options.lead_steps, options.tail_steps)
    stop = asyncio.Event()

    phase = "alone"
    start_s = time.perf_counter()
    streams: list[asyncio.Future[StreamResult]] = []
    prompt_task: asyncio.Future[StreamResult] | None = None
    if not interrupted():
        phase = "warm-up"
        streams = [
            asyncio.ensure_future(
                stream_completion(
                    http,
                    endpoint,
                    text,
                    options.stream_max_tokens,
                    on_chunk=watch.stream(i),
                    stop=stop,
                    interrupt=interrupt,
                )
            )
            for i, text in enumerate(stream_texts)
        ]
        await wait_any(watch.warmed, streams)  # an interrupt ends every stream: these waits end too
    if not interrupted():
        phase = "prompt"
        prompt_task = asyncio.ensure_future(
            stream_completion(
                http,
                endpoint,
                long_text,
                options.prompt_max_tokens,
                on_chunk=watch.prompt,
                interrupt=interrupt,
            )
        )
        await wait_any(watch.first_token, [*streams, prompt_task])
        if watch.first_token.is_set():
            phase = "tail"
        await wait_any(watch.tail_done, streams)
    stop.set()
    stream_results = list(await asyncio.gather(*streams))
    prompt_result = await prompt_task if prompt_task is not None else None
    end_s = time.perf_counter()
    if interrupted():
        return _interrupted_long_prompt(stream_results, prompt_result, alone, options, start_s, end_s, phase)
    assert prompt_result is not None  # not interrupted: the prompt was sent
    run = build_run(
        [*stream_results, prompt_result],
        [options.context_tokens] * n + [options.prompt_tokens],
        start_s,
        end_s,
    )
    run.extra = _long_prompt_numbers(run, stream_results, prompt_result, alone, options)
    if cap is not None:
        run.extra["long_prompt_cap"] = cap
    return run


def long_prompt_target(options: LongPromptOptions, max_model_len: int | None) -> int:
    """The long prompt's tokens: as asked, capped where the context must also hold its output."""
    if max_model_len is None:
        return options.prompt_tokens
    return min(options.prompt_tokens, max_model_len - options.prompt_max_tokens)


async def _long_prompts(
    http: httpx.AsyncClient,
    endpoint: Endpoint,
    sizer: PromptSizer,
    options: LongPromptOptions,
    rng: random.Random,
) -> tuple[str, str, int | None]:
    """The long prompt's two texts (with the streams, and alone), trimmed until the server counts
    at most ``prompt_tokens`` (``/tokenize``; without the route they stay approximate), and, when
    the server's context cannot hold ``prompt_tokens`` plus the prompt's output, the cap they were
    fitted to instead (without the route: sized a margin short of it)."""
    target = long_prompt_target(options, endpoint.max_model_len)
    if target < 1:
        raise ValueError(
            f"the server's context ({endpoint.max_model_len} tokens) holds no prompt with "
            f"{options.prompt_max_tokens} output tokens"
        )
    capped = target < options.prompt_tokens
    texts = [sizer.prompt(target, rng), sizer.prompt(target, rng)]
    fitted, counted = await fit_prompts(http, endpoint, texts, [target, target])
    if not counted and capped:
        fitted = [sizer.prompt(fallback_target(target), rng) for _ in texts]
    return fitted[0], fitted[1], target if capped else None


def _interrupted_long_prompt(
    streams: list[StreamResult],
    prompt: StreamResult | None,
    alone: StreamResult,
    options: LongPromptOptions,
    start_s: float,
    end_s: float,
    phase: str,
) -> BenchRun:
    """What a long-prompt run interrupted in ``phase`` had measured: the requests that had a chunk."""
    sent = [(s, options.context_tokens) for s in streams]
    if prompt is not None:
        sent.append((prompt, options.prompt_tokens))
    kept = [(result, tokens) for result, tokens in sent if result.chunk_times_s]
    run = build_run([r for r, _ in kept], [t for _, t in kept], start_s, end_s)
    kept_streams = [r for r, _ in kept if r is not prompt]
    kept_prompt = prompt if prompt is not None and prompt.chunk_times_s else None
    run.extra = _long_prompt_numbers(run, kept_streams, kept_prompt, alone, options)
    run.extra["interrupted"] = {"phase": phase}
    return run


async def wait_any(event: asyncio.Event, tasks: Sequence[asyncio.Future[Any]]) -> None:
    """Wait for ``event``, or until every task has ended (a failure must not hang the run)."""
    waiter: asyncio.Future[Any] = asyncio.ensure_future(event.wait())
    pending: set[asyncio.Future[Any]] = set(tasks)
    while not waiter.done() and pending:
        _, pending = await asyncio.wait({waiter, *pending}, return_when=asyncio.FIRST_COMPLETED)
        pending.discard(waiter)
    waiter.cancel()


def _long_prompt_numbers(
    run: BenchRun,
    streams: list[StreamResult],
    prompt: StreamResult | None,
    alone: StreamResult,
    options: LongPromptOptions,
) -> dict[str, Any]:
    """The scenario's numbers; ``prompt`` is the run's last record (None: interrupted before its
    first token, when the numbers left are None)."""
    # Gaps of the streams after their warm-up chunks: the first few include their own prefill.
    gaps_s = np.concatenate(
        [np.diff(s.chunk_times_s[options.lead_steps - 1 :]) for s in streams] or [np.zeros(0)]
    )
    finished_early = sum(s.finish_reason != "length" or s.error is not None for s in streams)
    ttft_ms = _ttft_ms(prompt) if prompt is not None else None
    return {
        "num_streams": options.streams,
        "long_prompt_tokens": run.records[-1].num_prompt_tokens if prompt is not None else None,
        "long_prompt_ttft_ms": ttft_ms,
        "long_prompt_alone_ttft_ms": _ttft_ms(alone),
        "streams_max_itl_ms": float(gaps_s.max()) * 1000 if gaps_s.size else None,
        "streams_median_itl_ms": float(np.median(gaps_s)) * 1000 if gaps_s.size else None,
        "streams_not_decoding_to_the_end": finished_early,
    }


def _ttft_ms(result: StreamResult) -> float | None:
    return (result.chunk_times_s[0] - result.sent_s) * 1000 if result.chunk_times_s else None
