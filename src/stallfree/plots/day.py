"""The figure of an autoscaled day (``stallfree simulate --autoscale ... --plot``), a panel per policy.

Over the run: the replicas as steps (ready, and on GPUs: starting and draining included), each
scaling decision marked at the count it wanted, the arrival rate of each ``--window-s`` window on
a second axis, and the windows whose requests missed the ``--goodput`` SLOs shaded (the darker,
the more missed). Everything is read from the summary's ``autoscale`` part: the sizes at every
scrape (:func:`~stallfree.sim.day_report.fleet_steps`), the decisions and the day's windows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from stallfree.plots import DECODE_COLOR, PROMPT_COLOR
from stallfree.sim.day_report import fleet_steps

if TYPE_CHECKING:
    from stallfree.sim import SimulationResult

ON_GPUS_COLOR = "#1F3B5C"
MISS_COLOR = "#C62828"


def day_figure(results: Sequence[SimulationResult]) -> Figure:
    """One panel per autoscaled run whose summary holds its windows (``autoscale.windows``)."""
    end_s = max(r.summary["duration"] for r in results)
    unit_s, unit = (3600.0, "h") if end_s >= 7200 else (60.0, "min")
    fig, axes = plt.subplots(len(results), 1, figsize=(12, 4.2 * len(results)), sharex=True, squeeze=False)
    for ax, result in zip(axes[:, 0], results, strict=True):
        _panel(ax, result, unit_s)
    axes[-1, 0].set_xlim(0, end_s / unit_s)
    axes[-1, 0].set_xlabel(f"simulated time ({unit})")
    fig.tight_layout()
    return fig


def _panel(ax: Axes, result: SimulationResult, unit_s: float) -> None:
    a: dict[str, Any] = result.summary["autoscale"]
    steps = np.array(fleet_steps(a, result.summary["duration"]))
    t = steps[:, 0] / unit_s
    ax.step(
        t, steps[:, 2], where="post", color=ON_GPUS_COLOR, label="on GPUs (starting, draining)", gid="on-gpus"
    )
    ax.step(t, steps[:, 1], where="post", color=DECODE_COLOR, label="ready (routable)", gid="ready", lw=2)
    for gid, marker, up in (("scale-up", "^", True), ("scale-down", "v", False)):
        events = [e for e in a["events"] if (e["desired"] > e["current"]) == up]
        ax.scatter(
            [e["time_s"] / unit_s for e in events],
            [e["desired"] for e in events],
            marker=marker,
            color="black",
            zorder=3,
            label=f"{gid} decision ({len(events)}), at the count wanted",
            gid=gid,
        )
    top = max(int(steps[:, 2].max()), *(e["desired"] for e in a["events"]), 1) + 1
    ax.set_ylim(0, top)
    ax.set_ylabel("replicas")
    window_s, windows = a["window_s"], a["windows"]
    missed = [w for w in windows if w["slo_attainment"] is not None and w["slo_attainment"] < 1]
    for w in missed:
        lo, hi = w["start_s"] / unit_s, (w["start_s"] + window_s) / unit_s
        share = 1 - w["slo_attainment"]
        ax.axvspan(lo, hi, color=MISS_COLOR, alpha=0.08 + 0.3 * share, lw=0, gid="slo-miss")
        ax.text((lo + hi) / 2, top * 0.97, f"{w['slo_attainment']:.0%}", ha="center", va="top", fontsize=7)
    rate = ax.twinx()
    edges = np.array([w["start_s"] for w in windows] + [windows[-1]["start_s"] + window_s]) / unit_s
    rate.stairs(
        [w["arrivals"] / window_s for w in windows],
        edges,
        color=PROMPT_COLOR,
        label=f"arrivals/s ({window_s:g}-s windows)",
        gid="arrival-rate",
    )
    rate.set_ylim(0, None)
    rate.set_ylabel("arrivals per second")
    judged = any(w["slo_attainment"] is not None for w in windows)
    slo = (
        f"shaded: windows where requests missed the SLOs (share met above; {len(missed)} of {len(windows)})"
        if judged
        else "no --goodput: SLO misses not marked"
    )
    ax.set_title(
        f"{result.policy}: {a['rule']} between {a['min_replicas']} and {a['max_replicas']} replicas, "
        f"start-up {a['startup_s']:g} s, {a['gpu_hours']:,.1f} GPU-hours\n{slo}",
        fontsize=10,
    )
    handles, labels = ax.get_legend_handles_labels()
    more, more_labels = rate.get_legend_handles_labels()
    ax.legend(handles + more, labels + more_labels, loc="upper left", bbox_to_anchor=(1.07, 1.0), fontsize=8)
    ax.grid(True, alpha=0.3)
