"""What the measured cost model made of a profile, as ``stallfree specs --profile`` prints it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stallfree.specs.speed import reference_spread


def format_parameters(p: Mapping[str, Any]) -> str:
    """``stallfree specs --profile``'s text: :meth:`MeasuredCostModel.parameters`, readable."""

    def ms(seconds: float) -> str:
        return f"{seconds * 1e3:.3f} ms"

    def rate(value: float | None, unit: str, scale: float) -> str:
        return "-" if value is None else f"{value / scale:,.1f} {unit}"

    lines = [
        f"measured    {p['profile']}",
        f"  fixed step cost          {ms(p['fixed_step_s'])} (a 1-token forward, weights included)",
        f"  weight streaming         {rate(p['weight_stream_bytes_per_s'], 'GB/s', 1e9)} (linear layers at 1 token)",
        f"  KV read by decodes       {rate(p['kv_read_bytes_per_s'], 'GB/s', 1e9)} effective"
        f" ({p['per_kv_token_s'] * 1e9:.1f} ns per cached token)",
        f"  attention (chunks)       {rate(p['attention_flops_per_s'], 'GFLOP/s', 1e9)} effective"
        f" ({p['per_pair_s'] * 1e9:.3f} ns per query-key pair), "
        f"{p['per_gather_token_s'] * 1e9:.1f} ns per gathered context token, {ms(p['per_chunk_s'])} per chunk",
        f"  per decode row           {ms(p['per_decode_s'])}",
        "  LM head by sampled rows  "
        + ", ".join(
            f"{lo}-{hi}: {ms(s)}/row"
            for lo, hi, s in zip(
                p["lm_head_knots"], p["lm_head_knots"][1:], p["lm_head_per_row_s_by_segment"], strict=False
            )
        ),
        "  sampler per row          "
        + ", ".join(f"{mode} {ms(s)}" for mode, s in p["sampling_per_row_s"].items()),
        f"  engine outside the model {ms(p['engine_overhead_step_s'])} a step + {ms(p['engine_overhead_per_row_s'])} a row",
        "  by tokens per step       forward (fixed + linear)    achieved      linear alone",
    ]
    for tokens, entry in p["by_tokens_per_step"].items():
        alone = (
            f"{ms(entry['linear_s']):>12} {entry['linear_flops_per_s'] / 1e9:8.1f} GFLOP/s"
            if "linear_s" in entry
            else ""
        )
        lines.append(
            f"    {tokens:>6} tokens        {ms(entry['forward_s']):>12}"
            f"  {(entry['flops_per_s'] or 0) / 1e9:8.1f} GFLOP/s  {alone}"
        )
    lines.append(
        f"  fit error (in sample)    median {p['fit_median_abs_error']:.1%}, p90 {p['fit_p90_abs_error']:.1%},"
        f" max {p['fit_max_abs_error']:.1%} over {p['num_fit_points']} of {p['num_step_points']} step points"
        + (f" ({p['num_busy_points']} measured while busy)" if p["num_busy_points"] else "")
    )
    zeros = [
        name
        for name, value in (
            ("per decode row", p["per_decode_s"]),
            ("per chunk", p["per_chunk_s"]),
            ("per gathered context token", p["per_gather_token_s"]),
        )
        if value == 0
    ]
    zeros += [
        f"LM head rows {lo}-{hi}"
        for lo, hi, slope in zip(
            p["lm_head_knots"], p["lm_head_knots"][1:], p["lm_head_per_row_s_by_segment"], strict=False
        )
        if slope == 0
    ]
    if zeros:  # the fit's terms are >= 0: a zero is a cost the points never showed apart from the rest
        lines.append(f"  no cost beyond the other terms (0 above): {', '.join(zeros)}")
    spread = reference_spread(p)
    scaled = p.get("drift_scale_range") or [1, 1]
    if spread:
        lines.append(
            f"  machine steadiness       reference steps took {spread} over the profile"
            + (
                f"; points scaled x{scaled[0]:.2f}-{scaled[1]:.2f} to their medians"
                if scaled != [1, 1]
                else ""
            )
        )
    return "\n".join(lines)
