"""`servesim export-trace`: a finished run's simulated timeline as a Chrome trace for ui.perfetto.dev."""

from __future__ import annotations

from pathlib import Path

import typer

from servesim.cli import app


@app.command("export-trace")
def export_trace(
    run: Path = typer.Argument(..., help="a finished run's folder (servesim replay --out)"),
    out: Path = typer.Option(..., "--out", help="the trace file to write (JSON)"),
    step_trace: Path = typer.Option(None, "--step-trace", help="the run's step trace (replay --step-trace): "
                                                               "each prefill chunk, decode run and preemption"),
    max_requests: int = typer.Option(20_000, "--max-requests", help="requests kept (every k-th beyond)"),
    max_steps: int = typer.Option(50_000, "--max-steps", help="steps kept (every k-th beyond)"),
    overwrite: bool = typer.Option(False, "--overwrite/--no-overwrite", help="replace an existing --out file"),
) -> None:
    """Write RUN's engine steps, requests (with their phases) and KV/queue counters as a Chrome trace
    (open it at ui.perfetto.dev or chrome://tracing)."""
    from servesim.perfetto import write_chrome_trace
    from servesim.report import make_console

    path = write_chrome_trace(run, out, step_trace, overwrite=overwrite, max_requests=max_requests,
                              max_steps=max_steps)
    make_console().print(f"trace written to {path} (open it at https://ui.perfetto.dev)", highlight=False)
