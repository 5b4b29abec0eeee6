"""The table ``stallfree explain`` prints, from its JSON object (:meth:`Explanation.to_json`).

The page shows the same text (``stallfree ui``), so it lives here, beside the scenario, and not
in the command line. It reads only the JSON: what is printed is what ``--json`` emits.
"""

from __future__ import annotations

import math
from typing import Any

from stallfree.sim.report import on_gpus

_CHUNK_NOTES = {
    "full": "  [attention over earlier chunks is charged]",
    "weights-only": "  [weights-only model: attention not charged; try --cost-model full]",
}
_RIDGE_NOTES = {"measured": " (measured: a mixed step costs <= 1.2x a decode step)"}


def _chunking(sc: dict[str, Any]) -> str:
    """How the chunked run cut the prompt: by a step-time target or a fixed chunk."""
    if sc.get("step_budget_ms"):
        return f"{sc['step_budget_ms']:g} ms steps"
    return f"{sc['chunk_tokens']}-token chunks"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms" if seconds < 1 else f"{seconds:,.2f} s"


def _disaggregated_lines(d: dict[str, Any], with_speed: bool) -> list[str]:
    """The disaggregated row, and what it costs: GPUs, the KV's trip."""
    label = f"disaggregated {d['pools']}"
    gb = d["kv_bytes"] / 1e9
    rate = d["kv_links"] * d["kv_link_bytes_per_s"] / 1e9
    return [
        f"  {label:<28}{_ms(d['max_gap_s']):>14}{_ms(d['median_gap_s']):>14}{_ms(d['ttft_s']):>14}"
        f"{d['ttft_vs_alone']:>9.3f}x" + (f"{'-':>19}" if with_speed else ""),
        f"    on {d['gpus']} GPUs where the rows above use {d['aggregated_gpus']}: the prompt's first token "
        f"comes from its prefill group; its {gb:,.2f} GB of KV cross {d['kv_link']} ({d['kv_links']} x "
        f"{d['kv_link_bytes_per_s'] / 1e9:,.1f} GB/s = {rate:,.0f} GB/s) in {_ms(d['kv_transfer_s'])} "
        f"({_ms(d['kv_transfer_after_prefill_layerwise_s'])} past the prefill if sent layer by layer); "
        f"its first decode token at {_ms(d['first_decode_token_s'])} (the first token a client sees through "
        "vLLM's KV connectors, whose decode server samples it again; simulate --disaggregate's TTFT)",
    ]


def _speculative_lines(spec: dict[str, Any]) -> list[str]:
    """The drafts' sweep: the budget moving from the prompt's chunk to the streams' drafts."""
    rates = ", ".join(f"{r:.0%}" for r in spec["acceptance_rates"][: spec["num_speculative_tokens"]])
    lines = [
        "",
        f"  drafts (accepted by position {rates}; drafting costs nothing, as n-gram lookup), in "
        f"{spec['token_budget']}-token steps under vLLM's rule:",
        f"  {'drafts':>8}{'tokens/s a stream':>19}{'longest gap':>14}{'prompt TTFT':>14}{'prompt/step':>13}",
    ]
    for p in spec["sweep"]:
        lines.append(
            f"  {p['num_speculative_tokens']:>8}{p['stream_tokens_per_s']:>19,.1f}{_ms(p['max_gap_s']):>14}"
            f"{_ms(p['ttft_s']):>14}{p['prompt_tokens_per_step']:>13,.0f}"
        )
    return lines


def format_explain(out: dict[str, Any]) -> str:
    """The human-readable report of an explain JSON object (:meth:`Explanation.to_json`)."""
    sc = out["scenario"]
    lines = [
        f"{sc['model']} on {on_gpus(sc)} ({sc['engine']}, cost model: {sc['cost_model']})",
        f"{sc['streams']} streams decoding at {sc['context_tokens']:,} tokens of context; a {sc['prompt_tokens']:,}-token prompt arrives"
        + (
            f", its first {sc['cached_prefix_tokens']:,} tokens in the prefix cache (only the rest is computed)."
            if sc.get("cached_prefix_tokens") and not sc.get("cached_prefix_link")
            else f", its first {sc.get('cached_prefix_tokens', 0):,} tokens loaded first from a lower KV tier over "
            f"{sc.get('cached_prefix_link')} ({sc.get('cached_prefix_gb_per_gpu', 0):,.2f} GB a GPU, "
            f"{_ms(sc.get('cached_prefix_load_s', 0.0))}, while the streams run); only the rest is computed."
            if sc.get("cached_prefix_link")
            else "."
        ),
        *([f"chunk {sc['chunk_tokens']} tokens, {sc['chunk_reason']}"] if sc.get("chunk_reason") else []),
        *(f"warning: {w}" for w in out.get("warnings", ())),
        "",
        f"  decode step ({sc['streams']} streams)   {_ms(out['decode_step_s'])}",
        f"  prompt prefill alone        {_ms(out['prefill_alone_s'])}",
        f"  ridge point                 {out['ridge_tokens']:,.0f} tokens per step"
        + _RIDGE_NOTES.get(sc["cost_model"], ""),
        *([f"  mixture of experts           {sc['moe']}"] if sc.get("moe") else []),
        "",
        f"  {'policy':<28}{'longest gap':>14}{'median gap':>14}{'prompt TTFT':>14}{'vs alone':>10}"
        + (f"{'tokens/s a stream':>19}" if out.get("speculative") else ""),
    ]
    for name, p in out["policies"].items():
        label = f"{name} ({_chunking(sc)})" if name == "chunked" else name
        speed = f"{p['stream_tokens_per_s']:>19,.1f}" if "stream_tokens_per_s" in p else ""
        lines.append(
            f"  {label:<28}{_ms(p['max_gap_s']):>14}{_ms(p['median_gap_s']):>14}{_ms(p['ttft_s']):>14}"
            f"{p['ttft_vs_alone']:>9.3f}x{speed}"
        )
    if out.get("disaggregated"):
        lines += _disaggregated_lines(out["disaggregated"], out.get("speculative") is not None)
    if out.get("speculative"):
        lines += _speculative_lines(out["speculative"])
    if out.get("predicted"):
        lines += [
            "",
            f"  the same scenario priced by the profile {sc['profile']} (x predicted / measured):",
            f"  {'policy':<28}{'longest gap':>20}{'median gap':>20}{'prompt TTFT':>20}",
        ]
        for name, p in out["predicted"].items():
            label = f"{name} ({_chunking(sc)})" if name == "chunked" else name
            cells = (f"{_ms(m['predicted'])} x{m['ratio']:.2f}" for m in p.values())
            lines.append(f"  {label:<28}" + "".join(f"{c:>20}" for c in cells))
    pc = out["prompt_chunks"]
    lines += [
        "",
        f"  chunked: the prompt's {pc['num_steps']} chunk steps cost {_ms(pc['first_step_s'])} (first) to "
        f"{_ms(pc['last_step_s'])} (last): {pc['last_vs_first']:.2f}x"
        + _CHUNK_NOTES.get(sc["cost_model"], ""),
    ]
    if sc.get("step_budget_ms"):
        sizes = pc["chunk_tokens"]
        over = pc["num_steps_over_budget"]
        lines.append(
            f"  chunk sizes along the prompt: {sizes[0]:,} (first) to {sizes[-2] if len(sizes) > 1 else sizes[0]:,} "
            f"(last full one) tokens; longest step {_ms(pc['max_step_s'])}; "
            + (
                f"{over} step(s) over the {sc['step_budget_ms']:g} ms target"
                if over
                else "every step within the target"
            )
        )
    lines += [
        "",
        f"  chunk sweep (ridge ~{out['ridge_tokens']:,.0f} tokens):",
        f"  {'chunk':>8}{'longest gap':>14}{'prompt TTFT':>14}{'vs alone':>10}",
    ]
    ridge = out["ridge_tokens"]
    nearest = min(
        (row["chunk_tokens"] for row in out["sweep"]), key=lambda c: abs(math.log(c / ridge)), default=0
    )
    for row in out["sweep"]:
        mark = "  <- ridge" if row["chunk_tokens"] == nearest else ""
        lines.append(
            f"  {row['chunk_tokens']:>8,}{_ms(row['max_gap_s']):>14}{_ms(row['ttft_s']):>14}{row['ttft_vs_alone']:>9.3f}x{mark}"
        )
    if "figures" in out:
        lines += ["", "  figures: " + ", ".join(out["figures"])]
    if "html" in out:
        lines += ["", f"  page: {out['html']}"]
    return "\n".join(lines)
