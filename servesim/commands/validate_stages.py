"""`servesim validate-stages FOLDER`: compare runs measured per load stage by a benchmark client
(inference-perf over HTTP, e.g. ../shared/data/benchmarks/blis_h100_trainval) with the simulator."""

from __future__ import annotations

from pathlib import Path

import typer

from servesim.cli import app


@app.command("validate-stages")
def validate_stages(
    folder: Path = typer.Argument(..., help="a folder of per-stage measured runs (BLIS layout)"),
    run: list[str] = typer.Option([], "--run", help="only runs whose name starts with this (repeatable)"),
    cost_model: str = typer.Option("roofline", "--cost-model", help="roofline | calibrated | a fitted .json"),
    frontend: bool = typer.Option(True, "--frontend/--no-frontend", help="model the OpenAI HTTP frontend"),
    client_timeout_s: float = typer.Option(None, "--client-timeout-s", help="clients give up after this (s)"),
    max_requests: int = typer.Option(None, "--max-requests", help="only the first N requests of each run"),
    out: Path = typer.Option(None, "--out", help="write errors.csv and table.md here"),
) -> None:
    """Per-stage errors (TTFT, ITL, E2E) of every run the simulator can model; others are listed as skipped."""
    import pandas as pd

    from simulator.validation.stages import StageOptions, compare_run, load_staged_runs, markdown_table
    from traces.errors import InputError

    opts = StageOptions(cost_model=cost_model, frontend=frontend, client_timeout_s=client_timeout_s,
                        max_requests=max_requests)
    frames, skipped = [], []
    for staged in load_staged_runs(folder):
        if run and not any(staged.name.startswith(r) for r in run):
            continue
        try:
            frames.append(compare_run(staged, opts))
            typer.echo(f"compared {staged.name}", err=True)
        except InputError as e:  # e.g. a model or precision servesim cannot simulate yet
            skipped.append((staged.name, str(e)))
    errors = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    table = markdown_table(errors)
    typer.echo(table)
    for name, why in skipped:
        typer.echo(f"skipped {name}: {why}")
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        errors.to_csv(out / "errors.csv", index=False)
        (out / "table.md").write_text(table + "".join(f"\nskipped {n}: {w}" for n, w in skipped) + "\n")
