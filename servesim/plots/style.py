"""Shared look of every figure: object-oriented matplotlib (no pyplot, so no global backend switch
and no interference with a notebook's inline backend), PNG via the Agg canvas, one palette."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

# Okabe-Ito: distinguishable with the common colour-vision deficiencies, and in greyscale print.
# Its yellow is left out: too faint as a thin line on white.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#000000", "#999999")
PREFILL, DECODE = "#D55E00", "#0072B2"
RUNNING, WAITING, KV = "#0072B2", "#E69F00", "#7f7f7f"
DPI = 110

RC = {
    "font.size": 9.5, "axes.titlesize": 10.5, "axes.labelsize": 9.5, "legend.fontsize": 8.5,
    "xtick.labelsize": 8.5, "ytick.labelsize": 8.5, "axes.grid": True, "grid.alpha": 0.3,
    "axes.spines.top": False, "axes.spines.right": False, "figure.titlesize": 12,
}


def figure(width: float, height: float) -> Figure:
    """A figure drawn with Agg whatever backend the caller's process uses."""
    import matplotlib as mpl

    with mpl.rc_context(RC):
        fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def subplots(fig: Figure, nrows: int, ncols: int, **kw):
    import matplotlib as mpl

    with mpl.rc_context(RC):
        return fig.subplots(nrows, ncols, squeeze=False, **kw)


def save(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    return path


def color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def time_unit(values) -> tuple[str, float]:
    """("ms", 1e3) for typical latencies, ("s", 1) once the median passes 2 s (overload runs)."""
    arr = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=float)
    return ("s", 1.0) if arr.size and np.median(arr) >= 2.0 else ("ms", 1e3)


def seconds_axis(ax, unit: tuple[str, float], which: str = "x") -> None:
    """Tick labels in the chosen unit (the data stay in seconds)."""
    scale = unit[1]
    fmt = FuncFormatter(lambda v, _: f"{v * scale:g}")
    (ax.xaxis if which == "x" else ax.yaxis).set_major_formatter(fmt)


def ecdf(values: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    x = np.sort(np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=float))
    return x, np.arange(1, len(x) + 1) / max(len(x), 1)


def note(ax, text: str) -> None:
    """A centred message in an empty panel (nothing to plot is information too)."""
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.4", fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])
