"""ai-dynamo/aiconfigurator kernel tables: ``<gpu>/vllm_<ver>/*_perf.csv.gz`` and ``nccl_perf``.

``latency`` is milliseconds per call of one op of one layer. ``scale_matrix_perf`` and
``computescale_perf`` (read together) give ``act_quant`` rows: the fp8 activation quantisation
that the fp8 GEMM rows include. Shapes are per GPU and not tied to a model: GEMMs are ``m x k @ k x n`` and attention rows give the per-GPU head counts, so ``model``
is empty and ``tp`` is NA except for all-reduce rows (``num_gpus``).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from servesim.traces.errors import InputError

from ...specs import find_gpu
from ..profile_schema import make_profile
from . import header, is_csv, read_table, register_importer

_FILES = ("gemm_perf", "context_attention_perf", "generation_attention_perf",
          "custom_allreduce_perf", "nccl_perf", "scale_matrix_perf", "computescale_perf")
_QUANT_PAIR = ("scale_matrix_perf", "computescale_perf")  # read together (act_quant rows)
_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "int8": "int8"}
_ELEM_BYTES = {"bf16": 2, "fp16": 2, "int8": 1}


def _kind(path: Path) -> str | None:
    stem = path.name.lower().split(".")[0]
    return stem if stem in _FILES else None


def _detect(path: Path) -> bool:
    if path.is_dir():
        return any(_kind(p) for p in path.iterdir())
    return is_csv(path) and _kind(path) is not None and "latency" in header(path)


def _common(df: pd.DataFrame, path: Path) -> dict:
    device = df["device"].astype(str)
    spec = find_gpu(device.iloc[0]) if len(df) else None
    return {
        "source": "aiconfigurator",
        "gpu": spec.name if spec else device.iloc[0].lower() if len(df) else "",
        "model": "",
        "device": device,
        "framework": df["framework"].astype(str).str.lower() + " " + df["version"].astype(str),
        "kernel": df["kernel_source"].astype(str),
        "latency_s": df["latency"].astype(float) * 1e-3,  # ms per call -> s
        "path": str(path),
    }


def _gemm(path: Path) -> pd.DataFrame:
    df = read_table(path, ("m", "n", "k", "gemm_dtype", "latency", "device"))
    cols = _common(df, path)
    cols.update(op="gemm", gemm_m=df["m"], gemm_n=df["n"], gemm_k=df["k"], num_tokens=df["m"],
                dtype=df["gemm_dtype"].map(lambda d: _DTYPES.get(d, d)))
    return pd.DataFrame(cols)


def _attention(path: Path, decode: bool) -> pd.DataFrame:
    df = read_table(path, ("batch_size", "isl", "step", "num_heads", "num_key_value_heads",
                           "head_dim", "kv_cache_dtype", "latency", "device"))
    if "window_size" in df.columns:  # sliding-window rows describe other models' kernels
        df = df[df["window_size"] == 0]
    cols = _common(df, path)
    cols.update(batch_size=df["batch_size"], num_heads=df["num_heads"],
                num_kv_heads=df["num_key_value_heads"], head_dim=df["head_dim"],
                dtype=df["kv_cache_dtype"].map(lambda d: _DTYPES.get(d, d)))
    if decode:  # `step` = KV history per sequence; one query token each
        cols.update(op="attn_decode", context_len=df["step"])
    else:  # prefill of `isl` tokens with nothing cached
        cols.update(op="attn_prefill", chunk_len=df["isl"], prefix_len=0)
    return pd.DataFrame(cols)


def _allreduce(path: Path, nccl: bool) -> pd.DataFrame:
    dtype_col = "nccl_dtype" if nccl else "allreduce_dtype"
    df = read_table(path, ("num_gpus", "message_size", dtype_col, "latency", "device"))
    if nccl:
        df = df[df["op_name"] == "all_reduce"]
    dtype = df[dtype_col].map(lambda d: _DTYPES.get(d, d))
    cols = _common(df, path)
    cols.update(op="allreduce", tp=df["num_gpus"], dtype=dtype,
                bytes=df["message_size"] * dtype.map(_ELEM_BYTES))  # message_size is in elements
    if not nccl:
        cols["kernel"] = df["backend"].astype(str)
    return pd.DataFrame(cols)


def _act_quant(static: Path, compute_scale: Path) -> pd.DataFrame:
    """fp8 dynamic per-token activation quantisation of an m x k bf16 matrix: the static quant
    (`scale_matrix_perf`) plus the scale computation, which `computescale_perf` records as the
    difference dynamic - static. One row per (m, k) measured in both."""
    a = read_table(static, ("m", "k", "latency", "device"))
    b = read_table(compute_scale, ("m", "k", "latency"))
    df = a.merge(b[["m", "k", "latency"]].rename(columns={"latency": "scale_ms"}), on=["m", "k"])
    cols = _common(df, static)
    cols.update(op="act_quant", gemm_m=df["m"], gemm_k=df["k"], num_tokens=df["m"],
                latency_s=(df["latency"] + df["scale_ms"].clip(lower=0.0)) * 1e-3,
                kernel="dynamic_per_token_scaled_fp8_quant")
    return pd.DataFrame(cols)


@register_importer("aiconfigurator", _detect)
def import_aiconfigurator(path: Path) -> pd.DataFrame:
    files = sorted(p for p in path.iterdir() if _kind(p)) if path.is_dir() else [path]
    quant = {_kind(f): f for f in files if _kind(f) in _QUANT_PAIR}
    if quant and not path.is_dir():  # one of the pair named alone: read it with its sibling
        quant = {kind: path.with_name(path.name.replace(_kind(path), kind)) for kind in _QUANT_PAIR}
        missing = [str(f) for f in quant.values() if not f.is_file()]
        if missing:
            raise InputError("fp8 activation-quantisation rows need both tables", path=str(path),
                             allowed=f"{' and '.join(_QUANT_PAIR)} side by side (missing: {', '.join(missing)})")
    parts = [_act_quant(quant["scale_matrix_perf"], quant["computescale_perf"])] if len(quant) == 2 else []
    for f in files:
        kind = _kind(f)
        if kind == "gemm_perf":
            parts.append(_gemm(f))
        elif kind in ("context_attention_perf", "generation_attention_perf"):
            parts.append(_attention(f, decode=kind.startswith("generation")))
        elif kind in ("custom_allreduce_perf", "nccl_perf"):
            parts.append(_allreduce(f, nccl=kind == "nccl_perf"))
    if not parts:
        raise InputError("no aiconfigurator *_perf.csv[.gz] files here", path=str(path),
                         allowed=", ".join(_FILES))
    return make_profile(pd.concat(parts, ignore_index=True))
