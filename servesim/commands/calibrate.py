"""`servesim calibrate`: measure a model's operations and whole steps on a GPU, write a profile in the
simulator's schema, and report how well a cost model fitted from the op rows predicts the steps."""

from __future__ import annotations

from pathlib import Path

import typer

from servesim.cli import app
from servesim.traces.errors import InputError


@app.command()
def calibrate(
    model: str = typer.Option(..., "--model", help="GPU-runner preset (tiny-llama, llama-3.1-8b, ...)"),
    out: Path = typer.Option(None, "--out", help="profile file to write (.csv); default runs/calibration/MODEL.csv"),
    device: str = typer.Option("cuda", "--device", help="cuda | cpu (cpu: functional runs only)"),
    gpu_label: str = typer.Option(None, "--gpu-label", help="GPU id for the profile (default: from the device name)"),
    dtype: str = typer.Option("bf16", "--dtype", help="bf16 | fp16"),
    quick: bool = typer.Option(False, "--quick/--no-quick", help="a few points only (smoke runs)"),
    overwrite: bool = typer.Option(False, "--overwrite/--no-overwrite", help="replace an existing --out file"),
    seed: int = typer.Option(0, "--seed"),
    nccl_tests: list[Path] = typer.Option(None, "--nccl-tests", help="nccl-tests all_reduce_perf output measured on "
                                          "this host (repeatable, one file per GPU count): its all-reduce rows join "
                                          "the profile, so `servesim fit` uses this host's all-reduce"),
) -> None:
    """Sweep ops (tokens for linear layers; attention by chunk x context and batch x context) and steps."""
    import torch

    from servesim.gpu_runner.calibrate import CalibrationGrid, calibrate as sweep
    from servesim.gpu_runner.model import LlamaModel
    from servesim.gpu_runner.runner import require_device
    from servesim.gpu_runner.weights import PRESETS, preset
    from servesim.plots.calibration import write_report
    from servesim.simulator.cost_model.profile_schema import make_profile, write_profile
    from servesim.simulator.outdir import check_output_file
    from servesim.simulator.specs import find_gpu, resolve_model

    try:
        dev = require_device(device)
    except RuntimeError as e:
        raise InputError(str(e), field="--device") from None
    if model.lower() not in PRESETS:
        raise InputError(f"no GPU-runner preset {model!r}", field="--model", allowed=", ".join(sorted(PRESETS)))
    if dtype not in ("bf16", "fp16"):
        raise InputError(f"unknown dtype {dtype!r}", field="--dtype", allowed="bf16, fp16")
    if gpu_label is None:
        found = find_gpu(torch.cuda.get_device_name(dev)) if dev.type == "cuda" else None
        if found is None:
            raise InputError("cannot tell which GPU this is", field="--gpu-label",
                             allowed="a GPU id such as h100 (see simulator/specs/gpus.yaml)")
        gpu_label = found.name
    from servesim.simulator.cost_model.importers.nccl_tests import host_allreduce_rows

    ar_rows = [r for path in (nccl_tests or []) for r in host_allreduce_rows(path, gpu_label)]  # fail before the sweep
    spec = resolve_model(model)
    out = check_output_file(out or Path("runs/calibration") / f"{spec.name}.csv", overwrite=overwrite)
    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float16
    m = LlamaModel.random(preset(model.lower()), seed=seed, dtype=torch_dtype, device=dev,
                          backend="triton" if dev.type == "cuda" else "torch")
    grid = CalibrationGrid.quick() if quick else CalibrationGrid()
    rows = sweep(m, spec.name, gpu_label, grid, progress=lambda msg: typer.echo(f"  {msg}", err=True))
    rows += ar_rows
    out.parent.mkdir(parents=True, exist_ok=True)
    write_profile(make_profile(rows), out)
    typer.echo(f"wrote {len(rows)} profile rows to {out}")
    table = write_report(out, spec.name, gpu_label)
    typer.echo(table)
