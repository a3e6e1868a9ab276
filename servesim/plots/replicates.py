"""The figures of a replicates folder (servesim/replicates.py): bands, not single lines.

    latency_bands     TTFT, TPOT and E2E CDFs: the band spans the replicates' CDFs (lowest to highest
                      quantile at each fraction of requests), the line is their median
    interval_chart    each latency percentile's mean with its 95 % CI of the mean (thick) and 90 %
                      prediction interval (thin), from summary.json's replicates.metrics
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from servesim.plots import style

LATENCIES = (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2e_s", "E2E"))
QUANTILE_GRID = np.linspace(0.0, 1.0, 201)


def replicate_requests(folder: Path) -> list[pd.DataFrame]:
    from servesim.replicate_summary import REPLICATES_DIR

    return [pd.read_parquet(sub / "requests.parquet") for sub in sorted((folder / REPLICATES_DIR).iterdir())
            if (sub / "requests.parquet").is_file()]


def latency_bands(frames: list[pd.DataFrame], title: str = "Latency CDFs over the replicates"):
    fig = style.figure(11, 3.4)
    axes = style.subplots(fig, 1, 3)[0]
    for ax, (col, name) in zip(axes, LATENCIES):
        columns = [f[col].dropna().to_numpy(float) for f in frames if col in f]
        columns = [c for c in columns if len(c)]
        if not columns:
            style.note(ax, f"no {name} values")
            continue
        unit = style.time_unit(np.concatenate(columns))
        q = np.array([np.quantile(c, QUANTILE_GRID) for c in columns])  # replicate x fraction
        ax.fill_betweenx(QUANTILE_GRID, q.min(axis=0), q.max(axis=0), color=style.color(0), alpha=0.25, lw=0,
                         label=f"range over {len(columns)} replicates")
        ax.plot(np.median(q, axis=0), QUANTILE_GRID, color=style.color(0), lw=1.6, label="median replicate")
        style.seconds_axis(ax, unit)
        ax.set_xlabel(f"{name} ({unit[0]})")
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.02)
        ax.set_title(name)
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncols=2, frameon=False)
    fig.suptitle(title)
    return fig


def interval_chart(summary: dict, title: str = "Latency percentiles: mean, 95 % CI, 90 % prediction interval"):
    metrics = summary["replicates"]["metrics"]
    fig = style.figure(11, 3.4)
    axes = style.subplots(fig, 1, 3)[0]
    stats = ("mean", "p50", "p90", "p99")
    for ax, (col, name) in zip(axes, LATENCIES):
        rows = [(s, metrics[f"{col}.{s}"]) for s in stats if f"{col}.{s}" in metrics]
        if not rows:
            style.note(ax, f"no {name} values")
            continue
        unit = style.time_unit([iv["mean"] for _, iv in rows])
        scale = unit[1]  # seconds -> the unit shown
        for i, (stat, iv) in enumerate(rows):
            ax.plot([iv["pi_low"] * scale, iv["pi_high"] * scale], [i, i], color=style.color(0), lw=1.2)
            ax.plot([iv["ci_low"] * scale, iv["ci_high"] * scale], [i, i], color=style.color(0), lw=5, alpha=0.6)
            ax.plot([iv["mean"] * scale], [i], "o", color=style.color(1))
        ax.set_yticks(range(len(rows)), [s for s, _ in rows])
        ax.set_xlabel(f"{name} ({unit[0]})")
        ax.set_title(name)
    fig.suptitle(title)
    return fig


def plot_replicates(folder: str | Path, out: str | Path) -> tuple[list[Path], Path]:
    """PNGs and report.html for a replicates folder."""
    import json

    from servesim.plots.report import run_table, write_report

    def _save(fig, path: Path) -> Path:  # as servesim.plots._save (importing the package would be a cycle)
        style.save(fig, path)
        fig.clear()
        return path

    folder, out = Path(folder), Path(out)
    summary = json.loads((folder / "summary.json").read_text())
    rep = summary["replicates"]
    figs = [(_save(latency_bands(replicate_requests(folder)), out / "latency_bands.png"),
             "TTFT, TPOT and E2E CDFs: band = range of the replicates' CDFs, line = the median replicate"),
            (_save(interval_chart(summary), out / "intervals.png"),
             "Each statistic's mean (dot), 95 % CI of the mean (thick) and 90 % prediction interval (thin)")]
    desc = (f"{rep['num_replicates']} replicates. Varies: {'; '.join(rep['varies']) or 'nothing'}. "
            f"Fixed: {'; '.join(rep['fixed']) or 'nothing'}. The table shows the means over the replicates.")
    report = write_report(out, f"servesim replicates: {folder.name}", desc, run_table(summary),
                          [("Intervals", figs, False)])
    return [p for p, _ in figs], report
