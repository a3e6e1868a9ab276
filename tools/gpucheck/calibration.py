"""Part 5: `servesim calibrate`'s sweep on a bounded grid, `servesim fit`, and the fitted model
against the shipped calibrated profile of this GPU kind.

The same functions the two commands run (gpu_runner.calibrate.calibrate, the profile writer, the
calibration report, cost_model.fit.fit_main), on a grid that fits the part's budget: the default
grid's decode points (batch 256 x 8192 context) would need a 275 GB KV pool at 8B shapes.
"""

from __future__ import annotations

from pathlib import Path

from gpucheck.part import Part

SHIPPED_FOR_REHEARSAL = ("llama-3.1-8b", "h200")  # the CPU rehearsal compares against these (code path only)


def bounded_grid(device_type: str):
    """On a GPU: ~40 step and attention points, 5 timed runs each (median), KV pool ~35 GB at 8B
    shapes (decode batch 64 x 4096 context); on the CPU: CalibrationGrid.quick()."""
    from servesim.gpu_runner.calibrate import CalibrationGrid

    if device_type != "cuda":
        return CalibrationGrid.quick()
    return CalibrationGrid(token_counts=(1, 4, 16, 64, 256, 1024, 4096), prefill_chunks=(16, 128, 512, 2048),
                           prefill_prefixes=(0, 1024, 4096), decode_batches=(1, 8, 32, 64),
                           decode_contexts=(256, 1024, 4096), repeats=5, warmup=2)


def probe_shapes():
    """Steps both models price: decodes, prefills and one mixed step (labels for the table)."""
    from servesim.scheduler.step_shape import StepShape, decode_shape, prefill_shape

    shapes = [(f"decode {b} x {c}", decode_shape(b, c)) for b in (1, 8, 32, 64) for c in (512, 2048)]
    shapes += [(f"prefill {n}", prefill_shape(n)) for n in (128, 512, 2048)]
    shapes.append(("mixed 16 decodes x 1024 + prefill 256", StepShape((1,) * 16 + (256,), (1024,) * 16 + (0,), 17)))
    return shapes


def compare_with_shipped(fitted, shipped) -> list[str]:
    lines = ["| step | fitted here (ms) | shipped (ms) | here / shipped |", "| --- | --- | --- | --- |"]
    for label, shape in probe_shapes():
        a, b = fitted.step_time_s(shape), shipped.step_time_s(shape)
        lines.append(f"| {label} | {1e3 * a:.3f} | {1e3 * b:.3f} | {a / b:.2f} |")
    return lines


def run_calibration(part: Part, model: str, gpu: str, device, out: Path) -> None:
    import torch

    from servesim.gpu import runner_model
    from servesim.gpu_runner.calibrate import calibrate
    from servesim.gpu_runner.model import LlamaModel
    from servesim.plots.calibration import write_report
    from servesim.simulator.cost_model.calibrated import find_calibrated, load_calibrated
    from servesim.simulator.cost_model.fit import fit_main, format_fit_report
    from servesim.simulator.cost_model.fitted import FittedCostModel
    from servesim.simulator.cost_model.profile_schema import make_profile, write_profile

    grid = bounded_grid(device.type)
    # bf16 on the CPU too: `fit` prices the model's bf16 weights (its profile rows must say bf16)
    m = LlamaModel.random(runner_model(model), seed=0, dtype=torch.bfloat16, device=device,
                          backend="triton" if device.type == "cuda" else "torch")
    def progress(msg: str) -> None:  # after each token count / decode batch: the time box
        part.log(msg)
        part.progress(0.0, 0)

    rows = calibrate(m, model, gpu, grid, progress=progress)
    del m
    profile = out / f"{model}.csv"
    write_profile(make_profile(rows), profile)
    report = write_report(profile, model, gpu)
    part.log(report.splitlines()[-2])
    fitted_path = out / f"{model}__{gpu}__fitted.json"
    fit_text = format_fit_report(fit_main([str(profile)], fitted_path, model, gpu, 1, "auto"))
    (out / "fit_report.txt").write_text(fit_text + "\n")
    part.lines += [f"{len(rows)} profile rows ({profile.name}; grid: {len(grid.token_counts)} token counts, "
                   f"{len(grid.prefill_chunks) * len(grid.prefill_prefixes)} prefill and "
                   f"{len(grid.decode_batches) * len(grid.decode_contexts)} decode points, median of {grid.repeats}), "
                   f"fitted to {fitted_path.name}.", "", "Fitted model vs the measured whole steps: "
                   + report.splitlines()[-2], "", "```", fit_text, "```", ""]
    ref_model, ref_gpu = (model, gpu) if device.type == "cuda" else SHIPPED_FOR_REHEARSAL
    if find_calibrated(ref_model, ref_gpu, 1) is None:
        part.lines.append(f"No shipped calibrated profile for {ref_model} on {ref_gpu}: nothing to compare with.")
        part.summary = f"{len(rows)} rows fitted; no shipped profile for {ref_gpu}"
        return
    note = "" if device.type == "cuda" else " (rehearsal: a CPU fit of tiny-llama, so only the code path is checked)"
    part.lines += [f"Against the shipped profile {ref_model} on {ref_gpu}{note}:", "",
                   *compare_with_shipped(FittedCostModel.load(fitted_path), load_calibrated(ref_model, ref_gpu, 1))]
    part.summary = f"{len(rows)} rows fitted, compared with the shipped {ref_gpu} profile"
