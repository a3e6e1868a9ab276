"""`servesim compare RUN_A RUN_B ...`: runs side by side, with each metric's change against the first."""

from __future__ import annotations

from pathlib import Path

import typer

from servesim.cli import app


@app.command("compare")
def compare_command(
    runs: list[Path] = typer.Argument(..., help="two or more run folders (the first is the baseline)"),
    out: Path = typer.Option(None, "--out", help="also write report.html (tables and latency CDFs) to this new folder"),
    overwrite: bool = typer.Option(False, "--overwrite/--no-overwrite", help="replace an earlier compare in --out"),
) -> None:
    """Print the settings that differ and the headline metrics with deltas against the first run."""
    from rich.table import Table

    from servesim.compare import compare_runs, delta_text, write_compare_report
    from servesim.report import make_console
    from servesim.simulator.outdir import check_output

    if out is not None:
        check_output(out, overwrite=overwrite)  # before any work
    cmp = compare_runs(runs)
    console = make_console()
    if cmp.settings:
        t = Table(title="settings that differ")
        for col in ("setting", *cmp.names):
            t.add_column(col, justify="left" if col == "setting" else "right")
        for key, values in cmp.settings.items():
            t.add_row(key, *(str(v) for v in values))
        console.print(t)
    else:
        console.print("the runs have the same settings")
    t = Table(title=f"metrics (change against {cmp.names[0]})")
    for col in ("metric", *cmp.names):
        t.add_column(col, justify="left" if col == "metric" else "right")
    for (label, unit, digits, values), noise in zip(cmp.metrics, cmp.noise):
        cells = ["–" if values[0] is None else f"{values[0]:,.{digits}f}"]
        cells += ["–" if v is None else f"{v:,.{digits}f} {delta_text(v, values[0], digits)}"
                  + (f" [{'bold' if n == 'beyond noise' else 'dim'}]{n}[/]" if n else "")
                  for v, n in zip(values[1:], noise)]
        t.add_row(f"{label} ({unit})" if unit else label, *cells)
    console.print(t)
    if any(n for row in cmp.noise for n in row):
        console.print("beyond noise: Welch's t-test over the replicates at 5 % (servesim/intervals.py); "
                      "replicate folders show their means")
    if out is not None:
        console.print(f"report: {write_compare_report(cmp, out, overwrite)}")
