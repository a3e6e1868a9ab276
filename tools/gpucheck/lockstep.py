"""Parts 3 and 4: the lock-step replay (simulated executor vs the GPU runner on the model clock)
and the wall-clock replay (each step's measured time vs the cost models' price of that batch)."""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path

from gpucheck.part import Part

KINDS = ("prefill", "decode", "mixed")


@dataclasses.dataclass(slots=True, frozen=True)
class ReplaySize:
    model: str  # GPU-runner preset with random weights
    num_requests: int  # the bundled ShareGPT trace's first requests
    max_output_len: int  # their outputs cut to this many tokens (the replay's length is the longest output)
    num_gpu_blocks: int  # the KV pool, fixed (a derived pool would allocate most of the GPU)
    max_num_batched_tokens: int


def small_trace(size: ReplaySize):
    """The bundled ShareGPT trace's first requests, outputs cut to size.max_output_len."""
    from servesim.running import load_trace
    from servesim.traces.workload import Workload

    wl = load_trace(None, max_requests=size.num_requests)
    reqs = [dataclasses.replace(r, output_len=min(r.output_len, size.max_output_len)) for r in wl.requests]
    return Workload(reqs, name=wl.name, source=f"{wl.source} | outputs cut to {size.max_output_len} tokens",
                    attribution=wl.attribution)


def replay_cfg(size: ReplaySize, gpu: str):
    from servesim.overrides import apply_overrides
    from servesim.simulator.config import SimConfig

    cfg = SimConfig()
    cfg.hardware = dataclasses.replace(cfg.hardware, model=size.model, gpu=gpu)
    return apply_overrides(cfg, {"cache.num_gpu_blocks": size.num_gpu_blocks, "cache.block_size": 16,
                                 "scheduler.max_num_batched_tokens": size.max_num_batched_tokens})


def compare_step_traces(part: Part, sim: Path, gpu: Path, what: str) -> None:
    """Field for field (tools/compare_traces.py): the check's verdict and the first differences."""
    from compare_traces import diff_traces, load

    a, b = load(sim), load(gpu)
    problems = diff_traces(a, b)
    if part.check(not problems and len(a) > 0, f"{what}: step traces differ ({'; '.join(problems) or 'empty'})"):
        part.lines.append(f"- {what}: {len(a)} step records, identical field for field ({gpu.name} = {sim.name})")
    else:
        part.lines += [f"- {what}: **the step traces differ** ({sim.name} vs {gpu.name}):",
                       *(f"  - {p}" for p in problems)]


def check_cut_logits(part: Part, cut, device_type: str) -> None:
    """The cut's last prompt-token logits on this device against the CPU's fp32 ones (carried):
    the largest difference within 3 % of the logits' range in bf16 (0.8 % seen in bf16 on the
    CPU), 0.01 % in fp32, and a top token the reference ranks within that bound of its own top
    (the reference's top two are 1.1 % of the range apart: bf16 may swap them)."""
    import numpy as np

    from gpucheck.carry import prefill_logits

    got = prefill_logits(cut.model, cut.prompt_ids).numpy()
    ref = cut.reference_logits
    bound = 3e-2 if device_type == "cuda" else 1e-4
    span = float(ref.max() - ref.min())
    same_top = float(ref[int(got.argmax())]) >= float(ref.max()) - bound * span
    rel = float(np.abs(got - ref).max()) / span
    part.check(same_top and rel <= bound, f"SmolLM2 cut logits: top token {int(got.argmax())} vs {int(ref.argmax())}, "
               f"largest difference {rel:.2e} of the range (bound {bound})")
    top = f"{int(got.argmax())} (reference {int(ref.argmax())}{'' if same_top else ': OUT OF BOUND'})"
    part.lines.append(f"- SmolLM2 cut ({cut.model.config.num_layers} layers, {cut.model.config.vocab_size} "
                      f"vocabulary rows) prefill logits on this device vs the CPU's fp32: top token {top}, "
                      f"largest difference {rel:.2e} of the logits' range")


def run_lockstep(part: Part, size: ReplaySize, gpu: str, device, out: Path, cut_path: Path) -> None:
    import torch

    from gpucheck.carry import load_cut
    from servesim.gpu import make_gpu_executor
    from servesim.running import run

    cfg, wl = replay_cfg(size, gpu), small_trace(size)
    part.lines.append(f"Trace: the bundled ShareGPT trace's first {size.num_requests} requests, outputs cut to "
                      f"{size.max_output_len} tokens; {size.model} "
                      f"shapes (random weights), gpu {gpu}, {size.num_gpu_blocks} KV blocks of 16, "
                      f"max_num_batched_tokens {size.max_num_batched_tokens}, cost model {cfg.cost_model.name}.")
    res = run(cfg, wl, step_trace=out / "trace_sim.jsonl", progress=part.progress)
    part.log(f"simulated: {len(res.steps)} steps, {res.summary['num_finished']} finished")
    exe = make_gpu_executor(cfg, device=device.type, clock="model")
    run(cfg, wl, step_trace=out / "trace_gpu.jsonl", executor=exe, progress=part.progress)
    part.log(f"GPU runner ({size.model} shapes): {len(exe.timings)} executed steps")
    compare_step_traces(part, out / "trace_sim.jsonl", out / "trace_gpu.jsonl", f"{size.model} random weights")
    del exe
    _free(device)
    if part.expired():
        return
    if not part.check(cut_path.is_file(), f"the SmolLM2 cut {cut_path} is missing: run `make gpu-carry` (here) "
                      "and carry .gpu-carry"):
        return
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    cut = load_cut(cut_path, dtype, device, "triton" if device.type == "cuda" else "torch")
    check_cut_logits(part, cut, device.type)
    exe = make_gpu_executor(cfg, device=device.type, clock="model", model=cut.model)
    run(cfg, wl, step_trace=out / "trace_gpu_smollm2.jsonl", executor=exe, progress=part.progress)
    part.log(f"GPU runner (SmolLM2 cut): {len(exe.timings)} executed steps")
    compare_step_traces(part, out / "trace_sim.jsonl", out / "trace_gpu_smollm2.jsonl", "SmolLM2-135M real weights")
    part.summary = "identical step traces" if part.ok else "step traces DIFFER"


def _free(device) -> None:
    import gc

    gc.collect()
    if device.type == "cuda":
        import torch

        torch.cuda.empty_cache()


def step_kind(shape) -> str:
    """From the batch's counters: a request computing one token over a non-empty cache decodes
    (this replay has no speculative tokens); a step of only those is a decode step, of none a
    prefill step, of both a mixed one."""
    decodes = sum(1 for n, c in zip(shape.num_new_tokens, shape.num_context_tokens) if n == 1 and c > 0)
    return "decode" if decodes == shape.num_requests else "prefill" if decodes == 0 else "mixed"


def price_models(cfg) -> dict:
    """The cost models that price the measured steps: the run's own (cfg), and the shipped
    calibrated profile of this (model, GPU) where there is one."""
    from servesim.simulator.cost_model import run_cost_model
    from servesim.simulator.cost_model.base import make_cost_model
    from servesim.simulator.cost_model.calibrated import find_calibrated

    hw = cfg.hardware
    models = {cfg.cost_model.name: run_cost_model(cfg)}
    if cfg.cost_model.name != "calibrated" and find_calibrated(hw.model, hw.gpu, hw.tp) is not None:
        models["calibrated"] = make_cost_model("calibrated", model=hw.model, gpu=hw.gpu, tp=hw.tp)
    return models


def error_table(rows: list[dict], names: list[str]) -> list[str]:
    """Per step kind and cost model: steps, median and p90 of |predicted/measured - 1|, median bias."""
    lines = ["| step kind | cost model | steps | median abs error | p90 abs error | median signed error |",
             "| --- | --- | --- | --- | --- | --- |"]
    for kind in KINDS:
        sel = [r for r in rows if r["kind"] == kind]
        for name in names:
            errs = [r[f"predicted_{name}_s"] / r["measured_s"] - 1 for r in sel]
            if not errs:
                continue
            absd = sorted(abs(e) for e in errs)
            p90 = absd[min(len(absd) - 1, int(0.9 * len(absd)))]
            lines.append(f"| {kind} | {name} | {len(errs)} | {100 * statistics.median(absd):.1f} % | "
                         f"{100 * p90:.1f} % | {100 * statistics.median(errs):+.1f} % |")
    return lines


def run_wallclock(part: Part, size: ReplaySize, gpu: str, device, out: Path) -> None:
    import csv

    from servesim.gpu import make_gpu_executor
    from servesim.running import run

    cfg, wl = replay_cfg(size, gpu), small_trace(size)
    exe = make_gpu_executor(cfg, device=device.type, clock="measured")
    run(cfg, wl, step_trace=out / "trace_gpu_measured.jsonl", executor=exe, progress=part.progress)
    models = price_models(cfg)
    rows = [{"kind": step_kind(t.shape), "num_tokens": t.num_tokens, "num_requests": t.num_requests,
             "prepare_s": t.prepare_s, "measured_s": t.measured_s,
             **{f"predicted_{n}_s": m.step_time_s(t.shape) for n, m in models.items()}} for t in exe.timings]
    del exe
    _free(device)
    part.check(bool(rows), "the measured replay executed no step")
    with open(out / "steps_measured.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["kind"])
        w.writeheader()
        w.writerows(rows)
    part.log(f"{len(rows)} measured steps priced by {', '.join(models)}")
    part.lines += [f"{len(rows)} steps on `--clock measured` (same trace and settings as part 3); measured: forward "
                   "+ logits (CUDA events on a GPU, perf_counter on the CPU), host preparation apart (steps_measured.csv). Error = predicted / "
                   "measured - 1.", "", *error_table(rows, list(models))]
    counts = {k: sum(r["kind"] == k for r in rows) for k in KINDS}
    part.summary = f"{len(rows)} steps ({', '.join(f'{v} {k}' for k, v in counts.items())})"
    where_time_goes(part, cfg.hardware.model, gpu, device)


def where_time_goes(part: Part, model: str, gpu: str, device) -> None:
    """The runner's forward is eager: tools/gpu_graph_probe.py's steps timed eagerly, as the host
    issues them, and replayed as CUDA graphs, beside the cost models' prices."""
    from gpu_graph_probe import probe, table

    rows = probe(device.type, model, gpu, repeats=5, log=part.log)
    _free(device)
    part.lines += ["", "Where an eager step's time goes (`tools/gpu_graph_probe.py`, random weights, median of 5): "
                   "eager = one forward + logits between CUDA events, as `--clock measured` times it; host = "
                   "the wall time to issue that call; graph = the same call replayed as a CUDA graph.", "",
                   table(rows)]
