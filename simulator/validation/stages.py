"""Per-stage validation against runs measured by a benchmark client (aggregates per load stage).

Some real runs publish only aggregate client metrics per load stage (inference-perf over HTTP), not
per-request timings: ``../shared/data/benchmarks/blis_h100_trainval`` holds 13 such H100 runs. For
each run we rebuild the client's workload (``traces.bench``: inference-perf's shared_prefix profile
with its constant-rate stages), replay it with the run's engine settings and the recorded KV pool,
put the OpenAI frontend and the client model in front when the run was measured over HTTP, and
compare the same statistics per stage with the same rules (``simulator.bench_metrics``).

The measured numbers are read from ``../shared`` at run time and never copied into the project
(their source repository has no licence). Nothing measured end to end configures the simulator.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from scheduler.config import CacheConfig, SchedulerConfig
from simulator.bench_metrics import inference_perf_stages
from simulator.config import ClientConfig, HardwareConfig, SimConfig
from simulator.engine import Engine
from simulator.frontend import FrontendConfig
from simulator.specs import resolve_gpu, resolve_model
from traces.bench import BenchConfig, StageConfig, bench_workload
from traces.errors import InputError

from .cpu import cpu_overhead_preset
from .replay import cost_model_config

CONFIGS_FILE = "blis_trainval15_experiment_configs.json"
METRICS_FILE = "blis_trainval15_actual_metrics.csv"
# Measured statistic (ms) -> our inference-perf name (ms).
COMPARED = {"ttft_mean_ms": "mean_time_to_first_token_ms", "ttft_p90_ms": "p90_time_to_first_token_ms",
            "ttft_p99_ms": "p99_time_to_first_token_ms", "itl_mean_ms": "tpot_of_means_ms",
            "e2e_mean_ms": "mean_request_latency_ms", "e2e_p90_ms": "p90_request_latency_ms",
            "e2e_p99_ms": "p99_request_latency_ms"}
# The README: observed prompts are system prompt + question + about 25 tokens of chat template.
CHAT_TEMPLATE_TOKENS = 25
BLIS_VLLM_VERSION = (0, 15, 1)  # async scheduling on by default from 0.14


@dataclass(slots=True)
class StagedRun:
    """One measured run: its engine settings, the client's workload and per-stage targets."""

    name: str
    model: str
    precision: str
    tp: int
    max_num_seqs: int
    max_num_batched_tokens: int
    num_gpu_blocks: int
    max_model_len: int
    bench: BenchConfig
    targets: pd.DataFrame  # one row per stage ("stage_0", ...): the measured statistics (ms)


def load_staged_runs(folder: str | Path) -> list[StagedRun]:
    """The runs of a BLIS-style folder (experiment configs + per-stage metrics)."""
    folder = Path(folder)
    cfg_path, met_path = folder / CONFIGS_FILE, folder / METRICS_FILE
    for path in (cfg_path, met_path):
        if not path.is_file():
            raise InputError(f"{path}: not found", field="run folder",
                             allowed=f"a folder with {CONFIGS_FILE} and {METRICS_FILE}")
    experiments = {str(e["id"]): e for e in json.loads(cfg_path.read_text())["experiments"]}
    metrics = pd.read_csv(met_path)
    runs = []
    for name, rows in metrics.groupby("experiment", sort=False):
        # Runs are named "<config id>-<model>-..."; ids are short numbers or dated stamps.
        ids = [i for i in experiments if str(name).startswith(i + "-")]
        exp = experiments[max(ids, key=len)] if ids else None
        if exp is None:
            continue  # a measured run whose configuration is not published
        stages = rows[rows["stage"] != "summary"].sort_values("stage").reset_index(drop=True)
        runs.append(_staged_run(str(name), exp, rows.iloc[0], stages))
    return runs


def _staged_run(name: str, exp: dict, row: pd.Series, stages: pd.DataFrame) -> StagedRun:
    wl = exp["workload"]["inference_perf"]
    sp = wl["shared_prefix"]
    bench = BenchConfig(dataset_name="shared_prefix", num_prompts=int(exp["workload"]["num_requests"]),
                        num_groups=int(sp["num_unique_system_prompts"]),
                        users_per_group=int(sp["num_users_per_system_prompt"]),
                        system_prompt_len=int(sp["system_prompt_len"]),
                        question_len=int(sp["question_len"]) + CHAT_TEMPLATE_TOKENS,
                        output_len=int(sp["output_len"]),
                        stages=tuple(StageConfig(float(s["duration"]), float(s["rate"])) for s in wl["stages"]),
                        stage_load="constant", seed=int(exp["workload"].get("seed", 0)))
    return StagedRun(name=name, model=str(exp["model"]), precision=str(row["precision"]), tp=int(exp["tp"]),
                     max_num_seqs=int(exp["max_num_seqs"]), max_num_batched_tokens=int(exp["max_num_batched_tokens"]),
                     num_gpu_blocks=int(exp["total_kv_blocks"]), max_model_len=4096, bench=bench, targets=stages)


@dataclass(slots=True)
class StageOptions:
    cost_model: str = "roofline"  # roofline | calibrated | a fitted .json file
    cpu_overhead: str = "calibrated"
    frontend: bool = True  # the runs were measured over HTTP
    client_timeout_s: float | None = None  # the client's timeout, when the run's harness had one
    max_requests: int | None = None  # a prefix of the workload (smoke runs)
    seed: int = 0


def build_stage_config(run: StagedRun, opts: StageOptions) -> SimConfig:
    spec = resolve_model(run.model)
    gpu = resolve_gpu("h100").name
    cpu = cpu_overhead_preset(opts.cpu_overhead)
    cm, _ = cost_model_config(opts.cost_model, spec.name, gpu, run.tp, cpu)
    sched = SchedulerConfig(max_num_seqs=run.max_num_seqs, max_num_batched_tokens=run.max_num_batched_tokens,
                            max_model_len=run.max_model_len, async_scheduling=True)
    return SimConfig(hardware=HardwareConfig(model=spec.name, gpu=gpu, tp=run.tp), scheduler=sched,
                     cache=CacheConfig(block_size=16, num_gpu_blocks=run.num_gpu_blocks),
                     derive_num_gpu_blocks=False, cost_model=cm, seed=opts.seed,
                     frontend=FrontendConfig(enabled=opts.frontend),
                     client=ClientConfig(timeout_s=opts.client_timeout_s))


def compare_run(run: StagedRun, opts: StageOptions) -> pd.DataFrame:
    """Simulate the run and compare per stage: one row per (stage, statistic)."""
    bench = run.bench if opts.max_requests is None else replace(run.bench, num_prompts=opts.max_requests)
    wl = bench_workload(bench)
    res = Engine(build_stage_config(run, opts), wl).run()
    req = res.metrics.requests_frame()
    bounds, start = [], 0.0
    for stage in bench.stages:
        bounds.append((start, start + stage.duration_s))
        start += stage.duration_s
    sim = inference_perf_stages(req, bounds, percentiles=(50, 90, 99))
    rows = []
    for i, target in run.targets.iterrows():
        if i >= len(sim) or sim[i]["completed"] == 0:
            continue
        got = dict(sim[i])
        # The runs' ITL is (E2E mean - TTFT mean) / (output mean - 1): compare the same construct.
        got["tpot_of_means_ms"] = ((got["mean_request_latency_ms"] - got["mean_time_to_first_token_ms"])
                                   / max(bench.output_len - 1, 1))
        for measured_key, sim_key in COMPARED.items():
            meas, value = float(target[measured_key]), got[sim_key]
            rows.append({"run": run.name, "model": run.model, "tp": run.tp, "stage": str(target["stage"]),
                         "metric": measured_key, "measured_ms": meas, "simulated_ms": value,
                         "rel_error": (value - meas) / meas if meas else np.nan,
                         "completed": got["completed"], "failed": got["failed"]})
    return pd.DataFrame(rows)


def markdown_table(errors: pd.DataFrame, metrics=("ttft_mean_ms", "itl_mean_ms", "e2e_mean_ms", "e2e_p90_ms")) -> str:
    """Signed relative error per (run, stage) for the chosen statistics."""
    if errors.empty:
        return "(no runs compared)\n"
    wide = errors.pivot_table(index=["run", "stage"], columns="metric", values="rel_error", sort=False)
    head = "| run | stage | " + " | ".join(m.replace("_ms", "") for m in metrics) + " |"
    lines = [head, "|" + "---|" * (len(metrics) + 2)]
    for (run, stage), row in wide.iterrows():
        cells = [f"{100 * row[m]:+.1f} %" if m in row and pd.notna(row[m]) else "-" for m in metrics]
        lines.append(f"| {run} | {stage} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
