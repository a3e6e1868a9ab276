"""`servesim fit PROFILE... --out COSTMODEL`: fit a profiled cost model from measured timing tables."""

from __future__ import annotations

from pathlib import Path

import typer

from servesim.cli import app


@app.command()
def fit(
    profiles: list[Path] = typer.Argument(..., help="profile files or folders (aiconfigurator, vidur, llmservingsim, "
                                                   "splitwise, or our own schema)"),
    out: Path = typer.Option(..., "--out", help="fitted cost model file to write (.json)"),
    model: str = typer.Option(..., "--model"),
    gpu: str = typer.Option(..., "--gpu"),
    tp: int = typer.Option(1, "--tp"),
    source: str = typer.Option("auto", "--source", help="importer name, or auto"),
    overwrite: bool = typer.Option(False, "--overwrite/--no-overwrite", help="replace an existing --out file"),
) -> None:
    """Fit per-operation regressions and write a cost model `replay --cost-model FILE` can load."""
    from servesim.simulator.cost_model.fit import fit_main, format_fit_report
    from servesim.simulator.outfile import check_output_file

    check_output_file(out, overwrite=overwrite)

    fitted = fit_main([str(p) for p in profiles], out, model, gpu, tp, source)
    typer.echo(format_fit_report(fitted))
    typer.echo(f"wrote {out}")
