"""The check's driver: the output folder, the parts in order with their budgets, the report."""

from __future__ import annotations

import datetime
import time
import traceback
from pathlib import Path

from gpucheck.part import OverBudget, Part

# Seconds per part on one H100/H200 (tools/gpu_check.py's docstring). The CPU rehearsal checks the
# code path, not speed: its budgets only stop a hang (2 shared cores ran its parts in 1-30 s
# unloaded and up to 4x that under other jobs' load).
BUDGETS_S = {"cuda": {"env": 10, "kernels": 120, "lockstep": 120, "wallclock": 60, "calibration": 120},
             "cpu": {"env": 60, "kernels": 300, "lockstep": 300, "wallclock": 300, "calibration": 300}}
TITLES = {"env": "1. Environment", "kernels": "2. Kernels vs the torch reference",
          "lockstep": "3. Lock step: simulator vs GPU runner", "wallclock": "4. Wall clock vs the cost model",
          "calibration": "5. Calibration and fit"}


def sizes(device_type: str):
    """What each part runs at: 8B shapes on a GPU, tiny-llama on the CPU rehearsal."""
    from gpucheck.lockstep import ReplaySize

    if device_type == "cuda":  # 8192 blocks x 16 tokens x 128 KiB/token = 16 GiB of KV at 8B shapes
        return ReplaySize("llama-3.1-8b", 32, 256, 8192, 2048)
    return ReplaySize("tiny-llama", 6, 12, 512, 256)


def gpu_label(device) -> tuple[str, str]:
    """(GPU id for the cost models, how it was found)."""
    if device.type != "cuda":
        return "h100", "CPU rehearsal: priced as an H100"
    import torch

    from servesim.simulator.specs import find_gpu

    name = torch.cuda.get_device_name(device)
    found = find_gpu(name)
    return (found.name, f"from the device name {name!r}") if found else ("h100", f"{name!r} unknown: priced as an H100")


def default_out(device_type: str, root: Path) -> Path:
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return root / "runs" / f"gpu-check-{device_type}-{stamp}"


def run_check(device_type: str, out: Path | None, root: Path, carry: Path) -> int:
    """Run every part, write report.md; 0 when all passed, 1 otherwise."""
    from servesim.simulator.outdir import claim_output, mark

    if device_type == "cpu":
        import torch

        from servesim.gpu_runner import ops

        ops.use_triton_interpreter()  # before anything imports triton
        # One thread: on shared cores torch's thread pool spins against other jobs (the rehearsal's
        # tiny replay took 29.7 s with the default threads under a load of 12 on 2 cores, 1.5 s with one).
        torch.set_num_threads(1)
    with claim_output(out or default_out(device_type, root)) as folder:
        folder.mkdir(parents=True, exist_ok=True)
        mark(folder, "gpu-check")  # ours from the start: a killed run leaves a folder servesim may replace
        return _run_parts(device_type, folder, carry)


def _run_parts(device_type: str, folder: Path, carry: Path) -> int:
    import torch

    from gpucheck.calibration import run_calibration
    from gpucheck.carry import CUT_NAME
    from gpucheck.env import run_env
    from gpucheck.kernels import run_kernels
    from gpucheck.lockstep import run_lockstep, run_wallclock
    from servesim.gpu_runner.runner import require_device

    t0 = time.monotonic()
    log_file = open(folder / "log.txt", "a")

    def log(msg: str) -> None:
        line = f"{time.monotonic() - t0:7.1f}s {msg}"
        print(line, flush=True)
        log_file.write(line + "\n")
        log_file.flush()

    device = require_device(device_type)
    gpu, how = gpu_label(device)
    size = sizes(device.type)
    steps = {"env": lambda p: run_env(p, device), "kernels": lambda p: run_kernels(p, device),
             "lockstep": lambda p: run_lockstep(p, size, gpu, device, folder, carry / CUT_NAME),
             "wallclock": lambda p: run_wallclock(p, size, gpu, device, folder),
             "calibration": lambda p: run_calibration(p, size.model, gpu, device, folder)}
    parts = []
    for key, fn in steps.items():
        part = Part(TITLES[key], BUDGETS_S[device.type][key], log)
        part.log(f"start (budget {part.budget_s} s)")
        try:
            fn(part)
        except OverBudget:
            pass  # already recorded as the part's failure
        except Exception as e:  # the part fails; the others still run
            part.fail_with(e)
            log_file.write(traceback.format_exc())
        part.finish()
        part.log(f"{'passed' if part.ok else 'FAILED'} in {part.elapsed_s:.1f} s")
        parts.append(part)
    (folder / "report.md").write_text(report(parts, device_type, gpu, how, time.monotonic() - t0))
    log(f"report: {folder / 'report.md'}")
    log_file.close()
    return 0 if all(p.ok for p in parts) else 1


def report(parts: list[Part], device_type: str, gpu: str, how: str, total_s: float) -> str:
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    verdict = "PASSED" if all(p.ok for p in parts) else "FAILED"
    lines = [f"# gpu-check ({device_type}): {verdict}", "",
             f"{stamp}; {total_s:.0f} s in all; cost models priced for `{gpu}` ({how}).", "",
             "| part | result | time (s) | budget (s) | summary |", "| --- | --- | --- | --- | --- |",
             *(f"| {p.title} | {'passed' if p.ok else '**FAILED**'} | {p.elapsed_s:.1f} | {p.budget_s:.0f} | "
               f"{p.summary} |" for p in parts), ""]
    for p in parts:
        lines += [f"## {p.title}", ""]
        if p.failures:
            lines += ["Failures:", "", *(f"- {f}" for f in p.failures), ""]
        lines += [*p.lines, ""]
    return "\n".join(lines)
