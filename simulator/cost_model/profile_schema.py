"""The tidy profile table every importer produces and :func:`fit` consumes.

One row = one measured latency of one op for one shape. Column meanings, units and the closed set
of ops are documented in docs/PROFILE_SCHEMA.md; this module is the executable form of that page.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from servesim.traces.errors import InputError

if TYPE_CHECKING:
    import pandas as pd

# column -> pandas dtype. Integer shape columns are nullable: NA means "does not apply to this op".
COLUMNS: dict[str, str] = {
    "source": "string",  # importer name, e.g. "aiconfigurator"
    "gpu": "string",  # canonical GPU id (simulator.specs), or the raw lowercase label if unknown
    "model": "string",  # canonical model id; "" for model-agnostic kernel rows (gemm, attention, allreduce)
    "tp": "Int64",  # tensor-parallel degree measured at; NA for shape-level kernels (already per-GPU)
    "op": "string",  # one of OPS
    "num_tokens": "Int64",  # tokens in the batch (dense ops) or rows (lm_head, sampler)
    "batch_size": "Int64",  # sequences (attention, whole-step rows)
    "context_len": "Int64",  # KV tokens cached per decode sequence before the step
    "chunk_len": "Int64",  # new tokens per prefill sequence
    "prefix_len": "Int64",  # KV tokens cached before the prefill chunk
    "gemm_m": "Int64",  # GEMM [m x k] @ [k x n]: m = tokens
    "gemm_n": "Int64",
    "gemm_k": "Int64",
    "num_heads": "Int64",  # attention query heads on one GPU
    "num_kv_heads": "Int64",  # attention KV heads on one GPU
    "head_dim": "Int64",
    "bytes": "Int64",  # collective message size, bytes (all-gather: the gathered output)
    # attn_mixed only: measured decode-skew blend factor alpha of this attention table, so that a
    # batch of unequal decode contexts costs t(mean) + alpha * (t(max) - t(mean)); NA = not measured
    "skew_alpha": "float64",
    "latency_s": "float64",  # seconds per call (per layer for per-layer ops)
    # collectives only, optional: nccl-tests' algorithm and bus bandwidth (GB/s = 1e9 B/s) of the row
    "algbw_gb_s": "float64",
    "busbw_gb_s": "float64",
    "dtype": "string",  # "bf16", "fp16", "fp8", ... (KV-cache dtype for attention rows)
    "kernel": "string",  # kernel / backend label from the source
    "device": "string",  # device label as the source wrote it
    "framework": "string",  # e.g. "vllm 0.14.0"
    "path": "string",  # file the row came from
}

# op -> (scope, columns that must be present). Scope "layer": cost of one call inside one decoder
# layer; "model": once per step outside the layers; "kernel": a shape-level GEMM the fitter maps to
# the model's projections; "step": a whole forward pass (coarse whole-request sources).
OPS: dict[str, tuple[str, tuple[str, ...]]] = {
    "embedding": ("model", ("num_tokens",)),
    "norm": ("layer", ("num_tokens",)),  # one RMSNorm call; a layer makes two
    "qkv_proj": ("layer", ("num_tokens",)),
    "rope": ("layer", ("num_tokens",)),
    "o_proj": ("layer", ("num_tokens",)),
    "gate_up_proj": ("layer", ("num_tokens",)),
    "act": ("layer", ("num_tokens",)),
    "down_proj": ("layer", ("num_tokens",)),
    "residual_add": ("layer", ("num_tokens",)),  # only where not fused into the norm
    "final_norm": ("model", ("num_tokens",)),
    "lm_head": ("model", ("num_tokens",)),
    "sampler": ("model", ("num_tokens",)),
    "gemm": ("kernel", ("gemm_m", "gemm_n", "gemm_k")),
    # fp8 dynamic per-token quantisation of an m x k activation, which fp8 GEMM rows include
    "act_quant": ("kernel", ("gemm_m", "gemm_k")),
    "attn_prefill": ("layer", ("batch_size", "chunk_len")),
    "attn_decode": ("layer", ("batch_size", "context_len")),
    "attn_mixed": ("layer", ("chunk_len", "prefix_len", "batch_size", "context_len")),
    "allreduce": ("layer", ("bytes", "tp")),  # one call; a layer makes two under TP
    # The other collectives (calibrate --collectives; nccl-tests sizes): read by the cost model's
    # collectives_profile (collectives.py), not by the fitter.
    "allgather": ("model", ("bytes", "tp")),  # TP logits gather, MoE dispatch, PP hand-off
    "reducescatter": ("model", ("bytes", "tp")),  # MoE combine (bytes: the whole input)
    "alltoall": ("model", ("bytes", "tp")),  # expert-parallel all-to-all (bytes: one rank's send buffer)
    "sendrecv": ("model", ("bytes", "tp")),  # pipeline hand-off (bytes: what each rank sends)
    # Host <-> GPU copies (calibrate --host-link: the CPU KV tiers' link): read by fit_link, not the fitter.
    "h2d_copy": ("kernel", ("bytes",)),
    "d2h_copy": ("kernel", ("bytes",)),
    "model_prefill": ("step", ("batch_size", "chunk_len")),
    "model_decode": ("step", ("batch_size", "context_len")),
}

CALLS_PER_LAYER: dict[str, int] = {"norm": 2, "allreduce": 2}  # others: one call per layer


def make_profile(rows: list[dict] | pd.DataFrame) -> pd.DataFrame:
    """Build a schema-conformant frame from row dicts (missing columns become NA)."""
    import pandas as pd
    df = pd.DataFrame(rows) if not isinstance(rows, pd.DataFrame) else rows.copy()
    for col, dtype in COLUMNS.items():
        if col not in df.columns:
            df[col] = pd.NA
        if dtype == "float64":  # a column present in only some concatenated frames holds pd.NA
            df[col] = pd.to_numeric(df[col].astype(object).where(df[col].notna(), np.nan))
        df[col] = df[col].astype(dtype)
    df["model"] = df["model"].fillna("")
    return df[list(COLUMNS)].reset_index(drop=True)


def validate_profile(df: pd.DataFrame, path: str | None = None) -> pd.DataFrame:
    """Check columns, op names and required shape columns; return the frame in schema dtypes."""
    missing = [c for c in ("source", "gpu", "op", "latency_s") if c not in df.columns]
    if missing:
        raise InputError(f"profile lacks required columns {missing}", path=path,
                         allowed=", ".join(COLUMNS))
    df = make_profile(df)
    bad_ops = sorted(set(df["op"].dropna()) - set(OPS))
    if bad_ops or df["op"].isna().any():
        raise InputError(f"unknown op(s) {bad_ops or ['<empty>']}", path=path, field="op",
                         allowed=", ".join(OPS))
    lat = df["latency_s"].to_numpy(dtype=float, na_value=np.nan)
    bad = ~(np.isfinite(lat) & (lat > 0))
    if bad.any():
        row = int(bad.nonzero()[0][0])
        raise InputError(f"latency_s must be a positive finite number, got {lat[row]!r}",
                         path=path, line=row + 2, field="latency_s")
    for op, (_, required) in OPS.items():
        sel = df["op"] == op
        for col in required:
            holes = sel & df[col].isna()
            if holes.any():
                row = int(holes.to_numpy().nonzero()[0][0])
                raise InputError(f"op '{op}' needs column '{col}'", path=path, line=row + 2,
                                 field=col)
    return df


def read_profile(path: str | Path) -> pd.DataFrame:
    """Read a profile already in our schema (.csv[.gz], .parquet, .jsonl[.gz])."""
    import pandas as pd
    path = Path(path)
    name = path.name.lower()
    try:
        if name.endswith(".parquet"):
            df = pd.read_parquet(path)
        elif name.endswith((".jsonl", ".jsonl.gz")):
            df = pd.read_json(path, lines=True)
        elif name.endswith((".csv", ".csv.gz")):
            df = pd.read_csv(path)
        else:
            raise InputError("unsupported profile file type", path=str(path),
                             allowed=".csv, .csv.gz, .parquet, .jsonl, .jsonl.gz")
    except (OSError, ValueError) as exc:
        if isinstance(exc, InputError):
            raise
        raise InputError(f"cannot read profile: {exc}", path=str(path)) from None
    return validate_profile(df, str(path))


def write_profile(df: pd.DataFrame, path: str | Path) -> None:
    """Write a profile; the format follows the suffix (.parquet, .jsonl or .csv[.gz])."""
    path = Path(path)
    df = validate_profile(df, str(path))
    tmp = path.with_name(path.name + ".tmp")
    if path.name.endswith(".parquet"):
        df.to_parquet(tmp, index=False)
    elif path.name.endswith(".jsonl"):
        df.to_json(tmp, orient="records", lines=True)
    else:
        df.to_csv(tmp, index=False, compression="gzip" if path.name.endswith(".gz") else None)
    tmp.replace(path)
