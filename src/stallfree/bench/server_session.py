"""One server under measurement, from outside: streams and lone prompts sent through the bench client,
their chunks' times read back as decode gaps, TTFTs and the gap a prompt makes (see
:mod:`stallfree.bench.profile` for what each point is)."""

from __future__ import annotations

import asyncio
import random
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from itertools import pairwise

import httpx

from stallfree.bench.client import Endpoint, StreamResult, count_tokens, stream_completion
from stallfree.bench.prompts import PromptSizer, fallback_target, fit_prompts
from stallfree.bench.scenarios import wait_any

CACHE_BLOCK_TOKENS = 16  # vLLM's default KV block: its prefix cache holds whole blocks
DECODE_ATTEMPTS = 3  # a decode point whose streams ran out before overlapping is sent again


class ServerSession:
    """One server, its calibrated prompt sizes and a seeded source of fresh prompt text."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        endpoint: Endpoint,
        sizer: PromptSizer,
        rng: random.Random,
        context: int,
        budget: int,
    ) -> None:
        self.http, self.endpoint, self.sizer, self.rng = http, endpoint, sizer, rng
        self.context, self.budget = context, budget

    def pinned(self, max_tokens: int) -> Endpoint:
        """The endpoint with ``min_tokens`` pinned to ``max_tokens`` (where ignore_eos is sent)."""
        if "ignore_eos" not in self.endpoint.extra_body:
            return self.endpoint
        return replace(self.endpoint, extra_body={**self.endpoint.extra_body, "min_tokens": max_tokens})

    async def prompts(self, num_tokens: int, count: int) -> tuple[list[str], int]:
        """``count`` fresh prompts of at most ``num_tokens`` tokens (the server's count where it
        can count) and their median length."""
        texts = [self.sizer.prompt(num_tokens, self.rng) for _ in range(count)]
        fitted, counted = await fit_prompts(self.http, self.endpoint, texts, [num_tokens] * count)
        if not counted:
            target = fallback_target(num_tokens)
            return [self.sizer.prompt(target, self.rng) for _ in range(count)], target
        lengths = [await count_tokens(self.http, self.endpoint, text) or num_tokens for text in fitted]
        return fitted, int(statistics.median(lengths))

    def ramp_steps(self, num_seqs: int, tokens: int) -> int:
        """Steps until ``num_seqs`` new ``tokens``-token prompts all decode, at most (roughly)."""
        return -(-num_seqs * tokens // self.budget) + num_seqs

    async def decode(
        self, num_seqs: int, context: int, steps: int, sampling: Mapping[str, float] | None = None
    ) -> tuple[list[float], int]:
        """Each step's median gap over ``num_seqs`` streams once all decode (sampling as
        ``sampling`` says, else greedily); the mean context."""
        texts, tokens = await self.prompts(context, num_seqs)
        room = self.context - tokens - 4
        max_tokens = min(steps + 8 + 2 * self.ramp_steps(num_seqs, tokens), room)
        for _ in range(DECODE_ATTEMPTS):
            per_step, marks = await self._decode_once(texts, max_tokens, steps, sampling)
            if len(per_step) >= 3 or max_tokens >= room:
                break
            # The streams' first tokens reached the client far apart (a loaded client reads some
            # streams late): the early ones ran out of tokens first. Again with more room.
            max_tokens = min(2 * max_tokens, room)
        if len(per_step) < 3:
            raise ValueError(
                f"{num_seqs} streams at {tokens} tokens decoded together for {len(per_step)} steps only: "
                "does the server stop at EOS despite ignore_eos, or run fewer streams at once than --max-num-seqs?"
            )
        return per_step, tokens + int(statistics.median(marks)) + len(per_step) // 2

    async def _decode_once(
        self, texts: Sequence[str], max_tokens: int, steps: int, sampling: Mapping[str, float] | None
    ) -> tuple[list[float], list[int]]:
        """The median gap of each step the streams of ``texts`` decoded together (at most
        ``steps``), counted from the chunk each had when the last one's first arrived; those marks."""
        marks: list[int] = []
        counts = [0] * len(texts)
        done = asyncio.Event()

        def seen(i: int) -> Callable[[int], None]:
            def on_chunk(count: int) -> None:
                counts[i] = count
                if not marks and min(counts) >= 1:
                    marks.extend(counts)
                if marks and all(c >= m + steps + 1 for c, m in zip(counts, marks, strict=True)):
                    done.set()

            return on_chunk

        results = await self._streams(texts, max_tokens, seen, done, sampling)
        per_step = []
        for k in range(steps):
            gaps = [
                r.chunk_times_s[m + k + 1] - r.chunk_times_s[m + k]
                for r, m in zip(results, marks, strict=True)
                if len(r.chunk_times_s) > m + k + 1
            ]
            if len(gaps) < len(texts):
                break  # a stream ended: fewer streams decode from here on
            per_step.append(statistics.median(gaps))
        return per_step, marks

    async def mixed(
        self, num_seqs: int, context: int, num_tokens: int, repeats: int
    ) -> tuple[list[float], int, int]:
        """The step that prefills an ``num_tokens``-token prompt beside ``num_seqs`` streams,
        ``repeats`` times; the streams' mean context and the prompt's length."""
        texts, tokens = await self.prompts(context, num_seqs)
        prompts, length = await self.prompts(num_tokens, repeats)
        counts = [0] * num_seqs
        want = [1]  # the chunks every stream must have for ``ready``
        ready = asyncio.Event()

        def seen(i: int) -> Callable[[int], None]:
            def on_chunk(count: int) -> None:
                counts[i] = count
                if min(counts) >= want[0]:
                    ready.set()

            return on_chunk

        async def every_stream_has(num_chunks: int) -> bool:
            """Wait until every stream has ``num_chunks`` chunks; False if one ended first."""
            want[0] = num_chunks
            ready.clear()
            if min(counts) < num_chunks:
                await wait_any(ready, tasks)
            return min(counts) >= num_chunks

        stop = asyncio.Event()
        max_tokens = max(
            8, min(self.ramp_steps(num_seqs, tokens) + 16 * repeats + 16, self.context - tokens - 4)
        )
        endpoint = self.pinned(max_tokens)
        tasks = [
            asyncio.ensure_future(
                stream_completion(self.http, endpoint, text, max_tokens, on_chunk=seen(i), stop=stop)
            )
            for i, text in enumerate(texts)
        ]
        marks: list[tuple[float, float]] = []  # (sent, first token) of each prompt
        generated: list[int] = []
        try:
            if await every_stream_has(2):
                for prompt in prompts:
                    generated.append(int(statistics.median(counts)))
                    alone = await stream_completion(self.http, self.pinned(1), prompt, 1)
                    if not alone.chunk_times_s:
                        raise ValueError(
                            f"a {length}-token prompt failed: {alone.error or alone.finish_reason}"
                        )
                    marks.append((alone.sent_s, alone.chunk_times_s[0]))
                    length = alone.num_prompt_tokens or length
                    # Two more tokens each: the gap after the prompt's step, and a quiet step.
                    if not await every_stream_has(max(counts) + 2):
                        break
        finally:
            stop.set()
            results = list(await asyncio.gather(*tasks))
        _check(results)
        steps = []
        for sent_s, first_s in marks:
            longest = [
                max(
                    (b - a for a, b in pairwise(r.chunk_times_s) if b > sent_s and a < first_s),
                    default=0.0,
                )
                for r in results
            ]
            # Kept only if every stream still decoded after the prompt's first token: one that was
            # queued until a stream ended measured nothing (a server full at max_num_seqs).
            if all(g > 0 for g in longest) and all(r.chunk_times_s[-1] > first_s for r in results):
                steps.append(statistics.median(longest))
        if not steps:
            raise ValueError(
                f"no stream decoded while a {length}-token prompt was prefilled beside {num_seqs} streams: "
                "does the server run fewer sequences at once than --max-num-seqs?"
            )
        return steps, tokens + int(statistics.median(generated)), length

    async def together(
        self, count: int, num_tokens: int, repeats: int, lead_s: float
    ) -> tuple[list[float], int]:
        """The step that prefills ``count`` prompts of ``num_tokens`` tokens together, ``repeats``
        times: a budget-sized prompt first, a step of its own (it fills the budget), and the
        ``count`` prompts sent ``lead_s`` after it, while that step runs, so that they all wait for
        the next one; each time, their median first token less the first prompt's. Their median
        length."""
        times, lengths = [], []
        for _ in range(repeats):
            (blocker,), _ = await self.prompts(self.budget, 1)
            prompts, length = await self.prompts(num_tokens, count)
            first = asyncio.ensure_future(stream_completion(self.http, self.pinned(1), blocker, 1))
            await asyncio.sleep(lead_s)
            results = await asyncio.gather(
                *(stream_completion(self.http, self.pinned(1), prompt, 1) for prompt in prompts)
            )
            front = await first
            _check([front, *results])
            if not front.chunk_times_s or not all(r.chunk_times_s for r in results):
                raise ValueError(f"{count} prompts of {length} tokens sent together: one had no token")
            after = statistics.median(r.chunk_times_s[0] for r in results) - front.chunk_times_s[0]
            times.append(max(1e-6, after))
            lengths.append(int(statistics.median(r.num_prompt_tokens or length for r in results)))
        return times, int(statistics.median(lengths))

    async def ttft(self, num_tokens: int, repeats: int, text: str | None = None) -> tuple[list[float], int]:
        """A lone request's time to first token, ``repeats`` times (``text``: that prompt each time)."""
        times, lengths = [], []
        for _ in range(repeats):
            prompts, length = await self.prompts(num_tokens, 1) if text is None else ([text], num_tokens)
            result = await stream_completion(self.http, self.pinned(1), prompts[0], 1)
            if not result.chunk_times_s:
                raise ValueError(
                    f"a lone {length}-token prompt failed: {result.error or result.finish_reason}"
                )
            times.append(result.chunk_times_s[0] - result.sent_s)
            lengths.append(result.num_prompt_tokens or length)
        return times, int(statistics.median(lengths))

    async def after_cached(
        self, context: int, num_tokens: int, repeats: int
    ) -> tuple[list[float], list[float], int, int]:
        """A fresh ``context``-token prompt's TTFT, then the same text with ``num_tokens`` more:
        the second TTFTs, the first ones (pair by pair), and the second's tokens cached (whole
        blocks of :data:`CACHE_BLOCK_TOKENS` before the first prompt's last token) and new."""
        firsts: list[float] = []
        seconds: list[float] = []
        cached: list[int] = []
        total: list[int] = []
        for _ in range(repeats):
            (base,), length = await self.prompts(context, 1)
            (tail,), _ = await self.prompts(num_tokens, 1)
            for text, times in ((base, firsts), (f"{base} {tail}", seconds)):
                result = await stream_completion(self.http, self.pinned(1), text, 1)
                if not result.chunk_times_s:
                    raise ValueError(f"a lone prompt failed: {result.error or result.finish_reason}")
                times.append(result.chunk_times_s[0] - result.sent_s)
            cached.append((length - 1) // CACHE_BLOCK_TOKENS * CACHE_BLOCK_TOKENS)
            total.append(result.num_prompt_tokens or length + num_tokens)
        hit = int(statistics.median(cached))
        return seconds, firsts, hit, int(statistics.median(total)) - hit

    async def _streams(
        self,
        texts: Sequence[str],
        max_tokens: int,
        seen: Callable[[int], Callable[[int], None]],
        done: asyncio.Event,
        sampling: Mapping[str, float] | None = None,
    ) -> list[StreamResult]:
        stop = asyncio.Event()
        endpoint = self.pinned(max_tokens)
        if sampling:
            endpoint = replace(endpoint, extra_body={**endpoint.extra_body, **sampling})
        tasks = [
            asyncio.ensure_future(
                stream_completion(self.http, endpoint, t, max_tokens, on_chunk=seen(i), stop=stop)
            )
            for i, t in enumerate(texts)
        ]
        try:
            await wait_any(done, tasks)
        finally:
            stop.set()
            results = list(await asyncio.gather(*tasks))
        _check(results)
        return results


def _check(results: Sequence[StreamResult]) -> None:
    failed = [r for r in results if r.error]
    if failed:
        raise ValueError(f"{len(failed)} of {len(results)} streams failed: {failed[0].error}")
