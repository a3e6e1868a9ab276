"""`servesim validate-bench RESULT.json --model M --gpu G --tp N`: compare the simulator with a
`vllm bench serve --save-result --save-detailed` run."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import typer

from servesim.cli import app


@app.command("validate-bench")
def validate_bench(
    result: Path = typer.Argument(..., help="a `vllm bench serve --save-result --save-detailed` JSON"),
    model: str = typer.Option(..., "--model"),
    gpu: str = typer.Option(..., "--gpu"),
    tp: int = typer.Option(1, "--tp"),
    cost_model: str = typer.Option("roofline", "--cost-model", help="registry name, or a fitted model file"),
    sets: list[str] = typer.Option([], "--set", help="the server's settings: --set scheduler.max_num_seqs=128"),
    frontend: bool = typer.Option(True, "--frontend/--no-frontend", help="model the OpenAI HTTP frontend"),
    seed: int = typer.Option(0, "--seed", help="seeds the send times (the file does not keep them)"),
    out: Path = typer.Option(None, "--out", help="results folder for validation.json (new, empty, or an earlier "
                             "result with --overwrite)"),
    overwrite: bool = typer.Option(False, "--overwrite/--no-overwrite", help="replace an earlier result in --out"),
) -> None:
    """Aggregate errors (completed, failed, TTFT, TPOT, ITL, E2EL) against a benchmark-client run."""
    from servesim.commands.replay import _build_config
    from servesim.simulator.validation.bench_result import load_bench_result
    from servesim.simulator.outdir import check_output, staged_output
    from servesim.simulator.validation.bench_result import validate_bench as _validate

    if out is not None:
        out = check_output(out.expanduser(), overwrite=overwrite)  # before the simulation
    cfg = _build_config(model, gpu, tp, cost_model, seed, sets)
    cfg.frontend = dataclasses.replace(cfg.frontend, enabled=frontend)
    report = _validate(load_bench_result(result), cfg)
    typer.echo(f"{'metric':22s} {'measured':>12s} {'simulated':>12s} {'error':>8s}")
    for row in report["rows"]:
        err = "-" if row["rel_error"] is None else f"{100 * row['rel_error']:+.1f}%"
        typer.echo(f"{row['metric']:22s} {row['measured']:12.2f} {row['simulated']:12.2f} {err:>8s}")
    if out is not None:
        with staged_output(out, "validate-bench", overwrite=overwrite) as tmp:
            (tmp / "validation.json").write_text(json.dumps(report, indent=1) + "\n")
