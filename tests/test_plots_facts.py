"""What the simulate, tune and explain figures say, read from the figure objects (not pixels)."""

from __future__ import annotations

import bisect
import itertools
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.container import BarContainer
from matplotlib.figure import Figure

from stallfree.cli import build_parser
from stallfree.cli.explain import explanation
from stallfree.core.serving import ServingConfig
from stallfree.costs.choice import CostChoice
from stallfree.explain import PROMPT_ID, Explanation
from stallfree.explain.plots import timeline_figure
from stallfree.plots.traffic import traffic_figures
from stallfree.plots.tune import tune_figures
from stallfree.sim import Deployment, SimulationResult, simulate
from stallfree.sim.day_report import day_windows
from stallfree.sim.deployment import Autoscale
from stallfree.workload import TraceLengths, Workload, poisson
from stallfree.workload.arrivals import RateProfile


@pytest.fixture(scope="module")
def runs() -> list[SimulationResult]:
    workload = Workload(poisson(2.0), TraceLengths("arxiv"))
    return [
        simulate(
            workload,
            Deployment(costs=CostChoice(kind="full"), serving=ServingConfig(policy=p)),
            num_requests=120,
            keep_steps=True,
        )
        for p in ("prefill-first", "chunked")
    ]


def _bars(ax: Any) -> dict[str, list[float]]:
    return {
        str(c.get_label()): [bar.get_height() for bar in c]
        for c in ax.containers
        if isinstance(c, BarContainer)
    }


def test_batch_composition_shows_decodes_on_their_own_axes(runs: list[SimulationResult]) -> None:
    figure = dict(traffic_figures(runs))["batch_composition"]
    axes = figure.axes
    assert len(axes) == 4  # per policy: prompt tokens above, decode tokens below
    assert [ax.get_ylabel().split()[0] for ax in axes] == ["prompt", "decode"] * 2
    title = figure.get_suptitle()
    assert "3-s window" in title and "from the middle of" in title
    by_policy = {r.policy: (axes[2 * i], axes[2 * i + 1]) for i, r in enumerate(runs)}
    for prompt_ax, decode_ax in by_policy.values():
        assert any(h > 0 for h in _bars(prompt_ax)["prompt tokens"])
        decode = _bars(decode_ax)
        assert any(h > 0 for heights in decode.values() for h in heights)  # the decode series is drawn
        assert decode_ax.get_ylim()[1] < 200  # on its own scale, not the prompt's thousands
    riding = "decode tokens riding with prompt tokens"
    assert any(h > 0 for h in _bars(by_policy["chunked"][1])[riding])  # decodes ride with chunks
    assert not any(h > 0 for h in _bars(by_policy["prefill-first"][1])[riding])  # a whole prompt runs alone
    figure.canvas.draw()
    for ax in axes:  # the legend sits right of the bars, not on them
        legend = ax.get_legend()
        assert legend is not None
        assert legend.get_window_extent().x0 >= ax.get_window_extent().x1
    _close(traffic_figures(runs))


def test_kv_usage_labels_each_policy_with_its_own_block_count(runs: list[SimulationResult]) -> None:
    figures = traffic_figures(runs)
    ax = dict(figures)["kv_usage"].axes[0]
    legend = ax.get_legend()
    assert legend is not None
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels == [f"{r.policy}: {r.kv.num_blocks:,} blocks of {r.kv.block_size} tokens" for r in runs]
    assert runs[0].kv.num_blocks != runs[1].kv.num_blocks  # different activations, different caches
    assert "blocks" not in ax.get_title().split("(")[0]  # no one count in the title
    _close(figures)


def test_the_autoscale_figure_draws_the_runs_replicas_decisions_load_and_slo_misses(
    runs: list[SimulationResult],
) -> None:
    scale = Autoscale("keda:waiting=4", 1, 4, startup_s=20, scale_down_window_s=30)
    result = simulate(
        Workload(RateProfile.parse("diurnal:24,3,0.05"), TraceLengths("arxiv")),
        Deployment(costs=CostChoice(kind="full"), autoscale=scale),
        num_requests=2500,
    )
    a = result.summary["autoscale"]
    a["window_s"], a["windows"] = 20.0, day_windows(result.records, a, 20.0, {"ttft": 2000})  # as simulate's
    figures = traffic_figures([result])
    assert [name for name, _ in figures] == ["itl_cdf", "ttft_cdf", "autoscale"]
    ax, rate = dict(figures)["autoscale"].axes
    assert ax.get_xlabel() == "simulated time (min)"
    lines = {line.get_gid(): line for line in ax.lines}
    for gid, size in (("ready", lambda s, r, d: r), ("on-gpus", lambda s, r, d: s + r + d)):
        x, y = lines[gid].get_xdata(), lines[gid].get_ydata()
        assert (x[0], y[0]) == (0.0, 1)  # the day starts at the floor, ready
        for time_s, *counts in a["sizes"]:  # after every scrape, the size recorded
            assert y[bisect.bisect_right(list(x), time_s / 60) - 1] == size(*counts)
    marks = {c.get_gid(): c.get_offsets().tolist() for c in ax.collections}
    events = [(e["time_s"] / 60, e["desired"], e["desired"] > e["current"]) for e in a["events"]]
    assert marks["scale-up"] == [[t, n] for t, n, up in events if up]
    assert marks["scale-down"] == [[t, n] for t, n, up in events if not up] and marks["scale-down"]
    shaded = [p for p in ax.patches if p.get_gid() == "slo-miss"]
    missed = [w for w in a["windows"] if w["slo_attainment"] is not None and w["slo_attainment"] < 1]
    assert len(shaded) == len(missed) > 0
    for patch, window in zip(shaded, missed, strict=True):
        xs = patch.get_patch_transform().transform(patch.get_path().vertices)[:, 0]
        assert (xs.min(), xs.max()) == pytest.approx((window["start_s"] / 60, (window["start_s"] + 20) / 60))
    (load,) = [p for p in rate.patches if p.get_gid() == "arrival-rate"]
    assert list(load.get_data().values) == [w["arrivals"] / 20 for w in a["windows"]]
    assert np.diff(load.get_data().edges) == pytest.approx(20 / 60)
    assert f"missed the SLOs (share met above; {len(missed)} of {len(a['windows'])})" in ax.get_title()
    _close(figures)
    fixed = traffic_figures(runs)  # a fixed fleet has no day to draw
    assert "autoscale" not in dict(fixed)
    _close(fixed)


def _tune_out() -> dict[str, Any]:
    def trial(budget: int, qps: float, tbt_ms: float, violations: list[str]) -> dict[str, Any]:
        return {
            "policy": "chunked",
            "token_budget": budget,
            "qps": qps,
            "passed": not violations,
            "violations": violations,
            "metrics": {"p99_itl_ms": tbt_ms},
        }

    trials = [trial(256, q, 15.0, [] if q < 6 else ["sched_delay_p50_s"]) for q in (1, 2, 4, 8, 12)]
    trials += [trial(512, q, 28.0, [] if q < 10 else ["sched_delay_p50_s"]) for q in (1, 4, 8, 10, 14)]
    trials += [trial(2048, q, 40 + 20 * q, [] if q < 1.5 else ["tbt_p99_ms"]) for q in (1, 1.3, 2, 3)]
    return {
        "model": "m",
        "tp": 1,
        "hardware": "h",
        "workload": {"lengths": "sharegpt"},
        "slos": {"tbt_p99_ms": 77.0, "sched_delay_p50_s": 2.0},
        "policies": {
            "chunked": {
                "best_budget": 512,
                "capacity_qps": 9.0,
                "curve": [
                    {"token_budget": b, "capacity_qps": c} for b, c in ((256, 5.0), (512, 9.0), (2048, 1.4))
                ],
            }
        },
        "trials": trials,
    }


def test_tbt_vs_qps_labels_every_budget_and_says_what_hollow_means() -> None:
    figures = tune_figures(_tune_out())
    fig = dict(figures)["tbt_vs_qps"]
    ax = fig.axes[0]
    assert "hollow" in fig.get_suptitle() and "TBT SLO" in fig.get_suptitle()
    legend = ax.get_legend()
    assert legend is not None
    labels = [t.get_text() for t in legend.get_texts()]
    assert {"budget 256", "budget 512 (best)", "budget 2,048"} <= set(labels)
    assert "trials that met TBT, missed P50 scheduling delay <= 2 s" in labels
    assert "trials that missed the P99 TBT SLO" in labels
    assert sorted(t.get_text() for t in ax.texts) == ["2,048", "256", "512"]  # at each line's end
    fig.canvas.draw()
    low, high = ax.get_xlim()
    ticks = [t for t in ax.get_xticks() if low <= t <= high]
    assert len(ticks) >= 6  # 1, 1.5, 2, 3, 4, 5, 7, 10 ... between 1 and 14 QPS
    assert all(
        label.get_text() and "^" not in label.get_text() for label in ax.get_xticklabels() if label.get_text()
    )
    _close(figures)


def _explained(*args: str) -> Explanation:
    return explanation(build_parser().parse_args(["explain", "--sweep", "256", *args]))


def _with_gid(ax: Any, gid: str) -> list[Any]:
    return [a for a in (*ax.patches, *ax.lines, *ax.texts) if a.get_gid() == gid]


def _spans(patches: list[Any]) -> dict[tuple[float, float], Any]:
    return {(round(p.get_x(), 9), round(p.get_width(), 9)): p for p in patches}


def test_explain_timeline_draws_what_it_claims() -> None:
    result = _explained()
    fig = timeline_figure(result)
    assert fig.axes[-1].get_xlabel() == "time since the prompt arrived (s)"
    for ax, name in zip(fig.axes, ("prefill-first", "chunked"), strict=False):
        run = result.runs[name]
        # x = 0 is the arrival, so the TTFT is read off the axis where its label says
        (ttft_line,) = _with_gid(ax, "ttft")
        assert list(ttft_line.get_xdata()) == pytest.approx([run.ttft_s] * 2)
        (span,) = _with_gid(ax, "ttft-span")
        assert (span.xyann[0], span.xy[0]) == pytest.approx((0.0, run.ttft_s))
        label = f"TTFT {run.ttft_s:.2f} s"
        (text,) = [t for t in ax.texts if label in t.get_text()]
        assert 0.0 <= text.get_position()[0] <= run.ttft_s
        # the gap marker spans exactly the longest gap, between two of one stream's tokens
        (bracket,) = _with_gid(ax, "longest-gap")
        x0, x1 = min(bracket.get_xdata()), max(bracket.get_xdata())
        assert x1 - x0 == pytest.approx(run.max_gap_s, rel=1e-9)
        assert any(
            (a, b) == pytest.approx((x0 + run.arrival_s, x1 + run.arrival_s))
            for rid, times in run.token_times_s.items()
            if rid != PROMPT_ID
            for a, b in itertools.pairwise(times)
        )
        (shade,) = _with_gid(ax, "longest-gap-shade")
        assert (shade.get_x(), shade.get_width()) == pytest.approx((x0, run.max_gap_s))
        gap_label = "longest gap 30.8 ms" if name == "chunked" else "longest gap 1.88 s"
        assert any(t.get_text() == gap_label for t in ax.texts)  # the table's figure
        # every step that carries the prompt has its orange part; decodes their blue part, below it
        decode, prompt = _spans(_with_gid(ax, "decode-lane")), _spans(_with_gid(ax, "prompt-lane"))
        chunk_steps = run.prompt_chunk_steps()
        assert len(prompt) == len(chunk_steps)
        for step in chunk_steps:
            key = (round(step.start_s - run.arrival_s, 9), round(step.duration_s, 9))
            assert prompt[key].get_height() > 0
            if step.num_decode_tokens:
                assert decode[key].get_height() > 0
                assert prompt[key].get_y() >= decode[key].get_y() + decode[key].get_height()
            else:
                assert key not in decode  # the stall: no stream decodes in this step
    chunked = result.runs["chunked"].prompt_chunk_steps()
    assert len(chunked) == 64 and all(s.num_decode_tokens == 16 for s in chunked)  # both parts, each step
    assert len(result.runs["prefill-first"].prompt_chunk_steps()) == 1
    plt.close(fig)


def test_explain_timeline_shows_time_sized_chunks_shrinking() -> None:
    result = _explained("--cost-model", "full", "--step-budget-ms", "60")
    fig = timeline_figure(result)
    heights = [p.get_height() for p in _with_gid(fig.axes[1], "prompt-lane")]
    sizes = result.runs["chunked"].prompt_chunk_tokens()
    assert sizes[0] > sizes[-2]
    assert heights == pytest.approx([max(heights) * n / max(sizes) for n in sizes])
    assert f"{sizes[0]:,} down to {sizes[-2]:,}" in fig.axes[1].get_title(loc="left")
    plt.close(fig)


def _close(figures: list[tuple[str, Figure]]) -> None:
    for _name, figure in figures:
        plt.close(figure)
