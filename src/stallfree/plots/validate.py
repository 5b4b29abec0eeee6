"""Figures for ``stallfree validate``, drawn from its :class:`~stallfree.validate.ValidationResult`:

- ``validate-itl-cdf``: the inter-token latencies' CDF, measured (solid) and predicted (dashed),
  per policy;
- ``validate-ttft-cdf``: the same for time to first token.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib.pyplot as plt
import numpy as np
import numpy.typing as npt
from matplotlib.figure import Figure

from stallfree.plots import save_figures

if TYPE_CHECKING:
    from stallfree.validate import RunScores, ValidationResult

FloatArray = npt.NDArray[np.float64]


def plot_validation(result: ValidationResult, out_dir: str | Path) -> list[Path]:
    """Write both CDFs as PNG in ``out_dir``; return the paths (ITL's first)."""
    return save_figures(validation_figures(result), out_dir, dpi=120, formats=("png",))


def validation_figures(result: ValidationResult) -> list[tuple[str, Figure]]:
    """``(name, figure)`` of each figure."""
    return [("validate-itl-cdf", _cdf(result, "itl")), ("validate-ttft-cdf", _cdf(result, "ttft"))]


def _cdf(result: ValidationResult, metric: str) -> Figure:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for policy in result.policies:
        for label, scores, style in (
            ("measured", policy.measured, "-"),
            ("predicted", policy.predicted, "--"),
        ):
            values, counts = _samples(scores, metric)
            if not len(values):
                continue
            order = np.argsort(values)
            cdf = np.cumsum(counts[order]) / counts.sum()
            ax.step(values[order] * 1000, cdf, style, where="post", label=f"{policy.policy} {label}")
    ax.set_xscale("log")
    ax.set_xlabel(f"{metric.upper()} (ms)")
    ax.set_ylabel("fraction")
    ax.set_title(f"{metric.upper()} CDF: real engine vs measured-model simulation")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _samples(scores: RunScores, metric: str) -> tuple[FloatArray, FloatArray]:
    """The metric's samples in seconds and the weight of each (ITLs are stored weighted)."""
    if metric == "itl":
        return scores.itl.values_s, scores.itl.counts.astype(np.float64)
    values = np.asarray(scores.ttft_s, dtype=np.float64)
    return values, np.ones_like(values)
