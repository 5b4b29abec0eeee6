"""Figures for ``stallfree explain``: the two-row timeline and the chunk-size sweep.

The timeline puts both policies on one time axis. Each step is a box; its
orange part is the share of the step's tokens that are prompt tokens, blue the
decode tokens. Under each row, one line per stream with a tick per token, so
a stall is a blank stretch across every line.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import FuncFormatter

from stallfree.explain.scenario import PROMPT_ID, Explanation, PolicyRun
from stallfree.plots import DECODE_COLOR, PROMPT_COLOR, save_figures

TICK_COLOR = "#333333"


def _plain_number(value: float, _pos: object = None) -> str:
    return "" if value <= 0 else f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _plain_minor(value: float, _pos: object = None) -> str:
    """Label only the 2s and 5s between powers of ten, so the minor ticks do not crowd."""
    mantissa = value / 10 ** math.floor(math.log10(value)) if value > 0 else 0.0
    return (
        _plain_number(value) if round(mantissa) in (2, 5) and abs(mantissa - round(mantissa)) < 1e-6 else ""
    )


_PLAIN, _PLAIN_MINOR = FuncFormatter(_plain_number), FuncFormatter(_plain_minor)


def plot_explanation(result: Explanation, out_dir: str | Path) -> list[Path]:
    """Write ``timeline`` and ``sweep`` figures as PNG and SVG; return the paths."""
    return save_figures((("timeline", _timeline(result)), ("sweep", _sweep(result))), out_dir)


def _timeline(result: Explanation) -> Figure:
    runs = [result.runs["prefill-first"], result.runs["chunked"]]
    end_s = max(r.steps[-1].end_s for r in runs)
    fig, axes = plt.subplots(2, 1, figsize=(12, 6.5), sharex=True)
    sc = result.scenario
    budget_ms = sc.get("step_budget_ms")
    for ax, run in zip(axes, runs, strict=True):
        if run.policy == "prefill-first":
            _draw_run(ax, run, "prefill-first", end_s)
        elif budget_ms:
            sizes = run.prompt_chunk_tokens()
            title = (
                f"chunked ({budget_ms:g} ms steps: chunks of {sizes[0]:,} down to "
                f"{sizes[-2] if len(sizes) > 1 else sizes[0]:,} tokens; orange height = the step's chunk)"
            )
            _draw_run(ax, run, title, end_s, chunk_heights=True)
        else:
            _draw_run(ax, run, f"chunked ({sc['chunk_tokens']}-token chunks)", end_s)
    axes[-1].set_xlabel("time since every stream was decoding (s)")
    fig.suptitle(
        f"A {sc['prompt_tokens']:,}-token prompt arrives while {sc['decoders']} streams decode — "
        f"{sc['model']} on {sc['tp']} x {sc['hardware']}",
        fontsize=12,
    )
    fig.legend(
        handles=[
            Patch(color=DECODE_COLOR, label="decode tokens in the step"),
            Patch(color=PROMPT_COLOR, label="prompt tokens in the step"),
        ],
        loc="lower center",
        ncol=2,
        frameon=False,
        bbox_to_anchor=(0.5, -0.02),
    )
    fig.tight_layout(rect=(0, 0.04, 1, 0.96))
    return fig


def _draw_run(ax: Axes, run: PolicyRun, title: str, end_s: float, *, chunk_heights: bool = False) -> None:
    """One policy's row. ``chunk_heights``: the orange part's height is the step's prompt chunk
    relative to the run's largest (so time-sized chunks are seen shrinking), not its token share."""
    streams = sorted((rid for rid in run.token_times_s if rid != PROMPT_ID), key=lambda r: int(r[1:]))
    n = len(streams)
    box_y, box_h = n + 1.0, 3.0
    largest = max((s.num_prefill_tokens for s in run.steps), default=0) or 1
    for step in run.steps:
        total = step.num_decode_tokens + step.num_prefill_tokens
        if chunk_heights:
            prompt_share = step.num_prefill_tokens / largest
        else:
            prompt_share = step.num_prefill_tokens / total if total else 0.0
        ax.add_patch(
            Rectangle(
                (step.start_s, box_y), step.duration_s, box_h * (1 - prompt_share), color=DECODE_COLOR, lw=0
            )
        )
        if prompt_share:
            ax.add_patch(
                Rectangle(
                    (step.start_s, box_y + box_h * (1 - prompt_share)),
                    step.duration_s,
                    box_h * prompt_share,
                    color=PROMPT_COLOR,
                    lw=0,
                )
            )
        ax.add_patch(Rectangle((step.start_s, box_y), step.duration_s, box_h, fill=False, ec="white", lw=0.4))
    for row, rid in enumerate(streams):
        times = run.token_times_s[rid]
        ax.hlines(row, 0, end_s, color="#dddddd", lw=0.6)
        ax.vlines(times, row - 0.35, row + 0.35, color=TICK_COLOR, lw=0.6)
    ax.axvline(run.arrival_s, color="black", ls="--", lw=1)
    ax.annotate(
        "prompt arrives",
        (run.arrival_s, box_y + box_h + 0.3),
        fontsize=8,
        ha="left",
        xytext=(3, 0),
        textcoords="offset points",
    )
    ax.axvline(run.first_token_s, color=PROMPT_COLOR, ls=":", lw=1.2)
    # Right of the line when the prompt was quick, so the two labels do not overlap.
    quick = run.ttft_s < 0.4 * end_s
    ax.annotate(
        f"prompt's first token (TTFT {run.ttft_s:.2f} s)",
        (run.first_token_s, box_y + box_h + 0.3),
        fontsize=8,
        ha="left" if quick else "right",
        xytext=(3 if quick else -3, 0),
        textcoords="offset points",
    )
    gap_start, gap = _longest_gap(run, streams)
    ax.annotate(
        "",
        xy=(gap_start + gap, -1.2),
        xytext=(gap_start, -1.2),
        arrowprops={"arrowstyle": "<->", "color": "crimson", "lw": 1.2},
    )
    label = f"longest gap {gap * 1e3:,.0f} ms"
    if gap > 0.1 * end_s:
        ax.text(gap_start + gap / 2, -2.6, label, color="crimson", ha="center", fontsize=9)
    elif gap_start + gap > 0.7 * end_s:  # near the right edge: write it leftwards, inside the axes
        ax.text(gap_start, -1.6, label + "  ", color="crimson", ha="right", fontsize=9)
    else:
        ax.text(gap_start + gap, -1.6, "  " + label, color="crimson", ha="left", fontsize=9)
    ax.set_xlim(0, end_s)
    ax.set_ylim(-3.4, box_y + box_h + 1.5)
    ax.set_yticks([box_y + box_h / 2, (n - 1) / 2])
    ax.set_yticklabels(["steps", f"{n} streams\n(a tick per token)"])
    ax.set_title(title, loc="left", fontsize=11)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _longest_gap(run: PolicyRun, streams: list[str]) -> tuple[float, float]:
    best = (0.0, 0.0)
    for rid in streams:
        times = run.token_times_s[rid]
        for a, b in itertools.pairwise(times):
            if b - a > best[1]:
                best = (a, b - a)
    return best


def _sweep(result: Explanation) -> Figure:
    chunks = [p.chunk_tokens for p in result.sweep]
    fig, (gap_ax, ttft_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    gap_ax.plot(chunks, [p.max_gap_s * 1e3 for p in result.sweep], "o-", color=DECODE_COLOR)
    gap_ax.axhline(result.decode_step_s * 1e3, color="grey", ls=":", lw=1)
    gap_ax.annotate("decode step", (chunks[0], result.decode_step_s * 1e3), fontsize=8, va="bottom")
    gap_ax.set_ylabel("other streams' longest gap (ms)")
    gap_ax.set_title("the stall grows once chunks pass the ridge", loc="left", fontsize=11)
    gap_ax.set_yscale("log")
    ttft_ax.plot(chunks, [p.ttft_vs_alone for p in result.sweep], "o-", color=PROMPT_COLOR)
    ttft_ax.axhline(1.0, color="grey", ls=":", lw=1)
    ttft_ax.set_ylabel("prompt TTFT / prefill alone")
    ttft_ax.set_title("below the ridge the prompt crawls", loc="left", fontsize=11)
    ttft_ax.set_yscale("log")
    for ax in (gap_ax, ttft_ax):
        # Plain numbers on the log axes: a range under a decade otherwise reads "2x10^2, 6x10^1".
        ax.yaxis.set_major_formatter(_PLAIN)
        ax.yaxis.set_minor_formatter(_PLAIN_MINOR)
        ax.set_xscale("log", base=2)
        ax.set_xticks(chunks)
        ax.set_xticklabels([f"{c:,}" for c in chunks], rotation=45)
        ax.set_xlabel("prompt tokens per step (chunk)")
        ax.axvline(result.ridge_tokens, color="black", ls="--", lw=1)
        ax.annotate(
            f"ridge ≈ {result.ridge_tokens:,.0f}",
            (result.ridge_tokens, 0.95),
            xycoords=("data", "axes fraction"),
            fontsize=8,
            xytext=(4, 0),
            textcoords="offset points",
        )
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig
