"""The table ``stallfree bench`` prints: vLLM's benchmark rows, the long-prompt scenario's own,
and what an interrupted run covers."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from stallfree.metrics import format_metric
from stallfree.metrics.io import class_lines

_ROWS = (
    ("completed", "Successful requests", "{}"),
    ("failed", "Failed requests", "{}"),
    ("rejected", "Rejected requests", "{}"),
    ("duration", "Benchmark duration (s)", "{:.2f}"),
    ("total_input_tokens", "Total input tokens", "{}"),
    ("total_output_tokens", "Total generated tokens", "{}"),
    ("request_throughput", "Request throughput (req/s)", "{:.2f}"),
    ("output_throughput", "Output token throughput (tok/s)", "{:.2f}"),
    ("mean_ttft_ms", "Mean TTFT (ms)", "{:.2f}"),
    ("p99_ttft_ms", "P99 TTFT (ms)", "{:.2f}"),
    ("mean_tpot_ms", "Mean TPOT (ms)", "{:.2f}"),
    ("median_itl_ms", "Median ITL (ms)", "{:.2f}"),
    ("p99_itl_ms", "P99 ITL (ms)", "{:.2f}"),
    ("max_itl_ms", "Max ITL (ms)", "{:.2f}"),
    ("request_goodput", "Request goodput (req/s)", "{:.2f}"),
    ("long_prompt_tokens", "Long prompt tokens (server)", "{}"),
    ("long_prompt_alone_ttft_ms", "Long prompt TTFT alone (ms)", "{:.2f}"),
    ("long_prompt_ttft_ms", "Long prompt TTFT with streams (ms)", "{:.2f}"),
    ("streams_median_itl_ms", "Streams' median gap (ms)", "{:.2f}"),
    ("streams_max_itl_ms", "Streams' longest gap (ms)", "{:.2f}"),
)
# Rows of another scenario or of a phase not reached, left out when None; every other None (a
# latency with no sample, such as TPOT and ITL when no request had two tokens) shows as "-".
_OPTIONAL_ROWS = {
    "request_goodput",
    "long_prompt_tokens",
    "long_prompt_alone_ttft_ms",
    "long_prompt_ttft_ms",
    "streams_median_itl_ms",
    "streams_max_itl_ms",
}


# Where a long-prompt run was when Ctrl-C stopped it (its result's interrupted.phase).
_PHASES = {
    "alone": "while the long prompt ran alone",
    "warm-up": "while the streams warmed up",
    "prompt": "before the long prompt's first token",
    "tail": "after the long prompt's first token, before the streams' tail ended",
}


def interrupted_text(interrupted: dict[str, Any]) -> str:
    if "phase" in interrupted:  # long-prompt
        return f"stopped {_PHASES[interrupted['phase']]}; the table covers what was measured by then"
    return (
        f"{interrupted['finished']} of {interrupted['requests']} requests had finished; "
        "the table covers those"
    )


def _fleet_lines(fleet: Mapping[str, Any] | None) -> list[str]:
    """The router's replicas and what each served during the run (its /metrics, before and after)."""
    if not fleet:
        return []
    lines = [f"{'Replicas behind the router:':<42}{fleet['num_replicas']:>18}"]
    for r in fleet["replicas"]:
        c = r["counters"]
        if c is None:
            state = "up, no /metrics" if r["up_after"] else "down at the end"
            lines.append(f"  {r['url']}: {state}")
            continue
        hits = (
            f", prefix cache {c['prefix_cache_hits'] / c['prefix_cache_queries']:.1%} of "
            if c["prefix_cache_queries"]
            else ""
        )
        tokens = f"{c['prefix_cache_queries']:,.0f} tokens" if hits else ""
        lines.append(f"  {r['url']}: {c['requests']:,.0f} requests{hits}{tokens}")
    return lines


def format_result(result: Mapping[str, Any]) -> str:
    """The table ``stallfree bench`` prints for a result (vLLM's benchmark layout)."""
    lines = [f"{' ' + result['scenario'] + ' @ ' + result['base_url'] + ' ':=^60}"]
    for key, label, fmt in _ROWS:
        value = result.get(key)
        if value is not None or key not in _OPTIONAL_ROWS:
            lines.append(f"{label + ':':<42}{format_metric(value, fmt):>18}")
    if result.get("interrupted"):
        lines.append(f"INTERRUPTED: {interrupted_text(result['interrupted'])}")
    if result.get("streams_not_decoding_to_the_end"):
        lines.append(
            f"warning: {result['streams_not_decoding_to_the_end']} streams stopped before the measurement ended "
            "(failed, or hit --stream-max-tokens): their gaps do not cover the whole prompt"
        )
    errors = [e for e in result["errors"] if e]
    if errors:
        kinds = Counter(e.split(":")[0] for e in errors)
        lines.append(f"first error ({len(errors)} in all): {errors[0]}")
        if len(kinds) > 1:
            lines.append("errors by kind: " + ", ".join(f"{kind} x{n}" for kind, n in kinds.most_common()))
    lines += _fleet_lines(result.get("fleet"))
    if result.get("classes"):
        lines += class_lines("per class", result["classes"])
    lines.append("=" * 60)
    return "\n".join(lines)
