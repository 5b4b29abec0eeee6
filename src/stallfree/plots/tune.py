"""Figures for ``stallfree tune``, drawn from its JSON object (so saved results replot).

- ``capacity``: capacity (QPS) against token budget, one line per policy, best budget marked;
- ``tbt_vs_qps``: P99 TBT against QPS of every trial, one panel per policy, each budget's
  trials joined by a faint line (the best budget's bold), the SLO dashed; failed trials hollow.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

from stallfree.plots import save_figures

POLICY_COLORS = {"chunked": "#4C78A8", "prefill-first": "#F58518", "decode-first": "#54A24B"}
OTHER_COLOR = "#B279A2"


def plot_tune(out: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """Write ``capacity`` and ``tbt_vs_qps`` as PNG and SVG; return the paths."""
    return save_figures((("capacity", _capacity(out)), ("tbt_vs_qps", _tbt_vs_qps(out))), out_dir)


def _title(out: dict[str, Any]) -> str:
    return f"{out['model']} on {out['tp']} x {out['hardware']}, {out['workload']['lengths']} lengths"


def _capacity(out: dict[str, Any]) -> Figure:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for policy, entry in out["policies"].items():
        color = POLICY_COLORS.get(policy, OTHER_COLOR)
        budgets = [p["token_budget"] for p in entry["curve"]]
        capacity = [p["capacity_qps"] for p in entry["curve"]]
        ax.plot(budgets, capacity, marker="o", color=color, label=policy)
        if entry["best_budget"] is not None:
            ax.scatter(
                [entry["best_budget"]], [entry["capacity_qps"]], s=160, facecolors="none", edgecolors=color
            )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("token budget (--max-num-batched-tokens)")
    ax.set_ylabel("capacity (QPS meeting every SLO)")
    slos = ", ".join(f"{name} {limit:g}" for name, limit in out["slos"].items())
    ax.set_title(f"Capacity vs token budget — {_title(out)}\nSLOs: {slos}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    return fig


def _tbt_vs_qps(out: dict[str, Any]) -> Figure:
    policies = list(out["policies"])
    fig, axes = plt.subplots(1, len(policies), figsize=(6 * len(policies), 4.5), squeeze=False, sharey=True)
    slo_ms = out["slos"].get("tbt_p99_ms")
    for ax, policy in zip(axes[0], policies, strict=True):
        color = POLICY_COLORS.get(policy, OTHER_COLOR)
        best = out["policies"][policy]["best_budget"]
        trials = [t for t in out["trials"] if t["policy"] == policy]
        for passed, face in ((True, color), (False, "none")):
            chosen = [t for t in trials if bool(t["passed"]) == passed]
            ax.scatter(
                [t["qps"] for t in chosen],
                [t["metrics"]["p99_itl_ms"] for t in chosen],
                facecolors=face,
                edgecolors=color,
                alpha=0.6,
                label="trials meeting every SLO" if passed else "trials missing an SLO",
            )
        for budget in sorted({t["token_budget"] for t in trials}):
            line = sorted(
                (t["qps"], t["metrics"]["p99_itl_ms"]) for t in trials if t["token_budget"] == budget
            )
            is_best = budget == best
            ax.plot(
                *zip(*line, strict=True),
                color=color,
                alpha=1.0 if is_best else 0.25,
                linewidth=2.0 if is_best else 0.8,
                label=f"best budget {best}" if is_best else None,
            )
        if slo_ms is not None:
            ax.axhline(slo_ms, color="#D62728", linestyle="--", label=f"SLO {slo_ms:g} ms")
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            axis.set_major_formatter(ScalarFormatter())
            axis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("QPS")
        ax.set_title(policy)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("P99 TBT (ms)")
    fig.suptitle(f"P99 TBT vs QPS — {_title(out)}", fontsize=11)
    return fig
