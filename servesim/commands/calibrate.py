"""`servesim calibrate`: measure a model's operations and whole steps on a GPU, and/or the TP
collectives across this machine's GPUs; write a profile in the simulator's schema, and report how
well a cost model fitted from the op rows predicts the steps."""

from __future__ import annotations

from pathlib import Path

import typer

from servesim.cli import app
from servesim.traces.errors import InputError


@app.command()
def calibrate(
    model: str = typer.Option(None, "--model", help="GPU-runner preset (tiny-llama, llama-3.1-8b, ...) or a "
                              "dense Llama-style model: a Hugging Face config.json (path or folder) or catalogue "
                              "id, run at its shapes with random weights; may be left out with --collectives"),
    out: Path = typer.Option(None, "--out", help="profile file to write (.csv); default runs/calibration/MODEL.csv "
                             "(collectives-GPU.csv without --model)"),
    device: str = typer.Option("cuda", "--device", help="cuda | cpu (cpu: functional runs only)"),
    gpu_label: str = typer.Option(None, "--gpu-label", help="GPU id for the profile (default: from the device name)"),
    dtype: str = typer.Option("bf16", "--dtype", help="bf16 | fp16"),
    quick: bool = typer.Option(False, "--quick/--no-quick", help="a few points only (smoke runs)"),
    overwrite: bool = typer.Option(False, "--overwrite/--no-overwrite", help="replace an existing --out file"),
    seed: int = typer.Option(0, "--seed"),
    nccl_tests: list[Path] = typer.Option(None, "--nccl-tests", help="nccl-tests output measured on this host "
                                          "(all_reduce_perf, all_gather_perf, reduce_scatter_perf, alltoall_perf, "
                                          "sendrecv_perf; repeatable, e.g. one file per GPU count): its rows join the "
                                          "profile, so `servesim fit` uses this host's all-reduce and "
                                          "collectives_profile every collective"),
    collectives: bool = typer.Option(False, "--collectives/--no-collectives", help="also time all-reduce, "
                                     "all-gather, reduce-scatter, all-to-all and send/recv across this machine's GPUs "
                                     "(one process per GPU, NCCL; needs 2+ GPUs; with --device cpu: gloo, for tests "
                                     "only)"),
    tp_sizes: str = typer.Option(None, "--tp-sizes", help="group sizes for --collectives, e.g. 2,4,8 "
                                 "(default: 2 .. the number of visible GPUs; 2 on the CPU)"),
) -> None:
    """Sweep ops (tokens for linear layers; attention by chunk x context and batch x context) and steps;
    with --collectives, the collectives of each group size over message bytes (all-reduce, all-gather,
    reduce-scatter, all-to-all, send/recv: what TP, MoE dispatch/combine and pipeline hand-offs use)."""
    import torch

    from servesim.simulator.cost_model.importers.nccl_tests import host_collective_rows
    from servesim.simulator.cost_model.profile_schema import make_profile, write_profile
    from servesim.simulator.outfile import check_output_file

    if model is None and not collectives:
        raise InputError("name the model to calibrate", field="--model",
                         allowed="a GPU-runner preset, or --collectives to measure collectives only")
    if dtype not in ("bf16", "fp16"):
        raise InputError(f"unknown dtype {dtype!r}", field="--dtype", allowed="bf16, fp16")
    if tp_sizes is not None and not collectives:
        raise InputError("--tp-sizes sets the groups of --collectives", field="--tp-sizes", allowed="add --collectives")
    groups = _group_sizes(device, tp_sizes) if collectives else []  # refuse before any sweep
    dev = _model_device(device, model) if model else torch.device(device)
    gpu_label = _gpu_label(gpu_label, dev)
    ar_rows = [r for path in (nccl_tests or []) for r in host_collective_rows(path, gpu_label)]  # fail before the sweep
    default = Path("runs/calibration") / (f"{_model_name(model)}.csv" if model else f"collectives-{gpu_label}.csv")
    out = check_output_file(out or default, overwrite=overwrite)
    if model:  # the step report beside the profile follows the same rule, checked before the sweep
        from servesim.plots.calibration import report_paths

        for side in report_paths(out):
            check_output_file(side, overwrite=overwrite, flag="--out (its .report file)")
    rows = _measure_collectives(groups, dev.type, dtype, quick, gpu_label) if groups else []
    if model:
        rows += _sweep_model(model, dev, dtype, quick, seed, gpu_label)
    rows += ar_rows
    out.parent.mkdir(parents=True, exist_ok=True)
    write_profile(make_profile(rows), out)  # atomic (a .tmp file renamed): nothing half-written
    typer.echo(f"wrote {len(rows)} profile rows to {out}")
    if groups:
        typer.echo(_collectives_table(rows))
    if model:
        from servesim.plots.calibration import write_report

        typer.echo(write_report(out, _model_name(model), gpu_label))


def _model_name(model: str) -> str:
    from servesim.simulator.specs import resolve_model

    return resolve_model(model).name


def _model_device(device: str, model: str):
    from servesim.gpu import runner_model
    from servesim.gpu_runner.runner import require_device

    runner_model(model)  # refuse a model the runner cannot run before looking for a device
    try:
        return require_device(device)
    except RuntimeError as e:
        raise InputError(str(e), field="--device") from None


def _gpu_label(gpu_label: str | None, dev) -> str:
    import torch

    from servesim.simulator.specs import find_gpu

    if gpu_label is not None:
        return gpu_label
    found = find_gpu(torch.cuda.get_device_name(dev)) if dev.type == "cuda" else None
    if found is None:
        raise InputError("cannot tell which GPU this is", field="--gpu-label",
                         allowed="a GPU id such as h100 (see simulator/specs/gpus.yaml)")
    return found.name


def _group_sizes(device: str, tp_sizes: str | None) -> list[int]:
    from servesim.gpu_runner.collectives import group_sizes

    try:
        given = [int(t) for t in tp_sizes.split(",")] if tp_sizes is not None else None
    except ValueError:
        raise InputError(f"not a comma-separated list of GPU counts: {tp_sizes!r}", field="--tp-sizes",
                         allowed="e.g. 2,4,8") from None
    kind = device.split(":")[0]
    if kind not in ("cuda", "cpu"):
        raise InputError(f"unknown device {device!r}", field="--device", allowed="cuda, cpu")
    try:
        return group_sizes(kind, given)
    except ValueError as e:
        raise InputError(str(e), field="--tp-sizes" if given else "--collectives") from None


def _measure_collectives(groups: list[int], device: str, dtype: str, quick: bool, gpu_label: str) -> list[dict]:
    from servesim.gpu_runner.collectives import CollectiveGrid, measure_collectives

    typer.echo(f"  collectives over {', '.join(map(str, groups))} {device} ranks", err=True)
    try:
        return measure_collectives(groups, device, dtype, CollectiveGrid.quick() if quick else CollectiveGrid(),
                                   gpu_label, verbose=True)
    except RuntimeError as e:  # a rank failed (NCCL, driver): one line, nothing written
        typer.secho(f"error: {e}; nothing was written", fg="red", err=True)
        raise typer.Exit(1) from None


def _sweep_model(model: str, dev, dtype: str, quick: bool, seed: int, gpu_label: str) -> list[dict]:
    import torch

    from servesim.gpu_runner.calibrate import CalibrationGrid, calibrate as sweep
    from servesim.gpu_runner.model import LlamaModel
    from servesim.gpu import runner_model

    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float16
    m = LlamaModel.random(runner_model(model), seed=seed, dtype=torch_dtype, device=dev,
                          backend="triton" if dev.type == "cuda" else "torch")
    grid = CalibrationGrid.quick() if quick else CalibrationGrid()
    return sweep(m, _model_name(model), gpu_label, grid, progress=lambda msg: typer.echo(f"  {msg}", err=True))


def _collectives_table(rows: list[dict]) -> str:
    """nccl-tests' columns for the measured collective rows."""
    lines = [f"{'op':<10} {'tp':>3} {'bytes':>11} {'time (us)':>10} {'algbw GB/s':>11} {'busbw GB/s':>11}"]
    for r in rows:
        if r["op"] in ("allreduce", "allgather") and r["source"] == "servesim":
            lines.append(f"{r['op']:<10} {r['tp']:>3} {r['bytes']:>11} {r['latency_s'] * 1e6:>10.2f} "
                         f"{r['algbw_gb_s']:>11.2f} {r['busbw_gb_s']:>11.2f}")
    return "\n".join(lines)
