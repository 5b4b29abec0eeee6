"""Agent sessions against a live endpoint, closed loop: the turns of
:class:`~stallfree.workload.agents.AgentTurns` sent as the simulator releases them.

A turn that waits for nothing is sent at its start time; any other once every turn it waits for
has come back, plus its delay (the tool's wait), measured from the last of them to finish. Its
prompt is the session so far: the text of the turn it extends (that turn's prompt, then the
server's answer) and its new tokens; a turn that extends none starts from the shared prefix
(synthetic agents) or, for a trace's turn, from one text per ``hash_ids`` block, so two turns
that share blocks send the same text for them. A turn whose dependency failed is not sent (its
agent cannot go on), and is counted in ``extra["agents"]["not_sent"]``.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Callable

import httpx

from stallfree.bench.client import Endpoint, StreamResult, stream_completion
from stallfree.bench.prompts import PromptSizer
from stallfree.bench.scenarios import BenchRun, build_run, run_until_stopped
from stallfree.workload.agents import AgentTurn, AgentTurns


async def run_agents(
    http: httpx.AsyncClient,
    endpoint: Endpoint,
    agents: AgentTurns,
    sizer: PromptSizer,
    *,
    seed: int = 0,
    on_done: Callable[[], None] | None = None,
    stop: asyncio.Event | None = None,
) -> BenchRun:
    """Send every turn of ``agents`` (see the module docstring); records in send order."""
    texts = _Texts(agents, sizer, seed)
    finished_s: dict[str, float] = {}
    done = {t.request.request_id: asyncio.Event() for t in agents.turns}
    failed: set[str] = set()
    sent: list[tuple[StreamResult, int, str]] = []  # result, requested prompt tokens, request id

    async def turn(t: AgentTurn) -> None:
        rid = t.request.request_id
        try:
            if t.wait_for:
                await asyncio.gather(*(done[w].wait() for w in t.wait_for))
                if failed.intersection(t.wait_for):
                    failed.add(rid)
                    return
                await asyncio.sleep(max(finished_s[w] for w in t.wait_for) + t.delay_s - time.perf_counter())
            else:
                await asyncio.sleep(start_s + t.request.arrival_time_s - time.perf_counter())
            prompt = texts.prompt(t)
            result = await stream_completion(http, endpoint, prompt, t.request.max_tokens)
            finished_s[rid] = time.perf_counter()
            sent.append((result, t.request.num_prompt_tokens, rid))
            if on_done is not None:
                on_done()
            if result.error is not None:
                failed.add(rid)
            else:
                texts.answered(t, prompt + result.text + " ")
        finally:
            done[rid].set()

    start_s = time.perf_counter()
    tasks = [asyncio.ensure_future(turn(t)) for t in agents.turns]
    await run_until_stopped(tasks, stop)
    sent.sort(key=lambda row: row[0].sent_s)
    run = build_run([r for r, _, _ in sent], [n for _, n, _ in sent], start_s, time.perf_counter())
    run.extra["agents"] = {
        "workload": agents.description,
        "turns": len(agents),
        "conversations": agents.num_sessions,
        "sent": len(sent),
        "not_sent": len(failed - {rid for _, _, rid in sent}),
    }
    run.extra["turn_ids"] = [rid for _, _, rid in sent]
    if stop is not None and stop.is_set():
        run.extra["interrupted"] = {"finished": len(sent), "requests": len(agents)}
    return run


class _Texts:
    """Each turn's new text, drawn up front in turn order (sends stay on time and the text does
    not depend on which answer came first), and the session so far of each turn that another
    turn extends (dropped once the last such turn has read it)."""

    def __init__(self, agents: AgentTurns, sizer: PromptSizer, seed: int) -> None:
        self._sizer, self._seed = sizer, seed
        rng = random.Random(seed)
        prefix = agents.shared_prefix_tokens
        self._prefix = sizer.prompt(prefix, rng) + " " if prefix else ""
        self._new: dict[str, str] = {}
        for t in agents.turns:
            request, before = t.request, agents.by_id.get(t.extends) if t.extends else None
            if before is not None:
                num_new = (
                    request.num_prompt_tokens - before.request.num_prompt_tokens - before.request.max_tokens
                )
            else:
                num_new = request.num_prompt_tokens - prefix
            self._new[request.request_id] = sizer.prompt(max(1, num_new), rng)
        self._readers = Counter(t.extends for t in agents.turns if t.extends is not None)
        self._so_far: dict[str, str] = {}

    def prompt(self, turn: AgentTurn) -> str:
        new = self._new.pop(turn.request.request_id)
        if turn.extends is not None and turn.extends in self._so_far:
            history = self._so_far[turn.extends]
            self._readers[turn.extends] -= 1
            if not self._readers[turn.extends]:
                del self._so_far[turn.extends]
            return history + new
        blocks = turn.request.prompt_blocks
        if self._prefix or blocks is None or blocks.tokens_per_id == 1:
            return self._prefix + new
        return self._blocks_text(blocks.ids, blocks.tokens_per_id, turn.request.num_prompt_tokens)

    def answered(self, turn: AgentTurn, so_far: str) -> None:
        if self._readers[turn.request.request_id]:
            self._so_far[turn.request.request_id] = so_far

    def _blocks_text(self, ids: tuple[int, ...], per_id: int, num_tokens: int) -> str:
        """One text per block id, the same wherever the id appears; the prompt's tokens past the
        ids' are fresh text."""
        parts = []
        left = num_tokens
        for block_id in ids:
            if left <= 0:
                break
            parts.append(self._sizer.prompt(min(per_id, left), random.Random(f"{self._seed}:{block_id}")))
            left -= per_id
        if left > 0:
            parts.append(self._sizer.prompt(left, random.Random(f"{self._seed}:tail:{num_tokens}")))
        return " ".join(parts)
