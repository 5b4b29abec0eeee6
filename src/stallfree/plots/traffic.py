"""Figures for ``stallfree simulate``: latency CDFs per policy, batch composition and KV usage.

- ``itl_cdf``: the share of inter-token gaps at or below each latency (weighted samples, so a
  step that decoded 30 streams counts 30 times); a stall shows as a long tail to the right.
- ``ttft_cdf``: time to first token of completed requests.
- ``batch_composition``: per policy, decode vs prompt tokens of every step in a window of
  ``WINDOW_S`` seconds from the middle of the run (a run has far more steps than pixels).
- ``kv_usage``: the fraction of KV blocks in use over time (the bin's peak), per policy.
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

if TYPE_CHECKING:
    from stallfree.sim import SimulationResult

NUM_BINS = 400
WINDOW_S = 3.0

FloatArray = npt.NDArray[np.float64]


def plot_traffic(results: Sequence[SimulationResult], out_dir: str | Path) -> list[Path]:
    """Write the four figures (PNG and SVG) for one or more policies' runs; return the paths."""
    figures = [("itl_cdf", _itl_cdf(results)), ("ttft_cdf", _ttft_cdf(results))]
    traced = [r for r in results if r.steps is not None and len(r.steps)]
    if traced:
        figures += [("batch_composition", _batch_composition(traced)), ("kv_usage", _kv_usage(traced))]
    return save_figures(figures, out_dir, dpi=130)


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
        self.cdf.legend(loc="lower right", fontsize=8)
        self.fig.tight_layout()
        return self.fig


def _itl_cdf(results: Sequence[SimulationResult]) -> Figure:
    fig = _CdfFigure(f"Inter-token latency — {_title(results)}", "gap between two tokens of a stream (ms)")
    for r in results:
        values, counts = r.itl.values_s, r.itl.counts
        keep = counts > 0
        if not keep.any():
            continue
        order = np.argsort(values[keep], kind="stable")
        x = values[keep][order] * 1e3
        y = np.cumsum(counts[keep][order]) / counts[keep].sum()
        fig.add(
            x, y, f"{r.policy} (p99 {r.summary['p99_itl_ms']:.1f} ms, max {r.summary['max_itl_ms']:.0f} ms)"
        )
    return fig.done()


def _ttft_cdf(results: Sequence[SimulationResult]) -> Figure:
    fig = _CdfFigure(f"Time to first token — {_title(results)}", "TTFT (ms)")
    for r in results:
        ttfts = np.sort(
            [
                (x.first_token_s - x.arrival_s) * 1e3
                for x in r.records
                if x.is_completed and x.first_token_s is not None
            ]
        )
        if not ttfts.size:
            continue
        y = np.arange(1, ttfts.size + 1) / ttfts.size
        fig.add(ttfts, y, f"{r.policy} (p99 {r.summary['p99_ttft_ms']:,.0f} ms)")
    return fig.done()


def _batch_composition(results: Sequence[SimulationResult]) -> Figure:
    # A whole run has far more steps than a figure has pixels: show every step of one window
    # from the middle of the run, the same window for every policy.
    end_s = min(float(r.steps.end_s[-1]) for r in results if r.steps is not None)
    window_start_s = end_s / 2
    window_end_s = min(end_s, window_start_s + WINDOW_S)
    fig, axes = plt.subplots(
        len(results), 1, figsize=(12, 2.4 * len(results) + 0.8), sharex=True, squeeze=False
    )
    for ax, r in zip(axes[:, 0], results, strict=True):
        assert r.steps is not None  # filtered by the caller
        t = r.steps
        starts = np.frombuffer(t.start_s, dtype=np.float64)
        ends = np.frombuffer(t.end_s, dtype=np.float64)
        shown = (ends > window_start_s) & (starts < window_end_s)
        x, widths = starts[shown], (ends - starts)[shown]
        decode = np.frombuffer(t.num_decode_tokens, dtype=np.int64)[shown]
        prompt = np.frombuffer(t.num_prefill_tokens, dtype=np.int64)[shown]
        ax.bar(x, decode, widths, align="edge", color=DECODE_COLOR, label="decode tokens", linewidth=0)
        ax.bar(
            x,
            prompt,
            widths,
            bottom=decode,
            align="edge",
            color=PROMPT_COLOR,
            label="prompt tokens",
            linewidth=0,
        )
        ax.set_ylabel("tokens per step")
        ax.set_title(
            f"{r.policy}: what each step carries (a bar spans the identical steps run in a row)", fontsize=10
        )
        ax.legend(loc="upper right", fontsize=8)
    axes[-1, 0].set_xlim(window_start_s, window_end_s)
    axes[-1, 0].set_xlabel("simulated time (s)")
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
        ax.plot((edges[:-1] + edges[1:]) / 2, peak * 100, label=r.policy)
    ax.set_ylim(0, 101)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("KV blocks in use (%)")
    ax.set_title(
        f"KV-cache usage, peak per bin — {results[0].kv.num_blocks:,} blocks of {results[0].kv.block_size} tokens"
    )
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
