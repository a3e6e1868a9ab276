"""`servesim calibrate-frontend --base-url URL --model NAME --out FRONTEND.yaml`: measure a server's
OpenAI frontend (HTTP, tokenization, engine hop, the per-request output cost of each engine step, learned
with background streams open) with a bounded number of requests."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import typer

from servesim.cli import app


@app.command("calibrate-frontend")
def calibrate_frontend(
    base_url: str = typer.Option(..., "--base-url", help="the server, e.g. http://127.0.0.1:8000"),
    model: str = typer.Option(..., "--model", help="model name the server serves"),
    out: Path = typer.Option(..., "--out", help="frontend parameters to write (.yaml)"),
    overwrite: bool = typer.Option(False, "--overwrite/--no-overwrite", help="replace an existing --out file"),
    max_requests: int = typer.Option(100, "--max-requests",
                                     help="cap on HTTP requests sent (each background stream counts one); "
                                          "it decides how many streams the per-stream probe holds open"),
    timeout_s: float = typer.Option(30.0, "--timeout-s", help="per-request timeout (s)"),
    deadline_s: float = typer.Option(120.0, "--deadline-s", help="the whole probe stops after this (s)"),
    engine_step_ms: float = typer.Option(0.0, "--engine-step-ms",
                                         help="one small engine step, subtracted from the first-chunk time"),
) -> None:
    """Measure the frontend; use the result with `--set frontend.enabled=true` and the values it prints,
    or `extends:` it from a scenario file."""
    import yaml

    from servesim.frontend_probe import ProbeLimits, probe_frontend
    from servesim.simulator.outfile import atomic_text, check_output_file

    out = check_output_file(out, overwrite=overwrite)  # before the server is probed
    limits = ProbeLimits(max_requests=max_requests, request_timeout_s=timeout_s, deadline_s=deadline_s)
    measured = probe_frontend(base_url, model, limits, engine_step_s=engine_step_ms / 1e3)
    values = {k: v for k, v in dataclasses.asdict(measured.config).items() if v is not None}  # no deprecated keys
    atomic_text(out, yaml.safe_dump({"frontend": values, "measured": {"base_url": base_url, "model": model,
                                                                   "num_requests": measured.num_requests,
                                                                   "samples_s": measured.samples}},
                                  sort_keys=False))
    for key, value in values.items():
        typer.echo(f"frontend.{key} = {value:.6g}" if isinstance(value, float) else f"frontend.{key} = {value}")
    typer.echo(f"{measured.num_requests} requests; wrote {out}")
