"""microsoft/vidur profiles: per-operator ``compute/<gpu>/<org>/<model>/mlp.csv`` and
``network/<topology>/all_reduce.csv``. Times are ``time_stats.<op>.*`` in milliseconds; we use the
median of the repeats."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from servesim.traces.errors import InputError

from ..profile_schema import make_profile
from . import gpu_label, header, is_csv, model_label, read_table, register_importer

# vidur op name -> our op. Both layernorms map to "norm" (one call each).
_OPS = {
    "emb": "embedding", "input_layernorm": "norm", "attn_pre_proj": "qkv_proj",
    "attn_rope": "rope", "attn_post_proj": "o_proj", "post_attention_layernorm": "norm",
    "mlp_up_proj": "gate_up_proj", "mlp_act": "act", "mlp_down_proj": "down_proj",
    "add": "residual_add",
}


def _detect(path: Path) -> bool:
    if not is_csv(path):
        return False
    cols = header(path)
    return "num_tensor_parallel_workers" in cols and "time_stats.mlp_up_proj.median" in cols \
        or "time_stats.all_reduce.median" in cols


def _mlp(path: Path) -> pd.DataFrame:
    df = read_table(path, ("num_tokens", "num_tensor_parallel_workers"))
    parts = path.resolve().parts
    # .../compute/<gpu>/<org>/<model>/mlp.csv.gz
    gpu, model = (parts[-4], f"{parts[-3]}/{parts[-2]}") if len(parts) >= 4 else ("", "")
    frames = []
    for theirs, ours in _OPS.items():
        col = f"time_stats.{theirs}.median"
        if col not in df.columns:
            continue
        sel = df[df[col].notna()]
        frames.append(pd.DataFrame({
            "op": ours, "num_tokens": sel["num_tokens"], "tp": sel["num_tensor_parallel_workers"],
            "latency_s": sel[col].astype(float) * 1e-3, "kernel": theirs,
        }))
    if not frames:
        raise InputError("no time_stats.<op>.median columns found", path=str(path))
    out = pd.concat(frames, ignore_index=True)
    out = out[out["latency_s"] > 0]  # a few sub-resolution timings are recorded as 0 ms
    out = out.assign(source="vidur", gpu=gpu_label(gpu), model=model_label(model), dtype="fp16",
                     device=gpu, framework="vidur (sarathi)", path=str(path))
    return make_profile(out)


def _all_reduce(path: Path) -> pd.DataFrame:
    df = read_table(path, ("num_workers", "size", "time_stats.all_reduce.median"))
    topology = path.resolve().parent.name  # e.g. h100_pairwise_nvlink
    out = pd.DataFrame({
        "op": "allreduce", "tp": df["num_workers"], "bytes": df["size"],
        "latency_s": df["time_stats.all_reduce.median"].astype(float) * 1e-3,
        "kernel": "nccl " + topology, "source": "vidur", "gpu": gpu_label(topology.split("_")[0]),
        "model": "", "dtype": "fp16", "device": topology, "framework": "vidur", "path": str(path),
    })
    return make_profile(out[out["latency_s"] > 0])


@register_importer("vidur", _detect)
def import_vidur(path: Path) -> pd.DataFrame:
    if "time_stats.all_reduce.median" in header(path):
        return _all_reduce(path)
    return _mlp(path)
