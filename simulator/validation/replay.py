"""Replay a measured run in the simulator and compare, request by request.

    cmp = compare_run(RUN_DIR, WORKLOAD, ValidateOptions())   # cmp.report is validation.json
    (servesim.validation_report.validate_run also writes the result folder and its page)

The simulated engine gets the run's recorded settings (``MeasuredRun.settings``; vLLM's defaults
for what the run does not record, each labelled in ``report["settings"]["provenance"]``), the KV
pool from ``kv.choose_kv_blocks`` and the workload's own arrivals and token ids. Nothing measured
end to end is used to configure or tune the simulator.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from servesim.scheduler.config import CacheConfig, SchedulerConfig
from servesim.simulator.config import CostModelConfig, HardwareConfig, SimConfig
from servesim.simulator.build import build_engine
from servesim.simulator.frontend import FrontendConfig
from servesim.simulator.sampling import SamplingConfig
from servesim.simulator.cost_model.table_versions import (DEFAULT_ENGINE_VERSION, MeasuredTable, path_engine_versions,
                                                          version_warnings)
from servesim.simulator.specs import default_host, host_for, resolve_gpu, resolve_model, with_precision
from servesim.simulator.specs.models import resolve_model_id
from servesim.traces.errors import InputError
from servesim.traces.formats import load_workload

from .compare import aggregate_errors, makespan, pair_requests, per_request_errors, timeseries_errors
from .cpu import CALIBRATION_NOTE, cpu_overhead_preset
from .kv import choose_kv_blocks
from .match import check_workload_matches
from .runs import MeasuredRun, load_run, parse_version, to_measured_convention

TARGETS = {"e2e_median_ape": 0.05, "ttft_median_ape": 0.10}


@dataclass(slots=True)
class ValidateOptions:
    cost_model: str = "calibrated"  # calibrated | roofline | a fitted .json file
    model: str | None = None  # overrides the run's model: an id, alias or a config.json path
    gpu: str | None = None  # when the run does not record its device
    num_gpu_blocks: int | None = None  # when the run does not record its KV pool
    cpu_overhead: str = "calibrated"  # calibrated | default | zero (simulator/validation/cpu.py)
    skew_alpha: float | None = None  # None: the profile's measured decode-skew factor; 0 = off
    async_scheduling: bool | None = None  # None: what the run's vLLM version does by default
    frontend: bool | None = None  # None: on when the run was measured over HTTP (MeasuredRun.measured_at)
    run_format: str = "auto"
    workload_format: str = "auto"
    seed: int = 0
    plots: bool = True
    # The requests' sampling (its sampler path is priced, simulator/sampling.py); None: vLLM's
    # neutral parameters (no path priced; a temperature-0 client such as `vllm bench serve`
    # samples greedily, which prices the same).
    sampling: SamplingConfig | None = None
    host: str | None = None  # the machine (specs/hosts.yaml) instead of the run's / the GPU's default
    # `--set KEY=VALUE` items applied on top of the config built from the run (replay's keys)
    sets: tuple[str, ...] = ()


def cost_model_config(name: str, model: str, gpu: str, tp: int, cpu,
                      skew_alpha: float | None = None) -> tuple[CostModelConfig, dict]:
    """The cost-model section for a replay, and what it is (file, fit error) for the report.

    ``calibrated`` without a shipped fit for (model, gpu, tp) falls back to the roofline, given or
    defaulted alike: the report's ``fallback`` says from what, to what and why (print it with
    :func:`fallback_warning`). A fitted ``.json`` that is not there is an error."""
    skew = {} if skew_alpha is None else {"skew_alpha": skew_alpha}
    if skew and name not in ("calibrated", "roofline") and not name.endswith(".json"):
        raise InputError(f"--skew-alpha applies to the calibrated, roofline or a fitted cost model, not {name!r}",
                         field="--skew-alpha")
    if name == "calibrated":
        from servesim.simulator.cost_model.calibrated import available_calibrated, find_calibrated

        path = find_calibrated(model, gpu, tp)
        if path is None:
            have = "; ".join(f"{e['model']} {e['gpu']} tp={e['tp']}" for e in available_calibrated()
                             if e["model"] == model or e["gpu"] == gpu) or "none for this model or GPU"
            reason = f"no calibrated fit for {model} on {gpu} tp={tp} (fits: {have})"
            return fallback_to_roofline(CostModelConfig(name="calibrated", params=skew, cpu_overhead=cpu),
                                        {"name": "calibrated"}, reason)
        entry = next(e for e in available_calibrated() if e["file"] == path.name)
        info = {"name": "calibrated", "file": f"simulator/cost_model/calibrated/{path.name}",
                "profiles": entry["profiles"], "frameworks": entry["frameworks"],
                "fit_error_holdout": {op: e["mape_holdout"] for op, e in entry["fit_error"].items()},
                "roofline_filled_ops": [op for op, e in entry["fit_error"].items() if e["origin"] == "roofline"]}
        return CostModelConfig(name="calibrated", params=skew, cpu_overhead=cpu), info
    if name.endswith(".json"):
        if not Path(name).is_file():
            raise InputError("fitted cost model file not found", path=name, field="--cost-model",
                             allowed="calibrated, roofline, or an existing fitted .json (servesim fit)")
        return CostModelConfig(name="profiled", params={"path": name, **skew}, cpu_overhead=cpu), \
            {"name": "profiled", "file": name, **skew}
    return CostModelConfig(name=name, params=skew, cpu_overhead=cpu), {"name": name}


def fallback_to_roofline(cm: CostModelConfig, info: dict, reason: str) -> tuple[CostModelConfig, dict]:
    """The roofline in place of ``cm`` (its CPU overhead kept), with the report's ``fallback``:
    ``{from, to, reason}``. A roofline stays as it is; a given ``skew_alpha`` goes with it (the
    roofline prices the decodes' imbalance too), no other parameter does."""
    if cm.name == "roofline":
        return cm, info
    skew = {k: v for k, v in cm.params.items() if k == "skew_alpha"}
    return CostModelConfig(name="roofline", params=skew, cpu_overhead=cm.cpu_overhead), \
        {"name": "roofline", "fallback": {"from": info.get("name", cm.name), "to": "roofline", "reason": reason}}


def fallback_warning(info: dict) -> str | None:
    """The one-line warning for a cost-model fallback (``info``: the report's cost_model), or None."""
    fb = info.get("fallback")
    return None if fb is None else f"cost model {fb['from']} -> {fb['to']}: {fb['reason']}"


def run_model_spec(s, model: str | None = None):
    """The served model: the run's (or ``--model``'s) spec with the run's weight quantization and
    KV-cache dtype (fp8 weights / fp8 KV are modelled, see simulator/specs/precision.py)."""
    if str(s.dtype).lower() not in ("bfloat16", "bf16", "float16", "fp16", "half", "auto", "float32"):
        raise InputError(f"the run used activation dtype={s.dtype}", field="dtype",
                         allowed="bfloat16, float16, auto")
    return with_precision(resolve_model(model or s.model), s.quantization, s.kv_cache_dtype)


def build_config(run: MeasuredRun, opts: ValidateOptions) -> tuple[SimConfig, dict]:
    s = run.settings
    gpu_name = opts.gpu or s.gpu
    if not gpu_name:
        raise InputError("the run does not record its GPU", field="--gpu",
                         allowed="a GPU id or alias, e.g. --gpu rtx-pro-6000")
    gpu = resolve_gpu(gpu_name).name
    spec = run_model_spec(s, opts.model)
    max_model_len = int(s.max_model_len or spec.max_position_embeddings)
    kv = choose_kv_blocks(spec.name, gpu, s.tp, s.block_size, s.gpu_memory_utilization,
                          s.max_num_batched_tokens, s.max_num_seqs, recorded=s.num_gpu_blocks,
                          given=opts.num_gpu_blocks, pp=s.pp, data_parallel_size=s.data_parallel_size)
    async_on = s.async_scheduling if opts.async_scheduling is None else opts.async_scheduling
    cpu = cpu_overhead_preset(opts.cpu_overhead)
    cm, cm_info = cost_model_config(opts.cost_model, spec.name, gpu, s.tp, cpu, opts.skew_alpha)
    if spec.is_moe and (s.enable_expert_parallel or s.data_parallel_size > 1):
        # priced nowhere else (dp_cluster_config costs DP MoE ranks with the roofline too): the
        # roofline, with the reason, rather than drop the run's setting
        cm, cm_info = fallback_to_roofline(cm, cm_info, (
            f"the run used {'expert' if s.enable_expert_parallel else 'data'} parallelism ({spec.name}, TP {s.tp}, "
            f"DP {s.data_parallel_size}), which only the roofline cost model prices (its MoE kernels and all-to-all)"))
    if s.enable_expert_parallel and spec.is_moe and s.data_parallel_size <= 1:
        cm.params["expert_parallel_size"] = s.tp  # experts split over the TP ranks
    if s.data_parallel_size > 1 and spec.is_moe and cm.name == "roofline":
        cm.params["all2all_backend"] = s.all2all_backend  # the DP ranks' dispatch/combine (moe_comm.py)
    sched = SchedulerConfig(max_num_seqs=s.max_num_seqs, max_num_batched_tokens=s.max_num_batched_tokens,
                            max_model_len=max_model_len, enable_chunked_prefill=s.enable_chunked_prefill,
                            async_scheduling=async_on)
    cache = CacheConfig(block_size=s.block_size, num_gpu_blocks=kv.num_gpu_blocks,
                        enable_prefix_caching=s.enable_prefix_caching)
    cfg = SimConfig(hardware=HardwareConfig(model=spec.name, gpu=gpu, tp=s.tp, pp=s.pp,
                                            gpu_memory_utilization=s.gpu_memory_utilization,
                                            host=opts.host or s.host,
                                            disable_custom_all_reduce=s.disable_custom_all_reduce),
                    scheduler=sched, cache=cache, derive_num_gpu_blocks=False, cost_model=cm, seed=opts.seed,
                    frontend=FrontendConfig(enabled=_frontend_on(run, opts)),
                    sampling=opts.sampling or SamplingConfig(),
                    engine_version=s.engine_version if parse_version(s.engine_version) else DEFAULT_ENGINE_VERSION)
    resolution = resolve_model_id(opts.model or s.model)
    warnings = [w for w in (fallback_warning(cm_info), resolution.caveat) if w]
    version_notes, moe_source = priced_by(cfg, cm_info, s)
    warnings += version_notes
    if moe_source is not None:
        cm_info = {**cm_info, "moe_experts": moe_source}  # which path priced the routed experts
    prov = dict(s.provenance)
    prov["gpu"] = prov.get("gpu", "given (--gpu)") if not opts.gpu else "given (--gpu)"
    if opts.async_scheduling is not None:
        prov["async_scheduling"] = "given (--async-scheduling/--no-async-scheduling)"
    prov["num_gpu_blocks"] = {"recorded": "recorded by the run", "given": "given (--num-gpu-blocks)",
                              "derived": "derived from GPU memory (see kv_cache)"}[kv.source]
    prov["host"] = "given (--host)" if opts.host else \
        prov.get("host", f"default: the GPU's default host ({default_host(gpu).name})")
    prov.setdefault("disable_custom_all_reduce", f"default: vLLM {s.engine_version or '?'} default (false)")
    info = {
        "settings": {"model": spec.name, "model_id": opts.model or s.model, "model_resolution": resolution.how,
                     "gpu": gpu, "tp": s.tp, "pp": s.pp, "weight_dtype": spec.weight_dtype,
                     "kv_cache_dtype": spec.kv_cache_dtype, "max_num_seqs": s.max_num_seqs,
                     "max_num_batched_tokens": s.max_num_batched_tokens, "max_model_len": max_model_len,
                     "block_size": s.block_size, "num_gpu_blocks": kv.num_gpu_blocks,
                     "enable_prefix_caching": s.enable_prefix_caching,
                     "enable_chunked_prefill": s.enable_chunked_prefill, "async_scheduling": async_on,
                     "gpu_memory_utilization": s.gpu_memory_utilization, "engine_version": s.engine_version,
                     "host": host_for(gpu, cfg.hardware.host).name,
                     "disable_custom_all_reduce": s.disable_custom_all_reduce, "provenance": prov},
        "kv_cache": kv.to_dict(),
        "frontend": {"enabled": _frontend_on(run, opts),
                     "why": "given (--frontend/--no-frontend)" if opts.frontend is not None
                     else f"latencies measured at the {run.measured_at} (docs/FRONTEND.md)"},
        "cost_model": cm_info,
        "sampling": {"path": cfg.sampling.path,
                     "source": "given (--sampling)" if opts.sampling is not None
                     else "vLLM's neutral parameters (the run records none)"},
        "cpu_overhead": {"preset": opts.cpu_overhead, **asdict(cpu),
                         **({"source": CALIBRATION_NOTE} if opts.cpu_overhead == "calibrated" else {})},
        "warnings": warnings,
    }
    if opts.sets:
        cfg = apply_validate_sets(cfg, info, opts.sets)
    info["collectives"] = collectives_info(cfg, info)
    return cfg, info


def apply_validate_sets(cfg: SimConfig, info: dict, sets: tuple[str, ...]) -> SimConfig:
    """``--set`` items on top of the config built from the run (replay's keys and checks); each key
    is recorded in the report's settings (a settings entry of the same name takes the value) and
    provenance as "given (--set)"."""
    from servesim.simulator.config_values import apply_overrides, split_set_items

    pairs = split_set_items(list(sets))
    cfg = apply_overrides(cfg, pairs)
    settings, prov = info["settings"], info["settings"]["provenance"]
    settings["overrides"] = dict(pairs)
    for key in pairs:
        value = cfg
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else getattr(value, part)
        prov[key] = "given (--set)"
        name = key.rsplit(".", 1)[-1]
        if name in settings and name not in ("provenance", "overrides"):
            settings[name], prov[name] = value, "given (--set)"
    if any(k.startswith("hardware.") for k in pairs):  # the host follows the GPU / host given
        settings["host"] = host_for(cfg.hardware.gpu, cfg.hardware.host).name
    return cfg


def collectives_info(cfg: SimConfig, info_of: dict) -> dict:
    """The host the TP collectives run on, vLLM's all-reduce path there, and what priced the
    all-reduce in the cost model the replay runs (validation.json). The decode-skew factor the
    model uses (cost_model/decode_skew.py) goes into ``info_of["cost_model"]`` on the way."""
    from servesim.simulator.cost_model import RooflineCostModel, run_cost_model
    from servesim.simulator.cost_model.collectives import custom_allreduce_rule
    from servesim.simulator.cost_model.fitted import FittedCostModel

    hw = cfg.hardware
    host = host_for(hw.gpu, hw.host)
    cm = run_cost_model(cfg)
    if isinstance(cm, (FittedCostModel, RooflineCostModel)):  # the decodes' imbalance factor in use
        cm_info = info_of["cost_model"]
        cm_info["skew_alpha"], cm_info["skew_alpha_source"] = cm.skew_alpha, cm.skew_alpha_source
    if isinstance(cm, FittedCostModel):
        used = cm.allreduce_source
    elif isinstance(cm, RooflineCostModel):
        used = cm.collectives.source.allreduce
    else:
        used = f"not reported by the {cm.name!r} cost model"
    return {"host": host.name, "p2p": host.p2p, "interconnect": host.interconnect,
            "disable_custom_all_reduce": hw.disable_custom_all_reduce,
            "custom_allreduce": custom_allreduce_rule(host, hw.tp, hw.disable_custom_all_reduce)[1],
            "allreduce": used, "host_sources": list(host.sources)}


def priced_by(cfg: SimConfig, cm_info: dict, s) -> tuple[list[str], str | None]:
    """(warnings for the measured tables pricing this replay whose engine version differs from the
    run's, cost_model/table_versions.py; what priced the MoE experts, or None): the calibrated
    fit's profile, or the roofline's kernel tables as one DP rank builds them."""
    if cfg.cost_model.name == "calibrated":
        tables = [MeasuredTable(f"calibrated fit {cm_info['file']}", v)
                  for v in path_engine_versions(cm_info.get("profiles", []))]
        return version_warnings(tables, s.engine, s.engine_version), None
    if cfg.cost_model.name != "roofline":
        return [], None
    from servesim.simulator.cost_model import run_cost_model

    rank = cfg
    if s.data_parallel_size > 1 and resolve_model(cfg.hardware.model).is_moe:
        from servesim.simulator.cluster.dp import dp_cluster_config

        rank = dp_cluster_config(cfg, s.data_parallel_size, expert_parallel=s.enable_expert_parallel).replicas[0].sim
    cm = run_cost_model(rank)
    moe = cm.moe_source if cm.model.is_moe else None
    return version_warnings(cm.measured_tables(), s.engine, s.engine_version), moe


def _frontend_on(run: MeasuredRun, opts: ValidateOptions) -> bool:
    return run.measured_at == "http" if opts.frontend is None else opts.frontend


def _clean(obj):
    """JSON-safe: NaN/inf -> None, numpy scalars -> Python."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, (np.floating, float)):
        v = float(obj)
        return v if math.isfinite(v) else None
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    return obj


def write_json_atomic(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(_clean(data), fh, indent=1)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass(slots=True)
class RunComparison:
    """A measured run against its replay: the report (validation.json) and the frames behind it."""

    report: dict
    paired: pd.DataFrame  # one row per measured request paired with its simulated twin
    measured_timeseries: pd.DataFrame | None
    simulated_timeseries: pd.DataFrame


def compare_run(run_dir: str | Path, workload: str | Path, opts: ValidateOptions | None = None) -> RunComparison:
    """Replay RUN_DIR's workload with its settings and compare (servesim.validation_report writes
    the result folder and its pages)."""
    opts = opts or ValidateOptions()
    run = load_run(run_dir, opts.run_format)
    wl = load_workload(workload, opts.workload_format)
    check_workload_matches(run, wl, str(workload))
    cfg, info = build_config(run, opts)
    for line in info["warnings"]:  # once per run, on stderr (and in validation.json "warnings")
        print(f"warning: {line}", file=sys.stderr)
    res, sim_req, sim_ts, steps = _simulate(cfg, wl, run.settings)
    paired, pairing = pair_requests(run.requests, sim_req, [r.request_id for r in wl.requests])
    if pairing["num_paired"] == 0:
        raise InputError("no measured request pairs with a simulated one", field="workload")
    peak_kv = float(steps["kv_usage"].max()) if len(steps) else 0.0
    info["kv_cache"].update({"peak_usage_simulated": peak_kv, "pool_was_binding": bool(peak_kv >= 0.95),
                             "num_preemptions_simulated": int(steps["num_preemptions"].sum()) if len(steps) else 0})
    per_req = per_request_errors(paired)
    report = {
        "format": "servesim-validation", "version": 1,
        "run": {"name": run.name, "path": str(run.path), "format": run.format, "notes": run.notes},
        "workload": {"path": str(workload), "num_requests": len(wl.requests)},
        **info,
        "pairing": pairing,
        "per_request": per_req,
        "aggregate": aggregate_errors(paired),
        "timeseries": timeseries_errors(run.timeseries, sim_ts),
        "makespan": makespan(paired),
        "targets": {**TARGETS, "e2e_met": _le(per_req["e2e"]["median_ape"], TARGETS["e2e_median_ape"]),
                    "ttft_met": _le(per_req["ttft"]["median_ape"], TARGETS["ttft_median_ape"])},
        "simulation": {"num_steps": len(steps), "wall_time_s": res.wall_time_s,
                       "sim_duration_s": float(sim_ts["t_s"].max()) if len(sim_ts) else 0.0,
                       "data_parallel_size": run.settings.data_parallel_size},
    }
    return RunComparison(_clean(report), paired, run.timeseries, sim_ts)


def _simulate(cfg: SimConfig, wl, s):
    """One engine, or ``data_parallel_size`` ranks behind vLLM's DP balancer (simulator/cluster/dp.py)."""
    if s.data_parallel_size <= 1:
        res = build_engine(cfg, wl).run()
        ts = to_measured_convention(res.metrics.timeseries_frame(res.sim_duration_s))
        return res, res.metrics.requests_frame(), ts, res.metrics.steps_frame()
    from servesim.simulator.cluster import run_cluster
    from servesim.simulator.cluster.dp import dp_cluster_config

    res = run_cluster(dp_cluster_config(cfg, s.data_parallel_size,
                                        expert_parallel=s.enable_expert_parallel, seed=cfg.seed), wl)
    ts = to_measured_convention(res.metrics.timeseries_frame(res.summary["sim_duration_s"]))
    return res, res.requests, ts, res.steps


def _le(value, limit) -> bool | None:
    return None if value is None else bool(value <= limit)
