"""Figures for ``stallfree simulate``: latency CDFs per policy, batch composition and KV usage.

- ``itl_cdf``: the share of inter-token gaps at or below each latency (weighted samples, so a
  step that decoded 30 streams counts 30 times); a stall shows as a long tail to the right.
- ``ttft_cdf``: time to first token of completed requests.
- ``batch_composition``: per policy, two panels over every step in a window of ``WINDOW_S``
  seconds from the middle of the run (a run has far more steps than pixels): prompt tokens per
  step, and beneath on its own scale decode tokens per step (a few beside thousands of prompt
  tokens), dark where the step also carried prompt tokens (decodes riding with a chunk).
- ``kv_usage``: the fraction of KV blocks in use over time (the bin's peak), per policy, each
  labelled with its own block count.
- ``autoscale``: an autoscaled run's replicas and load over the day (:mod:`stallfree.plots.day`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib.pyplot as plt
import numpy as np
import numpy.typing as npt
from matplotlib.figure import Figure

from stallfree.plots import DECODE_COLOR, PROMPT_COLOR, save_figures
from stallfree.plots.day import day_figure

if TYPE_CHECKING:
    from stallfree.sim import SimulationResult

NUM_BINS = 400
WINDOW_S = 3.0

FloatArray = npt.NDArray[np.float64]


def plot_traffic(results: Sequence[SimulationResult], out_dir: str | Path) -> list[Path]:
    """Write the figures (PNG and SVG) for one or more policies' runs; return the paths."""
    return save_figures(traffic_figures(results), out_dir, dpi=130)


def traffic_figures(results: Sequence[SimulationResult]) -> list[tuple[str, Figure]]:
    """``(name, figure)`` of each figure; the step figures need runs with ``keep_steps``, the
    autoscale figure autoscaled runs whose day's windows were added (``autoscale.windows``)."""
    figures = [("itl_cdf", _itl_cdf(results)), ("ttft_cdf", _ttft_cdf(results))]
    traced = [r for r in results if r.steps is not None and len(r.steps)]
    if traced:
        figures += [("batch_composition", _batch_composition(traced)), ("kv_usage", _kv_usage(traced))]
    days = [r for r in results if "windows" in r.summary.get("autoscale", {})]
    if days:
        figures.append(("autoscale", day_figure(days)))
    return figures


def _title(results: Sequence[SimulationResult]) -> str:
    s = results[0].summary
    return f"{s['completed']:,} requests, {s['duration']:,.0f} s simulated"


class _CdfFigure:
    """A CDF (left) and its tail, the fraction above, on a log scale (right), where stalls show."""

    def __init__(self, title: str, xlabel: str) -> None:
        self.fig, (self.cdf, self.tail) = plt.subplots(1, 2, figsize=(12, 4.5))
        for ax in (self.cdf, self.tail):
            ax.set_xscale("log")
            ax.set_xlabel(xlabel)
            ax.grid(True, which="both", alpha=0.3)
        self.cdf.set_ylabel("fraction at or below")
        self.cdf.set_ylim(0, 1.01)
        self.tail.set_ylabel("fraction above (tail)")
        self.tail.set_yscale("log")
        self.fig.suptitle(title)

    def add(self, x: FloatArray, y: FloatArray, label: str) -> None:
        x, y = _thin(x, y)
        self.cdf.step(x, y, where="post", label=label)
        above = 1 - y
        keep = above > 0
        self.tail.step(x[keep], above[keep], where="post", label=label)

    def done(self) -> Figure:
        if self.cdf.get_legend_handles_labels()[0]:
            self.cdf.legend(loc="lower right", fontsize=8)
        else:  # every request was rejected
            self.cdf.text(0.5, 0.5, "no request completed", ha="center", transform=self.cdf.transAxes)
        self.fig.tight_layout()
        return self.fig


def _itl_cdf(results: Sequence[SimulationResult]) -> Figure:
    fig = _CdfFigure(f"Inter-token latency — {_title(results)}", "gap between two tokens of a stream (ms)")
    for r in results:
        # One line per traffic class where the run has them, else one for the run.
        lines = [(f"{r.policy} {name}", acc, r.summary["classes"][name]) for name, acc in r.class_itl.items()]
        for label, itl, summary in lines or [(r.policy, r.itl, r.summary)]:
            values, counts = itl.values_s, itl.counts
            keep = counts > 0
            if not keep.any():
                continue
            order = np.argsort(values[keep], kind="stable")
            x = values[keep][order] * 1e3
            y = np.cumsum(counts[keep][order]) / counts[keep].sum()
            fig.add(x, y, f"{label} (p99 {summary['p99_itl_ms']:.1f} ms, max {summary['max_itl_ms']:.0f} ms)")
    return fig.done()


def _ttft_cdf(results: Sequence[SimulationResult]) -> Figure:
    fig = _CdfFigure(f"Time to first token — {_title(results)}", "TTFT (ms)")
    for r in results:
        by_class: dict[str | None, list[float]] = {}
        for x in r.records:
            if x.is_completed and x.first_token_s is not None:
                name = r.traffic_classes.get(x.request_id)
                by_class.setdefault(name, []).append((x.first_token_s - x.arrival_s) * 1e3)
        names = [n for n in (None, *r.summary.get("classes", {})) if n in by_class]  # classes in order
        for name in names:
            values = by_class[name]
            summary = r.summary if name is None else r.summary["classes"][name]
            ttfts = np.sort(values)
            y = np.arange(1, ttfts.size + 1) / ttfts.size
            label = r.policy if name is None else f"{r.policy} {name}"
            fig.add(ttfts, y, f"{label} (p99 {summary['p99_ttft_ms']:,.0f} ms)")
    return fig.done()


RIDING_COLOR = "#1F3B5C"  # decode tokens of a step that also ran prompt tokens


def _batch_composition(results: Sequence[SimulationResult]) -> Figure:
    # A whole run has far more steps than a figure has pixels: show every step of one window
    # from the middle of the run, the same window for every policy.
    end_s = min(float(r.steps.end_s[-1]) for r in results if r.steps is not None)
    window_start_s = end_s / 2
    window_end_s = min(end_s, window_start_s + WINDOW_S)
    fig, axes = plt.subplots(
        2 * len(results),
        1,
        figsize=(12, 3.4 * len(results) + 1.0),
        sharex=True,
        squeeze=False,
        gridspec_kw={"height_ratios": [2, 1] * len(results)},
    )
    for i, r in enumerate(results):
        assert r.steps is not None  # filtered by the caller
        prompt_ax, decode_ax = axes[2 * i, 0], axes[2 * i + 1, 0]
        t = r.steps
        starts = np.frombuffer(t.start_s, dtype=np.float64)
        ends = np.frombuffer(t.end_s, dtype=np.float64)
        shown = (ends > window_start_s) & (starts < window_end_s)
        x, widths = starts[shown], (ends - starts)[shown]
        decode = np.frombuffer(t.num_decode_tokens, dtype=np.int64)[shown]
        prompt = np.frombuffer(t.num_prefill_tokens, dtype=np.int64)[shown]
        prompt_ax.bar(x, prompt, widths, align="edge", color=PROMPT_COLOR, label="prompt tokens", linewidth=0)
        prompt_ax.set_ylabel("prompt tokens\nper step")
        prompt_ax.set_title(
            f"{r.policy}: prompt tokens (top) and decode tokens (bottom) of each step", fontsize=10
        )
        riding = prompt > 0
        decode_ax.bar(
            x[~riding],
            decode[~riding],
            widths[~riding],
            align="edge",
            color=DECODE_COLOR,
            label="decode tokens (decode-only step)",
            linewidth=0,
        )
        decode_ax.bar(
            x[riding],
            decode[riding],
            widths[riding],
            align="edge",
            color=RIDING_COLOR,
            label="decode tokens riding with prompt tokens",
            linewidth=0,
        )
        decode_ax.set_ylabel("decode tokens\nper step")
        decode_ax.set_ylim(0, max(1, int(decode.max(initial=0))) * 1.15)
        for ax in (prompt_ax, decode_ax):
            ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
            ax.grid(True, axis="y", alpha=0.3)
    axes[-1, 0].set_xlim(window_start_s, window_end_s)
    axes[-1, 0].set_xlabel("simulated time (s)")
    fig.suptitle(
        f"Batch composition: every step from {window_start_s:,.1f} to {window_end_s:,.1f} s, a "
        f"{window_end_s - window_start_s:.0f}-s window from the middle of {end_s:,.0f} s simulated\n"
        "(a run has far more steps than pixels; a bar spans the identical steps run in a row)",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


def _kv_usage(results: Sequence[SimulationResult]) -> Figure:
    fig, ax = plt.subplots(figsize=(10, 4))
    for r in results:
        assert r.steps is not None  # filtered by the caller
        ends = np.frombuffer(r.steps.end_s, dtype=np.float64)
        used = np.frombuffer(r.steps.kv_blocks_used, dtype=np.int64) / r.kv.num_blocks
        edges = np.linspace(0.0, float(ends[-1]), NUM_BINS + 1)
        which = np.clip(np.searchsorted(edges, ends, side="left") - 1, 0, NUM_BINS - 1)
        peak = np.zeros(NUM_BINS)
        np.maximum.at(peak, which, used)
        label = f"{r.policy}: {r.kv.num_blocks:,} blocks of {r.kv.block_size} tokens"
        ax.plot((edges[:-1] + edges[1:]) / 2, peak * 100, label=label)
    ax.set_ylim(0, 101)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("KV blocks in use (%)")
    ax.set_title("KV-cache usage, peak per bin (% of each policy's own KV blocks)")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper right")
    return fig


def _thin(x: FloatArray, y: FloatArray, points: int = 2000) -> tuple[FloatArray, FloatArray]:
    """At most ~``points`` points of a CDF: evenly spread, plus every point of the top 1 % tail."""
    if x.size <= points:
        return x, y
    spread = np.linspace(0, x.size - 1, points).astype(np.int64)
    tail = np.flatnonzero(y >= 0.99)[-points:]
    keep = np.unique(np.concatenate([spread, tail, [x.size - 1]]))
    return x[keep], y[keep]
