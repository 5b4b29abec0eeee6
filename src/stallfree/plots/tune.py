"""Figures for ``stallfree tune``, drawn from its JSON object (so saved results replot).

- ``capacity``: capacity (QPS) against token budget, one line per policy, best budget marked;
- ``tbt_vs_qps``: P99 TBT against QPS of every trial, one panel per policy, each budget's
  trials joined by a line labelled with its budget (the best budget's bold), the SLO dashed;
  trials that missed an SLO are hollow: circles missed the TBT SLO, squares met it and missed
  another (the scheduling delay, say), which is why they can sit under the TBT line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from stallfree.plots import save_figures

POLICY_COLORS = {"chunked": "#4C78A8", "prefill-first": "#F58518", "decode-first": "#54A24B"}
OTHER_COLOR = "#B279A2"


def plot_tune(out: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """Write ``capacity`` and ``tbt_vs_qps`` as PNG and SVG; return the paths."""
    return save_figures(tune_figures(out), out_dir)


def tune_figures(out: dict[str, Any]) -> list[tuple[str, Figure]]:
    """``(name, figure)`` of each figure."""
    return [("capacity", _capacity(out)), ("tbt_vs_qps", _tbt_vs_qps(out))]


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


_LINESTYLES = ("-", "--", "-.", ":")


def _tbt_vs_qps(out: dict[str, Any]) -> Figure:
    policies = list(out["policies"])
    fig, axes = plt.subplots(1, len(policies), figsize=(6.5 * len(policies), 5.2), squeeze=False, sharey=True)
    slo_ms = out["slos"].get("tbt_p99_ms")
    for ax, policy in zip(axes[0], policies, strict=True):
        color = POLICY_COLORS.get(policy, OTHER_COLOR)
        best = out["policies"][policy]["best_budget"]
        trials = [t for t in out["trials"] if t["policy"] == policy]
        groups = (
            ("o", color, "met every SLO", [t for t in trials if t["passed"]]),
            ("o", "none", "missed the P99 TBT SLO", [t for t in trials if _missed_tbt(t)]),
            ("s", "none", "", [t for t in trials if not t["passed"] and not _missed_tbt(t)]),
        )
        for marker, face, label, chosen in groups:
            if not chosen:
                continue
            if marker == "s":
                missed = sorted({v for t in chosen for v in t.get("violations", ())})
                names = ", ".join(_slo_name(v, out["slos"].get(v)) for v in missed) or "another SLO"
                label = f"met TBT, missed {names}"
            ax.scatter(
                [t["qps"] for t in chosen],
                [t["metrics"]["p99_itl_ms"] for t in chosen],
                marker=marker,
                facecolors=face,
                edgecolors=color,
                alpha=0.7,
                label=f"trials that {label}",
                zorder=3,
            )
        for i, budget in enumerate(sorted({t["token_budget"] for t in trials})):
            line = sorted(
                (t["qps"], t["metrics"]["p99_itl_ms"]) for t in trials if t["token_budget"] == budget
            )
            is_best = budget == best
            name = f"budget {budget:,}" + (" (best)" if is_best else "")
            ax.plot(
                *zip(*line, strict=True),
                color=color,
                alpha=1.0 if is_best else 0.45,
                linewidth=2.2 if is_best else 1.0,
                linestyle="-" if is_best else _LINESTYLES[(i + 1) % len(_LINESTYLES)],
                label=name,
            )
            ax.annotate(  # the label at the line's right end, so no legend lookup is needed
                f"{budget:,}",
                line[-1],
                xytext=(4, 0),
                textcoords="offset points",
                fontsize=8,
                color=color,
                va="center",
                fontweight="bold" if is_best else "normal",
            )
        if slo_ms is not None:
            ax.axhline(slo_ms, color="#D62728", linestyle="--", label=f"P99 TBT SLO {slo_ms:g} ms")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.margins(x=0.1)  # room for the budget labels at the lines' right ends
        for axis, limits in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
            axis.set_major_locator(LogLocator(subs=_tick_subs(*limits), numticks=60))
            axis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:g}"))
            axis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("QPS")
        ax.set_title(policy)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)
    axes[0][0].set_ylabel("P99 TBT (ms)")
    fig.suptitle(
        f"P99 TBT vs QPS — {_title(out)}\nhollow: the trial missed an SLO (circle: the TBT SLO; square: "
        "another SLO only, so it may sit under the TBT line)",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


def _missed_tbt(trial: dict[str, Any]) -> bool:
    return not trial["passed"] and "tbt_p99_ms" in trial.get("violations", ["tbt_p99_ms"])


_METRIC_NAMES = {
    "tbt": "TBT",
    "ttft": "TTFT",
    "tpot": "TPOT",
    "e2el": "E2E latency",
    "sched_delay": "scheduling delay",
}


def _slo_name(name: str, limit: float | None) -> str:
    """``sched_delay_p50_s`` with 2 -> ``P50 scheduling delay <= 2 s``."""
    metric, _, rest = name.rpartition("_p")
    pct, _, unit = rest.partition("_")
    if not metric or not pct.isdigit():
        return name
    bound = f" <= {limit:g} {unit}" if limit is not None else ""
    return f"P{pct} {_METRIC_NAMES.get(metric, metric)}{bound}"


def _tick_subs(low: float, high: float) -> tuple[float, ...]:
    """Labelled ticks per decade: about 5-10 on the axis, whatever its span."""
    if low > 0 and high / low < 3:
        return (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0)
    return (1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 7.0)
