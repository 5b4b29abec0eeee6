"""One benchmark run against a live endpoint, as ``stallfree bench`` does it: a
:class:`BenchSpec` in, the result dict (vLLM's keys plus ours) out.

The run discovers the model and its context, sizes prompts on the server (:mod:`.prompts`), runs
the scenario (:mod:`.scenarios`, :mod:`.agents`): the long-prompt experiment, a sampled workload
open loop, multi-turn or agent sessions closed loop, and scores it with
:func:`stallfree.metrics.summarize`. A set ``stop`` event (Ctrl-C) ends it early with what was measured (``interrupted`` in the result).
"""

from __future__ import annotations

import asyncio
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

import httpx
import numpy as np

from stallfree.bench import client as bc
from stallfree.bench import spec_decode
from stallfree.bench.agents import run_agents
from stallfree.bench.fleet import fleet_json, list_workers, scrape
from stallfree.bench.prompts import PromptSizer, calibrate, fallback_target, fit_prompts
from stallfree.bench.scenarios import (
    BenchRun,
    LongPromptOptions,
    long_prompt_target,
    run_long_prompt,
    run_sessions,
    run_workload,
)
from stallfree.metrics import ItlAccumulator, summarize
from stallfree.workload import Workload, WorkloadArrays, sample, sample_sessions
from stallfree.workload.agents import AgentTurns
from stallfree.workload.classes import TrafficClasses, class_summaries, classes_of

CONTEXT_MARGIN = 0.05  # of the server's context, left free when capping lengths to it


def _check_fits(endpoint: bc.Endpoint, longest: int, what: str, fix: str) -> None:
    """Refuse, before anything is sent, a request of ``longest`` tokens the server's context (less
    :data:`CONTEXT_MARGIN`) cannot hold: ``{what} N tokens; the server's context is C: {fix}``."""
    context = endpoint.max_model_len
    if context is not None and longest > context * (1 - CONTEXT_MARGIN):
        raise ValueError(f"{what} {longest:,} tokens; the server's context is {context:,}: {fix}")


@dataclass(frozen=True, slots=True)
class BenchSpec:
    """What to run. ``workload`` None: the long-prompt scenario (``long_prompt``). ``sampling``:
    fields sent with every request. ``max_tokens`` replaces the workload's output lengths.
    ``chars_per_token`` skips calibration. ``max_model_len`` None: what /v1/models lists.
    ``text_seed``: a sampled workload's prompt text from its own seed (None: ``seed``), so that a
    run can repeat another's arrivals and lengths with text no prompt cache holds.
    ``prompt_texts``: the user's own prompts instead of sized text (request ``i`` sends
    ``prompt_texts[i % len]``)."""

    base_url: str
    scenario: str
    seed: int
    text_seed: int | None = None
    model: str | None = None
    api_key: str | None = None
    max_model_len: int | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    chars_per_token: float | None = None
    timeout_s: float = 600.0
    long_prompt: LongPromptOptions = field(default_factory=LongPromptOptions)
    workload: Workload | None = None
    num_requests: int | None = None
    max_tokens: int | None = None
    request_rate: float | None = None
    burstiness: float | None = None
    goodput: dict[str, float] | None = None
    prompt_texts: tuple[str, ...] | None = None  # request i sends prompt_texts[i % len]
    agents: AgentTurns | None = None  # the agents scenario's turns (workload None)
    classes: TrafficClasses | None = None  # the classes scenario's (workload None)


async def run_bench(
    spec: BenchSpec,
    stop: asyncio.Event,
    *,
    on_done: Callable[[], None] | None = None,
    started: Callable[[], None] = lambda: None,
    note: Callable[[str], None] = lambda text: print(text, file=sys.stderr),
) -> dict[str, Any]:
    """Run ``spec``: ``started`` once the scenario begins (where ``stop`` starts to count: the
    CLI hooks Ctrl-C to it there), ``on_done`` after each request, ``note`` for what a user
    should know."""
    async with bc.client(spec.timeout_s) as http:
        model, listed_len = await bc.discover(http, spec.base_url, spec.api_key, spec.model)
        max_model_len = spec.max_model_len or listed_len
        endpoint = bc.Endpoint(
            base_url=spec.base_url.rstrip("/"),
            model=model,
            api_key=spec.api_key,
            extra_body=spec.sampling,
            max_model_len=max_model_len,
        )
        if spec.chars_per_token:
            sizer = PromptSizer(tokens_per_char=1 / spec.chars_per_token)
        else:
            sizer = await calibrate(http, endpoint, spec.seed)
        workload = spec.workload
        workers = await list_workers(http, spec.base_url)
        before = await scrape(http, workers) if workers else []
        servers = workers or [spec.base_url]
        spec_before = await spec_decode.scrape(http, servers)
        started()
        if spec.agents is not None:
            run = await _agents(http, endpoint, sizer, spec, spec.agents, stop, on_done)
        elif spec.classes is not None:
            run = await _classes(http, endpoint, sizer, spec, spec.classes, stop, on_done)
        elif workload is None:
            run = await _long_prompt(http, endpoint, sizer, spec, stop, note)
        elif workload.sessions is not None:
            run = await _sessions(http, endpoint, sizer, spec, workload, stop, on_done)
        else:
            run = await _workload(http, endpoint, sizer, spec, workload, stop, on_done, note)
        fleet = fleet_json(workers, before, await scrape(http, workers)) if workers else None
        drafts = spec_decode.moved(spec_before, await spec_decode.scrape(http, servers))
    return {
        "date": datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S"),
        "backend": "openai",
        "base_url": endpoint.base_url,
        "model_id": model,
        "scenario": spec.scenario,
        "num_prompts": len(run.records),
        "request_rate": spec.request_rate if spec.request_rate is not None else "inf",
        "burstiness": spec.burstiness if spec.burstiness is not None else 1.0,
        "seed": spec.seed,
        **({} if spec.text_seed is None else {"text_seed": spec.text_seed}),
        "sampling": {k: v for k, v in endpoint.extra_body.items() if k != "ignore_eos"},
        "tokens_per_char": sizer.tokens_per_char,
        **summarize(run.records, run.itl, run.duration_s, spec.goodput),
        **run.extra,
        **({"fleet": fleet} if fleet is not None else {}),
        **({"spec_decode": drafts} if drafts is not None else {}),
        **run.per_request(),
    }


async def _long_prompt(
    http: httpx.AsyncClient,
    endpoint: bc.Endpoint,
    sizer: PromptSizer,
    spec: BenchSpec,
    stop: asyncio.Event,
    note: Callable[[str], None],
) -> BenchRun:
    options = spec.long_prompt
    tokens = long_prompt_target(options, endpoint.max_model_len)
    asked = f" (capped from {options.prompt_tokens})" if tokens < options.prompt_tokens else ""
    note(f"long-prompt: {options.streams} streams, then a {max(tokens, 1)}-token prompt{asked}")
    run = await run_long_prompt(http, endpoint, sizer, options, seed=spec.seed, interrupt=stop)
    if "long_prompt_cap" in run.extra:
        note(
            f"note: the long prompt is capped at {run.extra['long_prompt_cap']} tokens: the server's "
            f"{endpoint.max_model_len}-token context also holds its {options.prompt_max_tokens} output tokens"
        )
    return run


async def _sessions(
    http: httpx.AsyncClient,
    endpoint: bc.Endpoint,
    sizer: PromptSizer,
    spec: BenchSpec,
    workload: Workload,
    stop: asyncio.Event,
    on_done: Callable[[], None] | None,
) -> BenchRun:
    """Multi-turn sessions, closed loop (see :func:`stallfree.bench.scenarios.run_sessions`)."""
    sessions = workload.sessions
    assert sessions is not None and spec.num_requests is not None  # a sessions workload says both
    starts_s, messages, answers = sample_sessions(workload, spec.num_requests, spec.seed)
    if spec.max_tokens is not None:
        answers[:] = spec.max_tokens
    grown = messages.reshape(-1, sessions.turns).sum(1) + answers.reshape(-1, sessions.turns).sum(1)
    longest = sessions.system_prompt_tokens + int(grown.max())
    _check_fits(endpoint, longest, "a session grows to", "fewer --turns or shorter messages and answers")
    return await run_sessions(
        http, endpoint, sessions, starts_s.tolist(), messages.tolist(), answers.tolist(), sizer,
        seed=spec.seed, on_done=on_done, stop=stop,
    )  # fmt: skip


async def _agents(
    http: httpx.AsyncClient,
    endpoint: bc.Endpoint,
    sizer: PromptSizer,
    spec: BenchSpec,
    agents: AgentTurns,
    stop: asyncio.Event,
    on_done: Callable[[], None] | None,
) -> BenchRun:
    """Agent sessions, closed loop (:func:`stallfree.bench.agents.run_agents`); refused before any
    is sent when a turn's prompt and answer would not fit the server's context."""
    longest = max(t.request.num_prompt_tokens + t.request.max_tokens for t in agents.turns)
    _check_fits(
        endpoint,
        longest,
        "an agent's turn grows to",
        "fewer --agent-turns, a shorter --agent-prefix-tokens or shorter --lengths",
    )
    return await run_agents(http, endpoint, agents, sizer, seed=spec.seed, on_done=on_done, stop=stop)


async def _classes(
    http: httpx.AsyncClient,
    endpoint: bc.Endpoint,
    sizer: PromptSizer,
    spec: BenchSpec,
    classes: TrafficClasses,
    stop: asyncio.Event,
    on_done: Callable[[], None] | None,
) -> BenchRun:
    """Traffic classes sent open loop, each request with its class's priority; the result adds
    each request's ``priorities`` and ``traffic_classes`` and each class's scores (``classes``)."""
    if spec.num_requests is None:
        raise ValueError("the classes scenario needs --num-requests")
    requests = classes.sample(spec.num_requests, spec.seed)
    longest = max(r.num_prompt_tokens + r.max_tokens for r in requests)
    _check_fits(endpoint, longest, "a class's request needs", "shorter lengths")
    arrays = WorkloadArrays(
        arrival_time_s=np.array([r.arrival_time_s for r in requests]),
        num_prompt_tokens=np.array([r.num_prompt_tokens for r in requests], dtype=np.int64),
        max_tokens=np.array([r.max_tokens for r in requests], dtype=np.int64),
    )
    seed = spec.seed if spec.text_seed is None else spec.text_seed
    priorities = [r.priority for r in requests]
    run = await run_workload(
        http, endpoint, arrays, sizer, seed=seed, on_done=on_done, stop=stop, priorities=priorities
    )
    if "interrupted" in run.extra:
        return run  # the finished requests' places are lost: no per-class scores
    class_itl: dict[str, ItlAccumulator] = {}
    for request, result in zip(requests, run.results, strict=True):
        assert request.traffic_class is not None  # every sampled request has its class
        gaps = np.diff(result.chunk_times_s)
        class_itl.setdefault(request.traffic_class, ItlAccumulator()).add_many(gaps, 1)
    run.extra["classes"] = class_summaries(
        classes.classes, classes_of(requests), run.records, class_itl, run.duration_s
    )
    run.extra["priorities"] = priorities
    run.extra["traffic_classes"] = [r.traffic_class for r in requests]
    return run


async def _workload(
    http: httpx.AsyncClient,
    endpoint: bc.Endpoint,
    sizer: PromptSizer,
    spec: BenchSpec,
    workload: Workload,
    stop: asyncio.Event,
    on_done: Callable[[], None] | None,
    note: Callable[[str], None],
) -> BenchRun:
    """A sampled workload sent open loop; lengths capped to the server's context when it says it."""
    context = endpoint.max_model_len
    if context is not None and workload.max_total_tokens is None:
        # A margin for prompt sizing, which is only as exact as the calibration line.
        workload = replace(workload, max_total_tokens=int(context * (1 - CONTEXT_MARGIN)))
    arrays = sample(workload, spec.num_requests, spec.seed)
    if spec.max_tokens is not None:
        arrays.max_tokens[:] = spec.max_tokens
    text_seed = spec.seed if spec.text_seed is None else spec.text_seed
    if spec.prompt_texts:
        given = spec.prompt_texts
        chosen = [given[i % len(given)] for i in range(len(arrays.max_tokens))]
        arrays.num_prompt_tokens[:] = [sizer.num_tokens(len(text)) for text in chosen]
        run = await run_workload(
            http, endpoint, arrays, sizer, seed=text_seed, on_done=on_done, texts=chosen, stop=stop
        )
        run.extra["prompts"] = "from a file"
        return run
    texts, capped = await _capped_prompts(http, endpoint, sizer, arrays, workload, text_seed, note)
    run = await run_workload(
        http, endpoint, arrays, sizer, seed=text_seed, on_done=on_done, texts=texts, stop=stop
    )
    if capped is not None:
        run.extra["prompt_caps"] = capped
    return run


async def _capped_prompts(
    http: httpx.AsyncClient,
    endpoint: bc.Endpoint,
    sizer: PromptSizer,
    arrays: WorkloadArrays,
    workload: Workload,
    seed: int,
    note: Callable[[str], None],
) -> tuple[list[str] | None, str | None]:
    """With a length cap (given, or the server's context), prompts the server itself counts
    within their requested length, so ``prompt <= --max-prompt-tokens`` and ``prompt + max_tokens
    <= --max-total-tokens`` hold on its tokenizer; None, None when nothing is capped."""
    if workload.max_prompt_tokens is None and workload.max_total_tokens is None:
        return None, None
    targets = [int(n) for n in arrays.num_prompt_tokens.tolist()]
    rng = random.Random(seed)
    texts = [sizer.prompt(n, rng) for n in targets]
    texts, counted = await fit_prompts(http, endpoint, texts, targets)
    if counted:
        return texts, "server-counted"
    rng = random.Random(seed)
    note("note: the server has no /tokenize route; prompts are sized 5% short of the caps (approximate)")
    return [sizer.prompt(fallback_target(n), rng) for n in targets], "margin"
