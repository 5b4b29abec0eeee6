"""What the simulate and tune figures say, read from the figure objects (not pixels)."""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import pytest
from matplotlib.container import BarContainer
from matplotlib.figure import Figure

from stallfree.core.serving import ServingConfig
from stallfree.plots.traffic import traffic_figures
from stallfree.plots.tune import tune_figures
from stallfree.sim import SimulationResult, simulate
from stallfree.workload import TraceLengths, Workload, poisson


@pytest.fixture(scope="module")
def runs() -> list[SimulationResult]:
    workload = Workload(poisson(2.0), TraceLengths("arxiv"))
    return [
        simulate(workload, serving=ServingConfig(policy=p), num_requests=120, keep_steps=True)
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


def _close(figures: list[tuple[str, Figure]]) -> None:
    for _name, figure in figures:
        plt.close(figure)
