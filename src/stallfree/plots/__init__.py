"""Figures (matplotlib, Agg backend): timelines, sweeps, distributions.

Each module draws its figures; :func:`save_figures` writes them all the same way.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

DECODE_COLOR = "#4C78A8"
PROMPT_COLOR = "#F58518"


def save_figures(
    figures: Iterable[tuple[str, Figure]],
    out_dir: str | Path,
    dpi: int = 150,
    formats: tuple[str, ...] = ("png", "svg"),
) -> list[Path]:
    """Write each ``(name, figure)`` as ``name.png`` and ``name.svg`` (or ``formats``) in
    ``out_dir``; close them."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    for name, fig in figures:
        for ext in formats:
            path = out / f"{name}.{ext}"
            fig.savefig(path, dpi=dpi, bbox_inches="tight")
            paths.append(path)
        plt.close(fig)
    return paths
