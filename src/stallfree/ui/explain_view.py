"""The explain view's data: ``stallfree explain --json`` for the page's settings, plus what to draw.

The settings become the same :class:`~stallfree.explain.options.ExplainOptions` the command
line builds from its flags, run by the same :func:`~stallfree.explain.backends.run_explain`, so
the numbers equal the CLI's for the same flags (``explain`` below is exactly the ``--json``
object, ``table`` exactly its table). What is added is only for drawing: every step of both
runs, a tick per token for up to :data:`MAX_STREAMS_DRAWN` streams, and where the longest gap
is. Limits keep one request within about a second.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

from stallfree.core.config import ceil_div
from stallfree.explain.options import SCENARIO_DEFAULTS, ExplainOptions
from stallfree.ui.errors import ApiError, check_known, choice, one_value, whole

if TYPE_CHECKING:
    from stallfree.explain import PolicyRun

MAX_STREAMS_DRAWN = 16
MAX_PROMPT_TOKENS = 65536
MAX_CONTEXT_TOKENS = 131072
MAX_STREAMS = 128
MAX_TP = 64
MAX_CHUNK_STEPS = 4096

PARAMS = (
    "model",
    "hardware",
    "tp",
    "cost_model",
    "streams",
    "context_tokens",
    "prompt_tokens",
    "chunk_tokens",
    "token_budget",
)


def defaults() -> dict[str, Any]:
    """What ``stallfree explain`` runs with no flags (the seed's scenario), as the page's settings."""
    options, seed = ExplainOptions(), SCENARIO_DEFAULTS["roofline"]
    return {
        "model": seed.model,
        "hardware": options.hardware,
        "tp": options.tp,
        "cost_model": options.cost_model,
        "streams": options.streams,
        "context_tokens": seed.context_tokens,
        "prompt_tokens": seed.prompt_tokens,
        "chunk_tokens": seed.chunk_tokens,
    }


def options_from_query(query: dict[str, list[str]]) -> ExplainOptions:
    """The page's settings as explain options (roofline, presets only, bounded sizes)."""
    from stallfree.costs import COST_MODEL_KINDS
    from stallfree.specs import HARDWARE_PRESETS, MODEL_PRESETS

    check_known(query, PARAMS)
    default = defaults()
    model = choice(query, "model", default["model"], tuple(MODEL_PRESETS))
    hardware = choice(query, "hardware", default["hardware"], tuple(HARDWARE_PRESETS))
    cost_model = choice(query, "cost_model", default["cost_model"], COST_MODEL_KINDS)
    tp = whole(query, "tp", default["tp"], minimum=1, maximum=MAX_TP)
    streams = whole(query, "streams", default["streams"], minimum=1, maximum=MAX_STREAMS)
    context = whole(query, "context_tokens", default["context_tokens"], minimum=1, maximum=MAX_CONTEXT_TOKENS)
    prompt = whole(query, "prompt_tokens", default["prompt_tokens"], minimum=1, maximum=MAX_PROMPT_TOKENS)
    chunk = _chunk_tokens(query, streams, default["chunk_tokens"])
    if ceil_div(prompt, chunk) > MAX_CHUNK_STEPS:
        raise ApiError(
            f"a {prompt:,}-token prompt in {chunk}-token chunks takes more than {MAX_CHUNK_STEPS:,} steps; "
            f"use chunks of at least {ceil_div(prompt, MAX_CHUNK_STEPS)} tokens",
            param="chunk_tokens",
        )
    return ExplainOptions(
        model=model,
        hardware=hardware,
        tp=tp,
        cost_model=cost_model,
        streams=streams,
        context_tokens=context,
        prompt_tokens=prompt,
        chunk_tokens=chunk,
    )


def _chunk_tokens(query: dict[str, list[str]], streams: int, default: int) -> int:
    """Chunk tokens, given directly or as a token budget: every stream decodes in every step of
    the scenario, so a budget carries ``budget - streams`` prompt tokens a step."""
    if one_value(query, "chunk_tokens") and one_value(query, "token_budget"):
        raise ApiError("give chunk_tokens or token_budget, not both", param="token_budget")
    if one_value(query, "token_budget"):
        budget = whole(query, "token_budget", 0, minimum=1, maximum=MAX_PROMPT_TOKENS + MAX_STREAMS)
        if budget <= streams:
            raise ApiError(
                f"token budget {budget:,} leaves no room for the prompt beside {streams} decode tokens; "
                f"give more than {streams}",
                param="token_budget",
            )
        return budget - streams
    return whole(query, "chunk_tokens", default, minimum=1, maximum=MAX_PROMPT_TOKENS)


def explain_view(query: dict[str, list[str]]) -> dict[str, Any]:
    """``GET /api/explain``: the CLI's JSON for these settings, its table, and the timeline to draw."""
    return payload(options_from_query(query))


def payload(options: ExplainOptions) -> dict[str, Any]:
    """Everything the page shows for ``options``."""
    from stallfree.explain.backends import run_explain
    from stallfree.explain.report import format_explain

    result = run_explain(options)
    out = result.to_json()
    runs = {name: _run_view(run) for name, run in result.runs.items()}
    return {
        "explain": out,
        "table": format_explain(out),
        "token_budget": out["scenario"]["chunk_tokens"] + out["scenario"]["streams"],
        "timeline": {
            "end_s": max(r["steps"][-1][0] + r["steps"][-1][1] for r in runs.values()),
            "runs": runs,
        },
    }


def _run_view(run: PolicyRun) -> dict[str, Any]:
    """One policy's run as the timeline draws it."""
    from stallfree.explain import PROMPT_ID

    streams = sorted((rid for rid in run.token_times_s if rid != PROMPT_ID), key=lambda r: int(r[1:]))
    # The longest gap, located: the same pairs PolicyRun.gaps_s is made of.
    gap, stream, start = max(
        (b - a, rid, a) for rid in streams for a, b in itertools.pairwise(run.token_times_s[rid])
    )
    return {
        "policy": run.policy,
        "arrival_s": run.arrival_s,
        "first_token_s": run.first_token_s,
        "ttft_s": run.ttft_s,
        "max_gap": {"gap_s": gap, "stream": stream, "start_s": start, "end_s": start + gap},
        # [start_s, duration_s, decode tokens, prompt tokens] per step
        "steps": [[s.start_s, s.duration_s, s.num_decode_tokens, s.num_prefill_tokens] for s in run.steps],
        "num_streams": len(streams),
        "streams": {rid: list(run.token_times_s[rid]) for rid in streams[:MAX_STREAMS_DRAWN]},
    }
