"""Figures for ``stallfree explain``: the two-row timeline and the chunk-size sweep.

The timeline puts both policies on one time axis whose zero is the prompt's arrival, so
the TTFT is read off the axis. Each step is a box in two lanes: the lower (blue) holds
its decode tokens (full: one for every stream), the upper (orange) its prompt tokens
(full: the row's largest step), so a chunked step shows both parts and a stall shows as
an empty decode lane. Under each row, one line per stream with a tick per token, so a
stall is a blank stretch across every line; the longest gap is shaded and bracketed.
Artists that carry a fact have a gid (``decode-lane``, ``prompt-lane``, ``longest-gap``,
``longest-gap-shade``, ``ttft``, ``ttft-span``) so tests read the figure, not its pixels.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import FuncFormatter

from stallfree.explain.scenario import PROMPT_ID, Explanation, PolicyRun
from stallfree.plots import DECODE_COLOR, PROMPT_COLOR, save_figures

TICK_COLOR = "#333333"
GAP_COLOR = "crimson"
LANE_H = 1.8  # each of a step box's two lanes, in stream rows
EMPTY_LANE = "#eeeeee"


def _plain_number(value: float, _pos: object = None) -> str:
    return "" if value <= 0 else f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _plain_minor(value: float, _pos: object = None) -> str:
    """Label only the 2s and 5s between powers of ten, so the minor ticks do not crowd."""
    mantissa = value / 10 ** math.floor(math.log10(value)) if value > 0 else 0.0
    return (
        _plain_number(value) if round(mantissa) in (2, 5) and abs(mantissa - round(mantissa)) < 1e-6 else ""
    )


_PLAIN, _PLAIN_MINOR = FuncFormatter(_plain_number), FuncFormatter(_plain_minor)


def _duration(seconds: float) -> str:
    """As ``stallfree explain`` prints it, so the figure and the table read alike."""
    return f"{seconds * 1e3:,.1f} ms" if seconds < 1 else f"{seconds:,.2f} s"


def plot_explanation(result: Explanation, out_dir: str | Path) -> list[Path]:
    """Write ``timeline`` and ``sweep`` figures (and ``drafts`` with speculation) as PNG and SVG;
    return the paths."""
    figures = [("timeline", timeline_figure(result)), ("sweep", _sweep(result))]
    if result.speculation is not None:
        figures.append(("drafts", _drafts(result)))
    return save_figures(figures, out_dir)


def timeline_figure(result: Explanation) -> Figure:
    """Both policies' steps and stream ticks on one axis, in seconds since the prompt arrived."""
    runs = [result.runs["prefill-first"], result.runs["chunked"]]
    # Each row is shifted by its own arrival: a measured run's lead steps differ a little.
    x_range = (min(-r.arrival_s for r in runs), max(r.steps[-1].end_s - r.arrival_s for r in runs))
    fig, axes = plt.subplots(2, 1, figsize=(12, 7), sharex=True)
    sc = result.scenario
    for ax, run in zip(axes, runs, strict=True):
        _draw_run(ax, run, _row_title(run, sc), x_range)
    axes[-1].set_xlabel("time since the prompt arrived (s)")
    fig.suptitle(
        f"A {sc['prompt_tokens']:,}-token prompt arrives while {sc['streams']} streams decode — "
        f"{sc['model']} on {sc['tp']} x {sc['hardware']}",
        fontsize=12,
    )
    fig.legend(
        handles=[
            Patch(color=DECODE_COLOR, label="decode tokens in the step (lower lane)"),
            Patch(color=PROMPT_COLOR, label="prompt tokens in the step (upper lane)"),
            Patch(color=EMPTY_LANE, label="lane empty"),
            Patch(color=GAP_COLOR, alpha=0.3, label="the streams' longest gap"),
        ],
        loc="lower center",
        ncol=4,
        frameon=False,
        bbox_to_anchor=(0.5, -0.02),
    )
    fig.tight_layout(rect=(0, 0.04, 1, 0.96))
    return fig


def _row_title(run: PolicyRun, sc: dict[str, object]) -> str:
    chunk_steps = run.prompt_chunk_steps()
    sizes = run.prompt_chunk_tokens()
    if run.policy == "prefill-first":
        if len(sizes) == 1 and not chunk_steps[0].num_decode_tokens:
            return f"prefill-first: the {sizes[0]:,}-token prompt runs alone as one step, no stream decodes"
        return "prefill-first"
    decodes = chunk_steps[0].num_decode_tokens
    if sc.get("step_budget_ms"):
        smallest = sizes[-2] if len(sizes) > 1 else sizes[0]  # the last chunk is the remainder
        return (
            f"chunked ({sc['step_budget_ms']:g} ms steps): each step runs {decodes} decode tokens + a "
            f"chunk of {sizes[0]:,} down to {smallest:,} prompt tokens"
        )
    return (
        f"chunked ({sc['chunk_tokens']}-token chunks): each step runs {decodes} decode tokens + "
        f"a prompt chunk of {sizes[0]:,} tokens"
    )


def _draw_run(ax: Axes, run: PolicyRun, title: str, x_range: tuple[float, float]) -> None:
    """One policy's row, with x = time since this run's prompt arrived."""
    streams = sorted((rid for rid in run.token_times_s if rid != PROMPT_ID), key=lambda r: int(r[1:]))
    n = len(streams)
    t0 = run.arrival_s
    box_y = n + 1.0
    prompt_y = box_y + LANE_H
    top = box_y + 2 * LANE_H
    largest = max((s.num_prefill_tokens for s in run.steps), default=0) or 1
    for step in run.steps:
        x = step.start_s - t0
        ax.add_patch(Rectangle((x, box_y), step.duration_s, 2 * LANE_H, color=EMPTY_LANE, lw=0))
        if step.num_decode_tokens:
            height = LANE_H * min(step.num_decode_tokens / n, 1.0)
            ax.add_patch(
                Rectangle((x, box_y), step.duration_s, height, color=DECODE_COLOR, lw=0, gid="decode-lane")
            )
        if step.num_prefill_tokens:
            height = LANE_H * step.num_prefill_tokens / largest
            ax.add_patch(
                Rectangle((x, prompt_y), step.duration_s, height, color=PROMPT_COLOR, lw=0, gid="prompt-lane")
            )
        ax.add_patch(Rectangle((x, box_y), step.duration_s, 2 * LANE_H, fill=False, ec="white", lw=0.4))
    for row, rid in enumerate(streams):
        ax.hlines(row, *x_range, color="#dddddd", lw=0.6)
        ax.vlines([t - t0 for t in run.token_times_s[rid]], row - 0.35, row + 0.35, color=TICK_COLOR, lw=0.6)
    _draw_ttft(ax, run, top, x_range)
    _draw_gap(ax, run, streams, x_range)
    ax.set_xlim(*x_range)
    ax.set_ylim(-3.4, top + 2.0)
    ax.set_yticks([box_y + LANE_H / 2, prompt_y + LANE_H / 2, (n - 1) / 2])
    ax.set_yticklabels(
        [f"decode tokens ({n})", f"prompt tokens (≤ {largest:,})", f"{n} streams\n(a tick per token)"]
    )
    ax.set_title(title, loc="left", fontsize=11)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _draw_ttft(ax: Axes, run: PolicyRun, top: float, x_range: tuple[float, float]) -> None:
    """The arrival at x = 0 and a span from it to the prompt's first token, labelled with the TTFT."""
    ax.axvline(0.0, color="black", ls="--", lw=1)
    ax.axvline(run.ttft_s, color=PROMPT_COLOR, ls=":", lw=1.2, gid="ttft")
    y = top + 0.6
    ax.annotate(
        "",
        xy=(run.ttft_s, y),
        xytext=(0.0, y),
        arrowprops={"arrowstyle": "<->", "color": PROMPT_COLOR, "lw": 1.2, "shrinkA": 0, "shrinkB": 0},
    ).set_gid("ttft-span")
    label = f"prompt arrives (0) to its first token: TTFT {_duration(run.ttft_s)}"
    span = x_range[1] - x_range[0]
    # Centred on the span when it has room; else beside its end, inside the axes.
    if run.ttft_s > 0.45 * span:
        ax.text(run.ttft_s / 2, y + 0.35, label, fontsize=8, ha="center", va="bottom")
    else:
        ax.text(run.ttft_s, y + 0.35, "  " + label, fontsize=8, ha="left", va="bottom")


def _draw_gap(ax: Axes, run: PolicyRun, streams: list[str], x_range: tuple[float, float]) -> None:
    """Shade the longest gap across every stream and bracket it underneath, with its length."""
    gap_start, gap = _longest_gap(run, streams)
    x0, x1 = gap_start - run.arrival_s, gap_start - run.arrival_s + gap
    n = len(streams)
    ax.add_patch(
        Rectangle((x0, -0.6), gap, n + 0.2, color=GAP_COLOR, alpha=0.3, lw=0, gid="longest-gap-shade")
    )
    ax.plot([x0, x0, x1, x1], [-0.6, -1.1, -1.1, -0.6], color=GAP_COLOR, lw=2.5, gid="longest-gap")
    label = f"longest gap {_duration(gap)}"
    style: dict[str, Any] = {"color": GAP_COLOR, "fontsize": 10, "fontweight": "bold"}
    span = x_range[1] - x_range[0]
    if gap > 0.25 * span:
        ax.text((x0 + x1) / 2, -1.4, label, ha="center", va="top", **style)
        return
    # A narrow gap: the label stands off to the side, an arrow pointing at the bracket.
    right = x1 + 0.08 * span < x_range[1] - 0.2 * span
    ax.annotate(
        label,
        xy=(x1 if right else x0, -1.1),
        xytext=(x1 + 0.04 * span if right else x0 - 0.04 * span, -2.5),
        ha="left" if right else "right",
        va="center",
        arrowprops={"arrowstyle": "->", "color": GAP_COLOR, "lw": 1.5},
        **style,
    )


def _longest_gap(run: PolicyRun, streams: list[str]) -> tuple[float, float]:
    """(start, length) of the longest gap between two tokens of one stream."""
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


def _drafts(result: Explanation) -> Figure:
    """The budget moving from the prompt's chunk to the streams' drafts: each stream's tokens/s
    and the prompt's TTFT against the drafts a stream, the prompt's share of a step beside."""
    spec = result.speculation
    assert spec is not None
    drafts = [p.num_speculative_tokens for p in spec.sweep]
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    ax.plot(drafts, [p.stream_tokens_per_s for p in spec.sweep], "o-", color=DECODE_COLOR, gid="stream-speed")
    ax.set_ylabel("tokens/s a stream", color=DECODE_COLOR)
    ax.set_xlabel("draft tokens a stream verifies each step (prompt tokens a step below)")
    ax.set_xticks(drafts)
    ax.set_xticklabels(
        [f"{d}\n({p.prompt_tokens_per_step:,.0f})" for d, p in zip(drafts, spec.sweep, strict=True)]
    )
    ttft_ax = ax.twinx()
    ttft_ax.plot(drafts, [p.ttft_s for p in spec.sweep], "s--", color=PROMPT_COLOR, gid="prompt-ttft")
    ttft_ax.set_ylabel("prompt TTFT (s)", color=PROMPT_COLOR)
    rates = ", ".join(f"{r:.0%}" for r in spec.acceptance.rates[: spec.num_speculative_tokens])
    side = "below" if spec.token_budget <= result.ridge_tokens * 1.1 else "past"
    ax.set_title(
        f"{spec.token_budget}-token steps ({side} the ridge ≈ {result.ridge_tokens:,.0f}): drafts spend "
        f"the prompt's share\n(accepted by position {rates})",
        loc="left",
        fontsize=10,
    )
    ax.spines["top"].set_visible(False)
    ttft_ax.spines["top"].set_visible(False)
    fig.tight_layout()
    return fig
