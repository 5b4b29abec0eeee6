"""The seed's arrival served disaggregated: the prompt on a prefill group, its KV shipped to the
decode group, where the streams never share a step with it.

Priced from the same timer as the other rows, with no queue (the scenario has one prompt): the
prompt's first token comes from the prefill group after its prefill alone; its KV then travels
(:mod:`stallfree.costs.kv_transfer`), and it joins the streams, whose steps hold only decodes. The
price is GPUs: ``x`` prefill and ``y`` decode groups of ``tp`` each, where the other rows use one.
"""

from __future__ import annotations

from typing import Any

from stallfree.core import ScheduledChunk, StepPlan, synthetic_plan
from stallfree.core.step import StepCostModel
from stallfree.costs.kv_transfer import KvLink, PoolShape, kv_transfer
from stallfree.specs import ModelSpec


def parse_pools(text: str, tp: int = 1) -> PoolShape:
    """``2P4D`` -> 2 prefill and 4 decode groups of ``tp`` GPUs each."""
    try:
        return PoolShape.parse(text, tp, tp)
    except ValueError as exc:
        raise ValueError(f"argument --disaggregate: {exc}") from None


def disaggregated(
    pools: str,
    timer: StepCostModel,
    model: ModelSpec,
    dtype_bytes: int,
    tp: int,
    link: KvLink,
    *,
    streams: int,
    context_tokens: int,
    prompt_tokens: int,
    prefill_alone_s: float,
    decode_step_s: float,
) -> dict[str, Any]:
    """The disaggregated row of the scenario, as explain's JSON carries it (``decode_step_s``: the
    streams' step, which the rows before priced)."""
    shape = parse_pools(pools, tp)
    move = kv_transfer(model, prompt_tokens, dtype_bytes, link, tp_prefill=tp, tp_decode=tp)
    layerwise = kv_transfer(
        model,
        prompt_tokens,
        dtype_bytes,
        link,
        tp_prefill=tp,
        tp_decode=tp,
        prefill_s=prefill_alone_s,
        overlap=True,
    )
    # once its KV has arrived the prompt decodes beside the streams: one more row at its own context
    joined = StepPlan(
        (
            *synthetic_plan(streams, context_tokens).chunks,
            ScheduledChunk("prompt", prompt_tokens, 1, prompt_tokens + 1),
        )
    )
    joined_s = timer.step_time_s(joined)
    return {
        "pools": pools,
        "gpus": shape.num_gpus,
        "aggregated_gpus": tp,
        "kv_link": link.name,
        "kv_link_bytes_per_s": link.bytes_per_s,
        "kv_links": move.num_links,
        "kv_bytes": move.num_bytes,
        "kv_transfer_s": move.wire_s,
        "kv_transfer_after_prefill_layerwise_s": layerwise.exposed_s,
        "max_gap_s": max(decode_step_s, joined_s),
        "median_gap_s": decode_step_s,
        "ttft_s": prefill_alone_s,
        "ttft_vs_alone": 1.0,
        "first_decode_token_s": prefill_alone_s + move.wire_s + joined_s,
    }
