"""Closed-loop check: fixed-concurrency benchmarks (aiconfigurator silicon sweeps) vs the simulator.

Each measured row gives model, precision, TP, ISL/OSL, client concurrency (``batch_size``) and the
measured mean TTFT and TPOT. We run ``run_closed_loop`` with that many clients, each sending
``requests_per_client`` requests back to back, on the calibrated cost model of (model, GPU, TP),
and compare the means. The engine settings are the vLLM version's serving defaults (the rows do
not record them): for vLLM 0.12 on an >= 70 GiB GPU that is max_num_seqs 1024,
max_num_batched_tokens 8192, chunked prefill and prefix caching on, synchronous scheduling,
gpu_memory_utilization 0.9, max_model_len = the model's maximum; the KV pool is derived
(``kv.choose_kv_blocks``).

Client start times. With fixed ISL/OSL a deterministic simulation keeps clients that start
together in lock step forever: every prompt of the wave lands in one step, so TTFT is the prefill
of the whole wave. Real clients drift apart within a few requests (jitter in the HTTP path and in
the engine), so the benchmark's means come from clients with unrelated phases. The ``stagger``
option says how client c's first request is placed, in units of one request cycle (the cost
model's estimate of one request's latency at that concurrency: prefill of ISL tokens + OSL-1
decode steps of C requests); no measured latency enters the offsets:

* ``random`` (default): independent uniform phases in [0, cycle) (seeded): some prompts still
  collide in one step, as with independent clients;
* ``cycle``: evenly spaced phases c/C of a cycle (the most favourable case: prompts never collide);
* ``none``: every client at t=0 (``simulator.closed_loop.run_closed_loop``: lock step, the least
  favourable case).

Two simulated means are reported per row: ``steady`` (each client's first request excluded) and
``all`` (every request, as a benchmark client that averages everything would).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from servesim.scheduler.config import CacheConfig, SchedulerConfig
from servesim.simulator.closed_loop import ClosedLoopConfig, run_closed_loop
from servesim.simulator.config import HardwareConfig, SimConfig
from servesim.simulator.specs import resolve_gpu, resolve_model, with_precision
from servesim.traces.errors import InputError

from .cpu import cpu_overhead_preset
from .kv import choose_kv_blocks
from .replay import cost_model_config
from .runs import parse_version

SILICON_PATH = Path("/work/shared/data/benchmarks/aiconfigurator_silicon/silicon_sample.csv.gz")
# aiconfigurator's `precision` column -> the weight format servesim models (specs/precision.py);
# "fp4" is NVFP4 except on checkpoints that ship their own 4-bit format (gpt-oss: MXFP4).
PRECISION_FORMATS = {"bf16": None, "fp16": None, "fp8": "fp8", "fp4": "nvfp4", "int4": "int4"}
DEFAULT_MODELS = ("Qwen/Qwen3-32B", "meta-llama/Llama-3.1-70B")


@dataclass(slots=True)
class ClosedLoopOptions:
    requests_per_client: int = 4
    warmup_requests_per_client: int = 1
    cost_model: str = "calibrated"
    cpu_overhead: str = "calibrated"
    stagger: str = "random"  # random | cycle | none (see the module docstring)
    seed: int = 0


def load_silicon_rows(path: str | Path = SILICON_PATH, *, backend: str = "vllm", system: str = "h100_sxm",
                      mode: str = "agg", models: tuple[str, ...] | None = DEFAULT_MODELS) -> pd.DataFrame:
    df = pd.read_csv(path)
    sel = df[(df["backend"] == backend) & (df["system"] == system) & (df["mode"] == mode)].copy()
    if models:
        sel = sel[sel["model_path"].isin(models)]
    sel["precision"] = sel["precision"].fillna("bf16")
    sel = sel.sort_values(["model_path", "precision", "tp_size", "isl", "osl", "batch_size"])
    return sel.reset_index(drop=True)


def vllm_serving_defaults(version: str | None, gpu: str) -> dict:
    """vLLM V1 `vllm serve` defaults for a version and GPU (usage-context defaults of EngineArgs)."""
    g = resolve_gpu(gpu)
    big = g.memory_gib >= 70 and not g.name.startswith("a100")
    ver = parse_version(version)
    return {"max_num_seqs": 1024 if big else 256, "max_num_batched_tokens": 8192 if big else 2048,
            "async_scheduling": ver is not None and ver >= (0, 14), "enable_prefix_caching": True,
            "enable_chunked_prefill": True, "block_size": 16, "gpu_memory_utilization": 0.9}


def _gpu_of(system: str) -> str:
    return resolve_gpu(system).name


def row_config(row: pd.Series, opts: ClosedLoopOptions) -> tuple[SimConfig, dict]:
    model = resolve_model(row["model_path"])
    fmt = PRECISION_FORMATS[row["precision"]]
    if fmt is not None and model.experts_dtype == "bf16" and model.weight_dtype == "bf16":
        model = with_precision(model, fmt)  # a bf16 checkpoint served quantised
    gpu = _gpu_of(row["system"])
    tp = int(row["tp_size"])
    pp = int(row.get("pp_size", 1) or 1)
    d = vllm_serving_defaults(str(row.get("backend_version")) if pd.notna(row.get("backend_version")) else None, gpu)
    kv = choose_kv_blocks(model.name, gpu, tp, d["block_size"], d["gpu_memory_utilization"],
                          d["max_num_batched_tokens"], d["max_num_seqs"], pp=pp)
    cm, cm_info = cost_model_config(opts.cost_model, model.name, gpu, tp, cpu_overhead_preset(opts.cpu_overhead))
    cfg = SimConfig(
        hardware=HardwareConfig(model=model.name, gpu=gpu, tp=tp, pp=pp, gpu_memory_utilization=d["gpu_memory_utilization"]),
        scheduler=SchedulerConfig(max_num_seqs=d["max_num_seqs"], max_num_batched_tokens=d["max_num_batched_tokens"],
                                  max_model_len=model.max_position_embeddings,
                                  enable_chunked_prefill=d["enable_chunked_prefill"],
                                  async_scheduling=d["async_scheduling"]),
        cache=CacheConfig(block_size=d["block_size"], num_gpu_blocks=kv.num_gpu_blocks,
                          enable_prefix_caching=d["enable_prefix_caching"]),
        derive_num_gpu_blocks=False, cost_model=cm)
    return cfg, {"settings": d, "kv_cache": kv.to_dict(), "cost_model": cm_info.get("file", cm_info["name"])}


def request_cycle_s(cfg: SimConfig, isl: int, osl: int, concurrency: int) -> float:
    """Cost-model estimate of one request's latency at this concurrency (for client offsets)."""
    from servesim.simulator.cost_model import StepShape, run_cost_model

    cm = run_cost_model(cfg)
    cpu = cfg.cost_model.cpu_overhead
    budget = cfg.scheduler.max_num_batched_tokens
    prefill = 0.0
    for start in range(0, isl, budget):  # chunked prefill of one prompt
        n = min(budget, isl - start)
        prefill += cm.step_time_s(StepShape((n,), (start,), 1)) + cpu.step_s(1, n)
    ctx = isl + osl // 2
    decode = cm.step_time_s(StepShape((1,) * concurrency, (ctx,) * concurrency, concurrency)) \
        + cpu.step_s(concurrency, concurrency)
    return prefill + max(osl - 1, 0) * decode


def _means(req: pd.DataFrame, ids: set[str] | None) -> tuple[float, float]:
    sub = req if ids is None else req[req["request_id"].isin(ids)]
    return float(sub["ttft_s"].mean()), float(sub["tpot_s"].mean())


def run_row(row: pd.Series, opts: ClosedLoopOptions) -> dict:
    base = {"id": str(row["id"]) if "id" in row and pd.notna(row["id"]) else None,
            "model": row["model_path"], "precision": row["precision"], "system": row["system"],
            "backend_version": None if pd.isna(row.get("backend_version")) else str(row["backend_version"]),
            "tp": int(row["tp_size"]), "isl": int(row["isl"]), "osl": int(row["osl"]),
            "concurrency": int(row["batch_size"]),
            "measured_ttft_ms": float(row["silicon_ttft_ms"]), "measured_tpot_ms": float(row["silicon_tpot_ms"])}
    if row["precision"] not in PRECISION_FORMATS:
        return {**base, "status": f"unsupported: {row['precision']} weights"}
    try:
        cfg, info = row_config(row, opts)
    except InputError as exc:
        return {**base, "status": f"unsupported: {exc}"}
    cl = ClosedLoopConfig(num_clients=base["concurrency"], prompt_len=base["isl"], output_len=base["osl"],
                          requests_per_client=opts.requests_per_client,
                          warmup_requests_per_client=opts.warmup_requests_per_client)
    t0 = time.perf_counter()
    if opts.stagger in ("random", "cycle"):
        cycle = request_cycle_s(cfg, cl.prompt_len, cl.output_len, cl.num_clients)
        if opts.stagger == "cycle":
            offsets = [c * cycle / cl.num_clients for c in range(cl.num_clients)]
        else:
            rng = np.random.default_rng(opts.seed)
            offsets = sorted(float(x) for x in rng.uniform(0.0, cycle, cl.num_clients))
        res = run_closed_loop(cfg, cl, offsets)
        eng, measured_ids = res.engine, res.measured_ids
    elif opts.stagger == "none":
        res = run_closed_loop(cfg, cl)
        eng, measured_ids = res.engine, res.measured_ids
    else:
        raise InputError(f"unknown stagger {opts.stagger!r}", field="stagger", allowed="random, cycle, none")
    req = eng.metrics.requests_frame()
    ttft_s, tpot_s = _means(req, set(measured_ids))
    ttft_a, tpot_a = _means(req, None)
    steps = eng.metrics.steps_frame()
    out = {**base, "status": "ok",
           "sim_ttft_ms": 1e3 * ttft_s, "sim_tpot_ms": 1e3 * tpot_s,
           "sim_ttft_ms_all": 1e3 * ttft_a, "sim_tpot_ms_all": 1e3 * tpot_a,
           "num_gpu_blocks": info["kv_cache"]["num_gpu_blocks"],
           "peak_kv_usage": float(steps["kv_usage"].max()) if len(steps) else 0.0,
           "num_preemptions": int(steps["num_preemptions"].sum()) if len(steps) else 0,
           "cost_model": info["cost_model"], "wall_s": time.perf_counter() - t0}
    for k in ("ttft", "tpot"):
        for suffix in ("", "_all"):
            sim, meas = out[f"sim_{k}_ms{suffix}"], base[f"measured_{k}_ms"]
            out[f"{k}_error{suffix}"] = (sim - meas) / meas if meas else None
    return out


def summarize_rows(rows: list[dict]) -> dict:
    ok = [r for r in rows if r["status"] == "ok"]

    def agg(key: str, subset: list[dict]) -> dict:
        e = np.array([abs(r[key]) for r in subset if r.get(key) is not None and math.isfinite(r[key])])
        s = np.array([r[key] for r in subset if r.get(key) is not None and math.isfinite(r[key])])
        return {"mape": float(e.mean()) if e.size else None, "median_ape": float(np.median(e)) if e.size else None,
                "median_signed": float(np.median(s)) if s.size else None, "n": int(e.size)}

    groups: dict = {}
    for r in ok:
        groups.setdefault(f"{r['model']} tp{r['tp']}", []).append(r)
    return {
        "num_rows": len(rows), "num_ok": len(ok),
        "num_unsupported": len(rows) - len(ok),
        "unsupported_reasons": sorted({r["status"] for r in rows if r["status"] != "ok"}),
        "overall": {k: agg(k, ok) for k in ("ttft_error", "tpot_error", "ttft_error_all", "tpot_error_all")},
        "by_group": {g: {k: agg(k, rs) for k in ("ttft_error", "tpot_error")} for g, rs in sorted(groups.items())},
        "kv_bound_rows": {k: agg(k, [r for r in ok if r["peak_kv_usage"] >= 0.95])
                          for k in ("ttft_error", "tpot_error")},
        "not_kv_bound_rows": {k: agg(k, [r for r in ok if r["peak_kv_usage"] < 0.95])
                              for k in ("ttft_error", "tpot_error")},
    }


def closed_loop_results(rows: pd.DataFrame, opts: ClosedLoopOptions | None = None, progress=None) -> dict:
    """Simulate each silicon row closed-loop and compare (servesim.validation_report writes the
    result folder and its page)."""
    opts = opts or ClosedLoopOptions()
    results = []
    for i, (_, row) in enumerate(rows.iterrows()):
        results.append(run_row(row, opts))
        if progress is not None:
            progress(i + 1, len(rows), results[-1])
    report = {"format": "servesim-closed-loop-validation", "version": 1,
              "options": {"requests_per_client": opts.requests_per_client,
                          "warmup_requests_per_client": opts.warmup_requests_per_client,
                          "cost_model": opts.cost_model, "cpu_overhead": opts.cpu_overhead,
                          "stagger": opts.stagger, "seed": opts.seed},
              "summary": summarize_rows(results), "rows": results}
    return report
