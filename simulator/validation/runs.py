"""Measured serving runs: one in-memory form, read from several on-disk layouts by small adapters.

A ``MeasuredRun`` holds the engine settings the run used (with where each value came from), one
row per request with the measured latencies, and the 1-second state series when the run has one.

    run = load_run("/work/shared/data/benchmarks/llmservingsim_vllm_runs/RTXPRO6000_Llama-3.1-8B")
    run.settings.max_num_seqs, run.requests[["request_id", "ttft_s"]], run.timeseries

Adapters register by name (``@register_run_format(name, detect)``); ``load_run(path, fmt="auto")``
uses the first whose ``detect(path)`` is true. Built in:

* ``llmservingsim``: ``meta.json`` + ``requests.jsonl`` + ``timeseries.csv`` (LLMServingSim's
  vLLM benchmark harness, vLLM V1 ``RequestStateStats`` timestamps, engine monotonic clock).
* ``servesim``: a result folder written by ``servesim replay`` (``requests.parquet``,
  ``timeseries.csv``, ``config.yaml``), so a simulation can stand in for a measurement.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from servesim.scheduler.registry import Registry
from servesim.traces.errors import InputError, field_error

REQUEST_COLUMNS = ["request_id", "workload_index", "prompt_len", "output_len", "arrival_s",
                   "queueing_s", "ttft_s", "tpot_s", "e2e_s"]
SERIES = ("running", "waiting", "kv_cache_pct")


@dataclass(slots=True)
class EngineSettings:
    """The engine configuration of a measured run, and where each value came from."""

    model: str
    gpu: str | None = None  # device name as recorded (None: not recorded)
    tp: int = 1
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None  # None: the model's maximum
    block_size: int = 16
    num_gpu_blocks: int | None = None  # None: not recorded (derive it)
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    async_scheduling: bool = False
    gpu_memory_utilization: float = 0.9
    engine: str = "vllm"
    engine_version: str | None = None
    dtype: str = "bfloat16"
    quantization: str | None = None  # vLLM --quantization (None: the checkpoint's own format)
    kv_cache_dtype: str = "auto"  # vLLM --kv-cache-dtype
    data_parallel_size: int = 1
    pp: int = 1  # vLLM --pipeline-parallel-size
    enable_expert_parallel: bool = False
    all2all_backend: str = "allgather_reducescatter"  # vLLM --all2all-backend (0.19.1 default)
    host: str | None = None  # the machine (simulator/specs/hosts.yaml); None: the GPU's default host
    disable_custom_all_reduce: bool = False  # vLLM --disable-custom-all-reduce (its default: off)
    provenance: dict[str, str] = field(default_factory=dict)  # field -> "recorded" | "default: ..."


@dataclass(slots=True)
class MeasuredRun:
    name: str
    path: Path
    format: str
    settings: EngineSettings
    requests: pd.DataFrame  # REQUEST_COLUMNS; latencies in seconds
    timeseries: pd.DataFrame | None = None  # t_s + SERIES (+ throughput columns when known)
    notes: list[str] = field(default_factory=list)
    # Where the latencies were taken: "engine" (the engine's own request timestamps) or "http" (a
    # benchmark client over the OpenAI server: validate then puts the frontend model in front).
    measured_at: str = "engine"


# ---- registry -------------------------------------------------------------------------------
RunLoader = Callable[[Path], MeasuredRun]
RunDetector = Callable[[Path], bool]
# Built-ins (llmservingsim, servesim) are below; every module of simulator/validation/ is imported on
# the first lookup, so a new run format is one new file there.
RUN_FORMATS: Registry[tuple[RunDetector, RunLoader]] = Registry(
    "run format", plugins="servesim.simulator.validation", error=field_error("run_format"))


def register_run_format(name: str, detect: RunDetector) -> Callable[[RunLoader], RunLoader]:
    """Decorator: ``loader(path) -> MeasuredRun`` for run folders where ``detect(path)`` holds."""

    def wrap(loader: RunLoader) -> RunLoader:
        RUN_FORMATS.add(name, (detect, loader))
        return loader

    return wrap


def available_run_formats() -> list[str]:
    return RUN_FORMATS.names()


def detect_run_format(path: str | Path) -> str:
    """The one run format whose detector matches the folder (several or none: an InputError)."""
    path = Path(path)
    return RUN_FORMATS.detect(lambda _name, entry: entry[0](path), subject=f"run folder {path.name!r}",
                              explicit="--run-format NAME", error=field_error("run_format", path))


def load_run(path: str | Path, fmt: str = "auto") -> MeasuredRun:
    """Read a measured run folder through its adapter (``fmt="auto"`` detects the layout)."""
    path = Path(path)
    if not path.is_dir():
        raise InputError("run folder not found", path=str(path), field="run")
    name = detect_run_format(path) if fmt == "auto" else fmt
    return RUN_FORMATS.get(name, extra=("auto",))[1](path)


# ---- vLLM defaults by version ---------------------------------------------------------------
def parse_version(v: str | None) -> tuple[int, ...] | None:
    if not v:
        return None
    nums = re.findall(r"\d+", str(v))
    return tuple(int(x) for x in nums[:3]) if nums else None


def vllm_defaults(version: str | None) -> dict[str, tuple[object, str]]:
    """Engine defaults a run inherits when it does not record a value: {field: (value, why)}.

    vLLM V1: chunked prefill and prefix caching on, block size 16, gpu_memory_utilization 0.9.
    Async scheduling is the default from vLLM 0.14.0 on (release notes: "Async scheduling is now
    enabled by default"); before that it is off.
    """
    ver = parse_version(version)
    async_on = ver is not None and ver >= (0, 14)
    tag = f"vLLM {version or '?'} default"
    return {
        "enable_prefix_caching": (True, tag),
        "enable_chunked_prefill": (True, tag),
        "block_size": (16, tag),
        "gpu_memory_utilization": (0.9, tag),
        "async_scheduling": (async_on, f"{tag} (async scheduling default from 0.14.0)"),
    }


def _settings_from_kwargs(model: str, version: str | None, kw: dict, recorded_by: str) -> EngineSettings:
    s = EngineSettings(model=model, engine_version=version)
    prov = s.provenance
    for name, (value, why) in vllm_defaults(version).items():
        setattr(s, name, value)
        prov[name] = f"default: {why}"
    mapping = {"tensor_parallel_size": "tp", "max_num_seqs": "max_num_seqs",
               "max_num_batched_tokens": "max_num_batched_tokens", "max_model_len": "max_model_len",
               "block_size": "block_size", "enable_prefix_caching": "enable_prefix_caching",
               "enable_chunked_prefill": "enable_chunked_prefill", "async_scheduling": "async_scheduling",
               "gpu_memory_utilization": "gpu_memory_utilization", "num_gpu_blocks": "num_gpu_blocks",
               "dtype": "dtype", "quantization": "quantization", "kv_cache_dtype": "kv_cache_dtype",
               "data_parallel_size": "data_parallel_size", "pipeline_parallel_size": "pp",
               "enable_expert_parallel": "enable_expert_parallel", "all2all_backend": "all2all_backend",
               "disable_custom_all_reduce": "disable_custom_all_reduce"}
    for key, attr in mapping.items():
        if kw.get(key) is not None:
            setattr(s, attr, kw[key])
            prov[attr] = f"recorded ({recorded_by})"
    for attr in ("tp", "max_num_seqs", "max_num_batched_tokens", "max_model_len", "num_gpu_blocks"):
        prov.setdefault(attr, "default" if attr != "max_model_len" else "not recorded: the model's maximum")
    if s.num_gpu_blocks is None:
        prov["num_gpu_blocks"] = "not recorded"
    return s


# ---- llmservingsim ---------------------------------------------------------------------------
def _is_llmservingsim(path: Path) -> bool:
    return (path / "meta.json").is_file() and (path / "requests.jsonl").is_file()


def _trailing_int(s: str) -> int | None:
    m = re.search(r"(\d+)$", str(s))
    return int(m.group(1)) if m else None


def _gpu_from_folder(name: str) -> str | None:
    from servesim.simulator.specs import resolve_gpu

    head = name.split("_")[0]
    try:
        return resolve_gpu(head).name
    except (InputError, KeyError, ValueError):
        return None


# vLLM ParallelConfig fields a newer harness records under resolved_config.parallel_config
_PARALLEL_KEYS = ("disable_custom_all_reduce", "tensor_parallel_size", "data_parallel_size",
                  "enable_expert_parallel", "all2all_backend")
# LLMServingSim's bench machine for a GPU: (without P2P, with P2P). Its RTX PRO 6000 pair had no
# usable peer-to-peer in the April 2026 runs (ACS on): NCCL over host memory, measured at
# 16.37 GB/s and 16.1 us (configs/cluster/README.md); re-measured with ACS/IOMMU off on 2026-10-02
# (profiler/perf/RTXPRO6000/hardware.yaml). Both are hosts of simulator/specs/hosts.yaml.
_BENCH_HOSTS = {"rtx-pro-6000": ("rtx-pro-6000-workstation", "rtx-pro-6000-pcie-acs-off")}
_BENCH_HOST_WHY = "default: LLMServingSim's bench host, measured NCCL figures, configs/cluster/README.md"


def _llmservingsim_host(settings: EngineSettings, hw: dict) -> list[str]:
    """The host the run's collectives ran on (settings.host, with provenance); notes for the report.

    meta.json ``hardware.host`` (a host id) wins; else, for a GPU of LLMServingSim's bench
    machine, ``hardware.p2p`` picks its configuration, and without either the run's own era is
    assumed: no usable P2P (the harness records no host or P2P information)."""
    from servesim.simulator.specs import find_gpu

    prov = settings.provenance
    notes = []
    env = hw.get("all_reduce_environment")
    if env:
        notes.append(f"meta.json hardware.all_reduce_environment: {env}")
    if isinstance(hw.get("host"), str):
        settings.host, prov["host"] = hw["host"], "recorded (meta.json hardware.host)"
        return notes
    gpu = find_gpu(settings.gpu) if settings.gpu else None
    if gpu is None or gpu.name not in _BENCH_HOSTS:
        return notes
    no_p2p, with_p2p = _BENCH_HOSTS[gpu.name]
    if isinstance(hw.get("p2p"), bool):
        settings.host = with_p2p if hw["p2p"] else no_p2p
        prov["host"] = f"recorded (meta.json hardware.p2p: {str(hw['p2p']).lower()})"
    else:
        settings.host, prov["host"] = no_p2p, _BENCH_HOST_WHY
    return notes


@register_run_format("llmservingsim", _is_llmservingsim)
def load_llmservingsim_run(path: Path) -> MeasuredRun:
    """LLMServingSim's vLLM benchmark folder.

    ``requests.jsonl`` timestamps are vLLM V1 ``RequestStateStats`` on the engine's monotonic
    clock: TTFT = first_token_ts - queued_ts, TPOT = (last - first) / (out - 1),
    E2E = last_token_ts - queued_ts, queueing = scheduled_ts - queued_ts. Arrivals are the client
    wall-clock ``arrival_time`` relative to the first request. ``bench-<i>`` is the i-th request of
    the workload file the harness read (checked against the prompt/output lengths when pairing).
    """
    meta = json.loads((path / "meta.json").read_text())
    kw = dict(meta.get("engine_kwargs") or {})
    for key in ("kv_cache", "cache_config"):  # newer harness versions: {"num_gpu_blocks": ..}
        if isinstance(meta.get(key), dict):
            kw.update({k: v for k, v in meta[key].items() if k in ("num_gpu_blocks", "block_size")})
    resolved = meta.get("resolved_config")
    parallel = resolved.get("parallel_config") if isinstance(resolved, dict) else None
    if isinstance(parallel, dict):  # newer harness versions: vLLM's resolved ParallelConfig
        kw.update({k: v for k, v in parallel.items() if k in _PARALLEL_KEYS and kw.get(k) is None})
    settings = _settings_from_kwargs(str(meta.get("model") or kw.get("model")), meta.get("vllm_version"),
                                     kw, "meta.json")
    hw = meta.get("hardware") or {}
    device = hw.get("device_name") if isinstance(hw, dict) else None
    if device:
        settings.gpu = str(device)
        settings.provenance["gpu"] = "recorded (meta.json hardware.device_name)"
    else:  # the upstream layout is <GPU>_<model>/ (bench/examples/<GPU>/<model>/vllm)
        guess = _gpu_from_folder(path.name)
        if guess is not None:
            settings.gpu = guess
            settings.provenance["gpu"] = f"folder name {path.name!r} (meta.json records no device)"
    notes = _llmservingsim_host(settings, hw if isinstance(hw, dict) else {})
    rows = [json.loads(x) for x in (path / "requests.jsonl").read_text().splitlines() if x.strip()]
    if not rows:
        raise InputError("no requests", path=str(path / "requests.jsonl"))
    df = pd.DataFrame(rows)
    need = ("request_id", "input_toks", "output_toks", "arrival_time", "queued_ts", "first_token_ts",
            "last_token_ts")
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise InputError(f"missing fields {missing}", path=str(path / "requests.jsonl"))
    out = pd.DataFrame({
        "request_id": df["request_id"].astype(str),
        "workload_index": [_trailing_int(r) for r in df["request_id"]],
        "prompt_len": df["input_toks"].astype(int),
        "output_len": df["output_toks"].astype(int),
        "arrival_s": df["arrival_time"].astype(float) - float(df["arrival_time"].min()),
        "queueing_s": (df["scheduled_ts"] - df["queued_ts"]) if "scheduled_ts" in df else np.nan,
        "ttft_s": df["first_token_ts"] - df["queued_ts"],
        "tpot_s": np.where(df["output_toks"] > 1, (df["last_token_ts"] - df["first_token_ts"])
                           / (df["output_toks"] - 1).clip(lower=1), np.nan),
        "e2e_s": df["last_token_ts"] - df["queued_ts"],
    })
    ts = None
    if (path / "timeseries.csv").is_file():
        raw = pd.read_csv(path / "timeseries.csv")
        ts = pd.DataFrame({"t_s": raw["t"].astype(float)})
        for col in SERIES:
            ts[col] = raw[col].astype(float) if col in raw else np.nan
        if "prompt_throughput" in raw:
            ts["prompt_tokens_per_s"] = raw["prompt_throughput"].astype(float)
        if "gen_throughput" in raw:
            ts["gen_tokens_per_s"] = raw["gen_throughput"].astype(float)
        if "kv_cache_pct" in raw and float(raw["kv_cache_pct"].abs().max()) == 0.0:
            notes.append("timeseries.csv kv_cache_pct is 0.0 at every tick while up to "
                         f"{int(raw['running'].max())} requests run: the harness did not capture KV "
                         "usage, so this series is not a usable reference")
    return MeasuredRun(path.name, path, "llmservingsim", settings, out[REQUEST_COLUMNS], ts, notes)


# ---- servesim (a simulated run standing in for a measurement) -------------------------------
def _is_servesim(path: Path) -> bool:
    return (path / "requests.parquet").is_file() and (path / "config.yaml").is_file()


@register_run_format("servesim", _is_servesim)
def load_servesim_run(path: Path) -> MeasuredRun:
    import yaml

    cfg = yaml.safe_load((path / "config.yaml").read_text())
    hw, sc, cc = cfg.get("hardware", {}), cfg.get("scheduler", {}), cfg.get("cache", {})
    s = EngineSettings(model=hw.get("model", "llama-3.1-8b"), gpu=hw.get("gpu"), tp=int(hw.get("tp", 1)),
                       pp=int(hw.get("pp", 1)),
                       max_num_seqs=int(sc.get("max_num_seqs", 256)),
                       max_num_batched_tokens=int(sc.get("max_num_batched_tokens", 2048)),
                       max_model_len=sc.get("max_model_len"), block_size=int(cc.get("block_size", 16)),
                       num_gpu_blocks=cc.get("num_gpu_blocks"),
                       enable_prefix_caching=bool(cc.get("enable_prefix_caching", True)),
                       enable_chunked_prefill=bool(sc.get("enable_chunked_prefill", True)),
                       async_scheduling=bool(sc.get("async_scheduling", False)),
                       gpu_memory_utilization=float(hw.get("gpu_memory_utilization", 0.9)),
                       engine=str(cfg.get("engine", "vllm")), engine_version="servesim",
                       host=hw.get("host"), disable_custom_all_reduce=bool(hw.get("disable_custom_all_reduce", False)))
    s.provenance = {k: "recorded (config.yaml)" for k in ("model", "gpu", "tp", "pp", "max_num_seqs",
                                                           "max_num_batched_tokens", "num_gpu_blocks", "host",
                                                           "disable_custom_all_reduce")}
    req = pd.read_parquet(path / "requests.parquet")
    out = pd.DataFrame({
        "request_id": req["request_id"].astype(str),
        "workload_index": [_trailing_int(r) for r in req["request_id"]],
        "prompt_len": req["prompt_len"].astype(int), "output_len": req["output_len"].astype(int),
        "arrival_s": req["arrival_s"].astype(float), "queueing_s": req["queueing_s"].astype(float),
        "ttft_s": req["ttft_s"].astype(float), "tpot_s": req["tpot_s"].astype(float),
        "e2e_s": req["e2e_s"].astype(float),
    })
    ts = None
    if (path / "timeseries.csv").is_file():
        raw = pd.read_csv(path / "timeseries.csv")
        ts = to_measured_convention(raw)
    return MeasuredRun(path.name, path, "servesim", s, out[REQUEST_COLUMNS], ts, [])


def to_measured_convention(sim_ts: pd.DataFrame) -> pd.DataFrame:
    """Our simulator's 1-s series in the measured runs' convention.

    Ours: state at tick t, throughput over [t, t+1). vLLM's logger: state at tick t, throughput
    over (t-1, t]. The throughput columns move one tick later; the state columns stay."""
    out = pd.DataFrame({"t_s": sim_ts["t_s"].astype(float)})
    for col in SERIES:
        out[col] = sim_ts[col].astype(float) if col in sim_ts else np.nan
    for src, dst in (("prefill_tokens_per_s", "prompt_tokens_per_s"), ("decode_tokens_per_s", "gen_tokens_per_s")):
        if src in sim_ts:
            out[dst] = np.concatenate([[0.0], sim_ts[src].to_numpy(float)[:-1]])
    return out


def finite(x) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)
