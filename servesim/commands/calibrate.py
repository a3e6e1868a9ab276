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
    eager_timing: bool = typer.Option(False, "--eager-timing/--graph-timing", help="on a GPU, time one eager "
                                      "call per run (host dispatch included) instead of replaying each point as a "
                                      "CUDA graph (the default: the GPU's own time, as vLLM's graph-replayed steps)"),
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
    host_link: bool = typer.Option(False, "--host-link/--no-host-link", help="also time host<->GPU copies "
                                   "(pinned memory): the link a CPU KV tier moves blocks over; prints the "
                                   "kv_offload / sglang.hicache settings that model it"),
) -> None:
    """Sweep ops (tokens for linear layers; attention by chunk x context and batch x context) and steps;
    with --collectives, the collectives of each group size over message bytes (all-reduce, all-gather,
    reduce-scatter, all-to-all, send/recv: what TP, MoE dispatch/combine and pipeline hand-offs use)."""
    import torch

    from servesim.simulator.cost_model.importers.nccl_tests import host_collective_rows
    from servesim.simulator.cost_model.profile_schema import make_profile, write_profile
    from servesim.simulator.outfile import check_output_file

    if model is None and not collectives and not host_link:
        raise InputError("name the model to calibrate", field="--model",
                         allowed="a GPU-runner preset, or --collectives / --host-link to measure only those")
    if dtype not in ("bf16", "fp16"):
        raise InputError(f"unknown dtype {dtype!r}", field="--dtype", allowed="bf16, fp16")
    if tp_sizes is not None and not collectives:
        raise InputError("--tp-sizes sets the groups of --collectives", field="--tp-sizes", allowed="add --collectives")
    groups = _group_sizes(device, tp_sizes) if collectives else []  # refuse before any sweep
    dev = _model_device(device, model) if model else torch.device(device)
    gpu_label = _gpu_label(gpu_label, dev)
    ar_rows = [r for path in (nccl_tests or []) for r in host_collective_rows(path, gpu_label)]  # fail before the sweep
    default = Path("runs/calibration") / (f"{_model_name(model)}.csv" if model else
                                          f"{'collectives' if collectives else 'host-link'}-{gpu_label}.csv")
    out = check_output_file(out or default, overwrite=overwrite)
    if model:  # the step report beside the profile follows the same rule, checked before the sweep
        from servesim.plots.calibration import report_paths

        for side in report_paths(out):
            check_output_file(side, overwrite=overwrite, flag="--out (its .report file)")
    rows = _measure_collectives(groups, dev.type, dtype, quick, gpu_label) if groups else []
    if model:
        rows += _sweep_model(model, dev, dtype, quick, seed, gpu_label, not eager_timing)
    rows += ar_rows
    link_rows = _measure_host_link(dev.type, quick, gpu_label) if host_link else []
    rows += link_rows
    out.parent.mkdir(parents=True, exist_ok=True)
    write_profile(make_profile(rows), out)  # atomic (a .tmp file renamed): nothing half-written
    typer.echo(f"wrote {len(rows)} profile rows to {out}")
    if groups:
        typer.echo(_collectives_table(rows))
    if link_rows:
        typer.echo(_host_link_report(link_rows))
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


def _sweep_model(model: str, dev, dtype: str, quick: bool, seed: int, gpu_label: str, graphs: bool) -> list[dict]:
    import torch

    from servesim.gpu_runner.calibrate import CalibrationGrid, calibrate as sweep
    from servesim.gpu_runner.model import LlamaModel
    from servesim.gpu import runner_model

    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float16
    m = LlamaModel.random(runner_model(model), seed=seed, dtype=torch_dtype, device=dev,
                          backend="triton" if dev.type == "cuda" else "torch")
    grid = CalibrationGrid.quick() if quick else CalibrationGrid()
    return sweep(m, _model_name(model), gpu_label, grid, progress=lambda msg: typer.echo(f"  {msg}", err=True),
                 graphs=graphs)


def _measure_host_link(device: str, quick: bool, gpu_label: str) -> list[dict]:
    from servesim.gpu_runner.host_link import HostLinkGrid, measure_host_link

    typer.echo(f"  host<->device copies on {device}" + (" (a memcpy: says nothing about a GPU)" if device == "cpu"
                                                         else ""), err=True)
    return measure_host_link(device, HostLinkGrid.quick() if quick else HostLinkGrid(), gpu_label)


def _host_link_report(rows: list[dict]) -> str:
    """Each direction's sizes and the fitted line, with the settings that model it."""
    from servesim.gpu_runner.host_link import DIRECTIONS, fit_link

    lines = [f"{'copy':<9} {'bytes':>11} {'time (us)':>10} {'GB/s':>8}"]
    lines += [f"{r['op']:<9} {r['bytes']:>11} {r['latency_s'] * 1e6:>10.2f} {r['algbw_gb_s']:>8.2f}" for r in rows]
    fits = {op: fit_link(rows, op) for op in DIRECTIONS}
    for op, (lat, bw) in fits.items():
        lines.append(f"{op}: {lat * 1e6:.1f} us per copy + bytes / {bw / 1e9:.2f} GB/s")
    lat, bw = min(fits.values(), key=lambda f: f[1])  # the slower direction bounds a tier's copies
    lines.append(f"model it with: --set kv_offload.host_link_bytes_per_s={bw:.4g} "
                 f"--set kv_offload.transfer_latency_s={lat:.3g} (SGLang: sglang.hicache.host_link_bytes_per_s, "
                 "sglang.hicache.transfer_latency_s)")
    return "\n".join(lines)


def _collectives_table(rows: list[dict]) -> str:
    """nccl-tests' columns for the measured collective rows."""
    lines = [f"{'op':<10} {'tp':>3} {'bytes':>11} {'time (us)':>10} {'algbw GB/s':>11} {'busbw GB/s':>11}"]
    for r in rows:
        if r["op"] in ("allreduce", "allgather") and r["source"] == "servesim":
            lines.append(f"{r['op']:<10} {r['tp']:>3} {r['bytes']:>11} {r['latency_s'] * 1e6:>10.2f} "
                         f"{r['algbw_gb_s']:>11.2f} {r['busbw_gb_s']:>11.2f}")
    return "\n".join(lines)
