"""An autoscaled run through the day, window by window: load, replicas, latency, SLOs, GPU-hours.

Pure functions of a :class:`~stallfree.sim.api.SimulationResult` whose deployment autoscaled
(its summary's ``autoscale`` part); the command line prints and writes what they return.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import Any

from stallfree.metrics import ItlAccumulator, RequestRecord, format_metric, summarize


def day_windows(
    records: Sequence[RequestRecord],
    autoscale: Mapping[str, Any],
    window_s: float,
    goodput: Mapping[str, float] | None = None,
) -> list[dict[str, Any]]:
    """One row per ``window_s`` of the run, by when requests arrived: their count, the fleet's size
    at the scrapes in it (mean and most), median / p99 TTFT and median TPOT of those completed,
    the share that met every SLO (``goodput``; None without), and how many arrived while a
    replica was starting (a scale-up not yet routable)."""
    if not window_s > 0:
        raise ValueError(f"a window must be positive, got {window_s} s")
    sizes = autoscale["sizes"]
    end_s = max([r.arrival_s for r in records] + [s[0] for s in sizes] + [0.0])
    count = int(end_s // window_s) + 1
    by_window: list[list[RequestRecord]] = [[] for _ in range(count)]
    for record in records:
        by_window[int(record.arrival_s // window_s)].append(record)
    starting = [(t, n) for t, n, _, _ in sizes]
    rows = []
    for w, part in enumerate(by_window):
        lo_s, hi_s = w * window_s, (w + 1) * window_s
        fleet = [n + r + d for t, n, r, d in sizes if lo_s <= t < hi_s]
        done = [r for r in part if r.is_completed]
        scores = summarize(done, ItlAccumulator(), window_s, goodput) if done else None
        rows.append(
            {
                "start_s": lo_s,
                "arrivals": len(part),
                "replicas_mean": sum(fleet) / len(fleet) if fleet else None,
                "replicas_max": max(fleet, default=None),
                "median_ttft_ms": scores["median_ttft_ms"] if scores else None,
                "p99_ttft_ms": scores["p99_ttft_ms"] if scores else None,
                "median_tpot_ms": scores["median_tpot_ms"] if scores else None,
                "slo_attainment": (scores["request_goodput"] / scores["request_throughput"])
                if scores and scores["request_goodput"] is not None and scores["request_throughput"]
                else None,
                "arrived_during_startup": sum(_starting_at(starting, r.arrival_s) for r in part),
            }
        )
    return rows


def fleet_steps(autoscale: Mapping[str, Any], end_s: float) -> list[tuple[float, int, int]]:
    """The fleet's size as a step line from 0 s to ``end_s``: ``(time_s, ready, on_gpus)`` at each
    change. It starts with the replicas on from 0 s (the first scrape is one interval in), then
    follows the size after every scrape (on GPUs: starting, ready and draining); the last point
    holds the last size to ``end_s``."""
    initial = sum(1 for life in autoscale["lifetimes"] if life["on_s"] == 0)
    points = [(0.0, initial, initial)]
    for time_s, starting, ready, draining in autoscale["sizes"]:
        if (ready, starting + ready + draining) != points[-1][1:]:
            points.append((time_s, ready, starting + ready + draining))
    return [*points, (max(end_s, points[-1][0]), points[-1][1], points[-1][2])]


def _starting_at(starting: Sequence[tuple[float, int]], time_s: float) -> bool:
    """Whether a replica was starting at ``time_s`` (as of the last scrape before it)."""
    at = bisect.bisect_right(starting, (time_s, float("inf"))) - 1
    return at >= 0 and starting[at][1] > 0


def format_day(
    summary: Mapping[str, Any], windows: Sequence[Mapping[str, Any]], gpu_hour_cost: float | None
) -> str:
    """The autoscaling lines under simulate's table."""
    a = summary["autoscale"]
    cost = (
        f" (${a['gpu_hours'] * gpu_hour_cost:,.0f} at ${gpu_hour_cost:g} a GPU-hour)" if gpu_hour_cost else ""
    )
    peak = summary["num_replicas_max"]
    hours = summary["duration"] / 3600
    fixed = peak * hours * a["gpu_hours"] / a["replica_hours"] if a["replica_hours"] else 0.0
    lines = [
        "",
        f"  autoscaled by {a['rule']} between {a['min_replicas']} and {a['max_replicas']} replicas "
        f"(start-up {a['startup_s']:g} s, scrape every {a['scrape_s']:g} s): {len(a['events']):,} decisions, "
        f"{a['num_replicas_started']:,} replicas started, at most {peak} wanted at once",
        f"  {a['gpu_hours']:,.1f} GPU-hours{cost} over {hours:,.2f} h; a fixed fleet of {peak} (the peak) "
        f"for as long: {fixed:,.1f}",
        "",
        f"  {'window':>8}{'arrivals':>10}{'on GPUs':>10}{'TTFT p50':>11}{'TTFT p99':>11}{'TPOT p50':>10}"
        f"{'SLOs met':>10}{'in start-up':>13}",
    ]
    for w in windows:
        h, m = divmod(int(w["start_s"] // 60), 60)
        met = w["slo_attainment"]
        lines.append(
            f"  {h:>5}:{m:02d}{w['arrivals']:>10,}{format_metric(w['replicas_mean'], '{:.1f}'):>10}"
            f"{format_metric(w['median_ttft_ms'], '{:,.0f}'):>11}{format_metric(w['p99_ttft_ms'], '{:,.0f}'):>11}"
            f"{format_metric(w['median_tpot_ms'], '{:,.1f}'):>10}"
            f"{format_metric(None if met is None else 100 * met, '{:.1f}%'):>10}{w['arrived_during_startup']:>13,}"
        )
    return "\n".join(lines)
