"""`servesim plot`: PNG figures and a self-contained report.html for a run or a sweep."""

from __future__ import annotations

from pathlib import Path

import typer

from servesim.cli import app


@app.command("plot")
def plot_command(
    results: Path = typer.Argument(..., help="a sweep folder (servesim run) or a run folder (servesim replay)"),
    out: Path = typer.Option(None, "--out", help="folder for the PNGs and report.html (default: RESULTS/plots; "
                             "an existing --out must be an earlier plot folder, replaced with --overwrite)"),
    overwrite: bool = typer.Option(False, "--overwrite/--no-overwrite", help="replace an earlier plot folder in --out"),
) -> None:
    """Plot latency CDFs, metrics vs the swept axis, queues/KV/preemptions/hits over time; write report.html."""
    from rich.console import Console

    from servesim.plots import plot_results

    pngs, report = plot_results(results, out, overwrite=overwrite)
    Console().print(f"{len(pngs)} figure(s) in {report.parent}/; report: {report}")
