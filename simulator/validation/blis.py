"""Runs of the ``blis_h100_trainval`` kind: per-load-stage aggregates of real vLLM runs.

    report = validate_blis("../shared/data/benchmarks/blis_h100_trainval", "61", ValidateOptions())

The folder holds ``blis_trainval15_experiment_configs.json`` (engine settings and the
inference-perf ``shared_prefix`` workload spec of every run) and
``blis_trainval15_actual_metrics.csv`` (measured TTFT / ITL / E2E mean and tails per stage). There
are no per-request rows, so the workload is rebuilt from its spec (documented in
docs/FIDELITY.md) and the simulator's per-stage statistics are compared with the measured ones.
The measured numbers are read from the folder at run time and never copied into the project
(their upstream repository has no licence).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from servesim.scheduler.config import CacheConfig, SchedulerConfig
from servesim.simulator.bench_metrics import completed_mask
from servesim.simulator.cost_model.cudagraph import default_capture_sizes
from servesim.simulator.config import ClientConfig, CostModelConfig, HardwareConfig, SimConfig
from servesim.simulator.build import build_engine
from servesim.simulator.frontend import FrontendConfig
from servesim.simulator.kv_offload import KvOffloadConfig
from servesim.simulator.sampling import SamplingConfig
from servesim.simulator.specs import resolve_gpu, resolve_model
from servesim.traces.bench import BenchConfig, StageConfig, bench_workload
from servesim.traces.errors import InputError
from servesim.traces.workload import Workload

from .cpu import cpu_overhead_preset
from .generation_defaults import generation_defaults
from .runs import vllm_defaults

CONFIGS = "blis_trainval15_experiment_configs.json"
METRICS = "blis_trainval15_actual_metrics.csv"
CHAT_TEMPLATE_TOKENS = 25  # README: observed prompts are system + question + ~25 tokens
MAX_MODEL_LEN = 4096  # README: every run served with max_model_len=4096
BLOCK_SIZE = 16  # README: block size 16 (the GPU KV blocks, and the units of cpu_kv_blocks)
STATS = ("ttft_mean", "ttft_p90", "ttft_p99", "itl_mean", "e2e_mean", "e2e_p90", "e2e_p99")


@dataclass(slots=True, frozen=True)
class BlisStage:
    duration_s: float
    rate_per_s: float


@dataclass(slots=True, frozen=True)
class BlisExperiment:
    id: str
    label: str  # the metrics file's experiment name
    model: str  # Hugging Face id as recorded
    gpu: str
    tp: int
    max_num_seqs: int
    max_num_batched_tokens: int
    num_gpu_blocks: int
    num_system_prompts: int
    users_per_system_prompt: int
    system_prompt_len: int
    question_len: int
    output_len: int
    stages: tuple[BlisStage, ...]
    engine_version: str = "0.15.1"
    cpu_kv_blocks: int = 0  # as recorded: the CPU tier in per-GPU blocks (0: no tier; cpu_tier_gib)


def is_blis_dir(path: str | Path) -> bool:
    path = Path(path)
    return (path / CONFIGS).is_file() and (path / METRICS).is_file()


def load_experiments(path: str | Path) -> list[BlisExperiment]:
    """The runs that have measured metrics (13 of the 15 configs)."""
    path = Path(path)
    raw = json.loads((path / CONFIGS).read_text())["experiments"]
    labels = sorted(pd.read_csv(path / METRICS)["experiment"].unique())
    out = []
    for e in raw:
        label = next((lab for lab in labels if lab.startswith(f"{e['id']}-")), None)
        if label is None:
            continue
        sp = e["workload"]["inference_perf"]["shared_prefix"]
        stages = tuple(BlisStage(float(s["duration"]), float(s["rate"]))
                       for s in e["workload"]["inference_perf"]["stages"])
        out.append(BlisExperiment(
            id=str(e["id"]), label=label, model=e["model"], gpu=resolve_gpu(e["hardware"]).name,
            tp=int(e["tp"]), max_num_seqs=int(e["max_num_seqs"]),
            max_num_batched_tokens=int(e["max_num_batched_tokens"]),
            num_gpu_blocks=int(e["total_kv_blocks"]),
            num_system_prompts=int(sp["num_unique_system_prompts"]),
            users_per_system_prompt=int(sp["num_users_per_system_prompt"]),
            system_prompt_len=int(sp["system_prompt_len"]), question_len=int(sp["question_len"]),
            output_len=int(sp["output_len"]), stages=stages, cpu_kv_blocks=int(e.get("cpu_kv_blocks") or 0)))
    return out


def find_experiment(path: str | Path, experiment: str) -> BlisExperiment:
    exps = load_experiments(path)
    for e in exps:
        if experiment in (e.id, e.label):
            return e
    raise InputError(f"no measured BLIS experiment {experiment!r}", field="--experiment",
                     allowed=", ".join(e.id for e in exps))


def blis_workload(exp: BlisExperiment) -> tuple[Workload, np.ndarray]:
    """inference-perf's shared_prefix profile (traces/bench.py): constant-rate arrivals per stage
    (1/rate apart); users take turns round-robin, each re-sending one fixed prompt (its group's
    shared system prompt + its own question), so repeat requests hit the prefix cache. Returns the
    workload and each request's stage index."""
    stages = tuple(StageConfig(st.duration_s, st.rate_per_s) for st in exp.stages)
    bench = BenchConfig(dataset_name="shared_prefix", num_prompts=sum(
                            int(round(st.duration_s * st.rate_per_s)) for st in exp.stages),
                        num_groups=exp.num_system_prompts, users_per_group=exp.users_per_system_prompt,
                        system_prompt_len=exp.system_prompt_len,
                        question_len=exp.question_len + CHAT_TEMPLATE_TOKENS, output_len=exp.output_len,
                        stages=stages, stage_load="constant")
    wl = bench_workload(bench)
    wl = Workload([replace(r, request_id=f"blis-{i}") for i, r in enumerate(wl.requests)],
                  name=f"blis-{exp.id}", source="inference-perf shared_prefix spec",
                  attribution="inference-sim/inference-sim testdata (Apache-2.0)")
    ends = np.cumsum([st.duration_s for st in exp.stages])
    stage_of = np.searchsorted(ends, [r.arrival_time_s for r in wl.requests], side="right")
    return wl, stage_of


def cpu_tier_gib(exp: BlisExperiment) -> int | None:
    """The run's `--kv-offloading-size` in GiB (None: no CPU tier).

    The runs record the tier as ``cpu_kv_blocks``: upstream (inference-sim's log extractor) divided
    the server log's ``cpu_bytes_to_use`` by ONE GPU's KV bytes per 16-token block, so the count is
    8 GiB // (kv_bytes_per_token(model, tp) x 16) for every run with a tier (two runs record one
    block fewer: an earlier extractor estimated the block's bytes from the GPU pool). The whole GiB
    is recovered here and checked against the model's KV layout; vLLM sizes the tier from it
    (simulator/kv_offload.py: CPUOffloadingSpec divides the bytes by the block's bytes over ALL
    tp ranks, so under TP the modelled tier is cpu_kv_blocks / tp blocks, not cpu_kv_blocks)."""
    if exp.cpu_kv_blocks <= 0:
        return None
    from servesim.simulator.specs import kv_bytes_per_token

    block_bytes = kv_bytes_per_token(resolve_model(exp.model), exp.tp) * BLOCK_SIZE  # one GPU's block
    gib = round(exp.cpu_kv_blocks * block_bytes / 2**30)
    whole = gib * 2**30 // block_bytes if gib > 0 else 0
    if not whole - 1 <= exp.cpu_kv_blocks <= whole:
        raise InputError(f"run {exp.id}: cpu_kv_blocks {exp.cpu_kv_blocks} is not a whole number of GiB of "
                         f"{exp.model}'s KV at tp={exp.tp} ({block_bytes} bytes per block per GPU)",
                         path=CONFIGS, field="cpu_kv_blocks", allowed=f"{whole - 1} or {whole} for {gib} GiB")
    return gib


def blis_config(exp: BlisExperiment, cost_model: str = "auto", cpu_overhead: str = "calibrated",
                frontend: bool = True, client_timeout_s: float | None = None,
                sampling: SamplingConfig | None = None, cpu_tier: bool = True) -> tuple[SimConfig, dict]:
    """The run's engine, and (measured over HTTP by inference-perf) the OpenAI frontend and the
    clients in front of it (docs/FRONTEND.md). inference-perf sends no sampling parameters, so the
    requests sample with the model's generation-config defaults (validation/generation_defaults.py)
    unless ``sampling`` says otherwise."""
    if sampling is None:
        sampling, sampling_source = generation_defaults(exp.model)
    else:
        sampling_source = "given"
    spec = resolve_model(exp.model)
    tier_gib = cpu_tier_gib(exp)  # the run's CPU KV tier, on unless cpu_tier=False (a comparison)
    defaults = vllm_defaults(exp.engine_version)
    name = cost_model
    if cost_model == "auto":  # the shipped fit where one exists for this deployment
        from servesim.simulator.cost_model.calibrated import find_calibrated

        name = "calibrated" if find_calibrated(spec.name, exp.gpu, exp.tp) else "roofline"
    # vLLM 0.15 serves with CUDA graphs (-O2): steps run padded to its default capture sizes for
    # this max_num_seqs / max_num_batched_tokens. Only the fitted models price the padding.
    graphs = default_capture_sizes(exp.max_num_seqs, exp.max_num_batched_tokens) \
        if name in ("calibrated", "profiled") else ()
    cm = CostModelConfig(name=name, cpu_overhead=cpu_overhead_preset(cpu_overhead),
                         params={"cudagraph_capture_sizes": list(graphs)} if graphs else {})
    cfg = SimConfig(
        hardware=HardwareConfig(model=spec.name, gpu=exp.gpu, tp=exp.tp),
        scheduler=SchedulerConfig(max_num_seqs=exp.max_num_seqs,
                                  max_num_batched_tokens=exp.max_num_batched_tokens,
                                  max_model_len=MAX_MODEL_LEN, enable_chunked_prefill=True,
                                  async_scheduling=bool(defaults["async_scheduling"][0])),
        cache=CacheConfig(block_size=BLOCK_SIZE, num_gpu_blocks=exp.num_gpu_blocks,
                          enable_prefix_caching=True),
        derive_num_gpu_blocks=False, cost_model=cm, frontend=FrontendConfig(enabled=frontend),
        client=ClientConfig(timeout_s=client_timeout_s), sampling=sampling,
        kv_offload=KvOffloadConfig(kv_offloading_size=tier_gib if cpu_tier else None))
    return cfg, {"cpu_kv_tier_gib": tier_gib if cpu_tier else None, "cpu_kv_tier_recorded_gib": tier_gib,
                 "model": spec.name, "weight_dtype": spec.weight_dtype, "gpu": exp.gpu,
                 "tp": exp.tp, "cost_model": name, "num_gpu_blocks": exp.num_gpu_blocks,
                 "cudagraph_max_size": graphs[-1] if graphs else None,
                 "frontend": frontend, "client_timeout_s": client_timeout_s,
                 "sampling": {"path": sampling.path, "source": sampling_source}}


def _with_overrides(cfg: SimConfig, info: dict, host: str | None,
                    sets: tuple[str, ...]) -> tuple[SimConfig, dict]:
    from servesim.simulator.config_values import apply_overrides, split_set_items
    from servesim.simulator.specs import host_for

    pairs = ({"hardware.host": host} if host is not None else {}) | split_set_items(list(sets))
    if not pairs:
        return cfg, info
    cfg = apply_overrides(cfg, pairs)
    info = {**info, "overrides": pairs,
            "host": host_for(cfg.hardware.gpu, cfg.hardware.host).name}
    return cfg, info


def _stats(req: pd.DataFrame) -> dict[str, float]:
    """The measured file's statistics over completed requests (failures carry no latencies)."""
    req = req[completed_mask(req)]
    ttft, e2e = req["ttft_s"].to_numpy(float) * 1e3, req["e2e_s"].to_numpy(float) * 1e3
    out_len = req["output_len"].to_numpy(float)
    itl = (e2e.mean() - ttft.mean()) / max(out_len.mean() - 1.0, 1.0)  # as the metrics file defines
    return {"ttft_mean": ttft.mean(), "ttft_p90": np.percentile(ttft, 90),
            "ttft_p99": np.percentile(ttft, 99), "itl_mean": itl, "e2e_mean": e2e.mean(),
            "e2e_p90": np.percentile(e2e, 90), "e2e_p99": np.percentile(e2e, 99)}


def validate_blis(path: str | Path, experiment: str, cost_model: str = "auto",
                  cpu_overhead: str = "calibrated", frontend: bool = True,
                  client_timeout_s: float | None = None, sampling: SamplingConfig | None = None,
                  host: str | None = None, sets: tuple[str, ...] = (), cpu_tier: bool = True) -> dict:
    """Simulate one BLIS run and compare every measured stage (and the summary row). ``host``
    and ``sets`` (``--host``, ``--set KEY=VALUE``) apply on top of the config rebuilt from the run,
    with replay's keys and checks; the report lists them under ``settings.overrides``."""
    exp = find_experiment(path, experiment)
    wl, stage_of = blis_workload(exp)
    cfg, info = blis_config(exp, cost_model, cpu_overhead, frontend, client_timeout_s, sampling, cpu_tier)
    cfg, info = _with_overrides(cfg, info, host, sets)
    res = build_engine(cfg, wl).run()
    req = res.metrics.requests_frame().set_index("request_id")
    req = req.loc[[r.request_id for r in wl.requests]]  # workload order, so stage_of lines up
    measured = pd.read_csv(Path(path) / METRICS)
    measured = measured[measured["experiment"] == exp.label].set_index("stage")
    stages = {}
    for stage in measured.index:
        sel = req if stage == "summary" else req[stage_of == int(stage.split("_")[1])]
        sim = _stats(sel)
        meas = {k: float(measured.loc[stage, f"{k}_ms"]) for k in STATS}
        stages[stage] = {k: {"measured_ms": meas[k], "simulated_ms": float(sim[k]),
                             "error": float(sim[k] / meas[k] - 1.0)} for k in STATS}
        stages[stage]["requests"] = {"completed": int(completed_mask(sel).sum()),
                                     "failed": int(len(sel) - completed_mask(sel).sum())}
    notes = ["TTFT measured over HTTP by inference-perf includes the OpenAI server: the frontend model is "
             + ("on (default frontend costs, docs/FRONTEND.md)" if frontend else "off (--no-frontend)")]
    if "reasoning" in exp.label:
        notes.append("a 'reasoning' profile: the real clients timed out and the server aborted their requests; "
                     "the run publishes neither the timeout nor the failure count "
                     + (f"(client timeout modelled: {client_timeout_s:g} s)" if client_timeout_s
                        else "(no client timeout modelled: --client-timeout-s to add one)"))
    if info["cpu_kv_tier_recorded_gib"] is not None:
        notes.append(f"the run served with a {info['cpu_kv_tier_recorded_gib']} GiB CPU KV tier (vLLM's "
                     "OffloadingConnector): " + ("modelled (--no-cpu-kv-tier to compare without it)"
                                                 if cfg.kv_offload.enabled else "NOT modelled (--no-cpu-kv-tier)"))
    return {"format": "servesim-validation-blis", "version": 1, "experiment": exp.label,
            "settings": info, "num_requests": len(wl.requests), "stages": stages, "notes": notes,
            "prefix_cache": {"hit_tokens": res.prefix_hits, "query_tokens": res.prefix_queries,
                             "hit_rate": res.prefix_hits / res.prefix_queries if res.prefix_queries else 0.0},
            "kv_offload": res.kv_offload.summary() if res.kv_offload is not None else None,
            "simulation": {"num_steps": res.num_steps, "wall_time_s": res.wall_time_s}}


def format_blis_report(rep: dict) -> str:
    """Per-stage table for the CLI: measured / simulated ms and the signed error."""
    s = rep["settings"]
    lines = [f"{rep['experiment']}: {rep['num_requests']} requests; {s['model']} ({s['weight_dtype']}) "
             f"on {s['gpu']} tp={s['tp']}; cost model {s['cost_model']}; KV {s['num_gpu_blocks']} blocks; "
             f"sampler path {s['sampling']['path']} ({s['sampling']['source']})",
             f"{'stage':<9}{'metric':<10}{'measured':>11}{'simulated':>11}{'error':>8}"]
    for stage, stats in rep["stages"].items():
        for k in ("ttft_mean", "itl_mean", "e2e_mean", "e2e_p90"):
            v = stats[k]
            lines.append(f"{stage:<9}{k:<10}{v['measured_ms']:>11.1f}{v['simulated_ms']:>11.1f}"
                         f"{100 * v['error']:>+7.1f}%")
    from servesim.simulator.kv_offload_report import summary_line

    pc = rep.get("prefix_cache")
    if pc is not None:
        lines.append(f"GPU prefix cache: {pc['hit_tokens']} hit tokens of {pc['query_tokens']} "
                     f"({100 * pc['hit_rate']:.1f} %)")
    tier = summary_line(rep)
    if tier is not None:
        lines.append(tier)
    lines += [f"note: {n}" for n in rep["notes"]]
    return "\n".join(lines)
