"""casys-kaist/LLMServingSim profiles.

* ``llmservingsim_v0``: PyTorch-profiler hooks on Hugging Face models,
  ``<GPU>/<org>/<model>/tp<N>/layers.csv`` (``latency(ns)`` per layer op, ``input`` = tokens of one
  sequence, no KV) and vidur-style ``attention.csv`` (``time_stats.attn_{prefill,decode}.*`` in ms;
  for prefill rows ``kv_cache_size`` is the cached prefix, vidur's convention).
* ``llmservingsim``: the vLLM-0.19 profiler, ``<GPU>/<org>/<model>/<dtype>/tp<N>/`` with
  ``dense.csv`` (per-token layers), ``per_sequence.csv`` (lm_head, sampler) and
  ``attention.csv.gz`` (the 4-D mixed batch grid), all in microseconds for one decoder layer;
  ``meta.yaml`` two levels up names the device and vLLM version.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import yaml

from servesim.traces.errors import InputError

from ..profile_schema import make_profile
from . import gpu_label, header, is_csv, model_label, read_table, register_importer

_V0_OPS = {
    "embedding": "embedding", "input_layernorm": "norm", "post_layernorm": "norm",
    "q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "rope": "rope",
    "o_proj": "o_proj", "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj", "act_fn": "act",
    "down_proj": "down_proj", "final_layernorm": "final_norm", "lm_head": "lm_head",
}
_V019_OPS = {
    "embedding": "embedding", "layernorm": "norm", "qkv_proj": "qkv_proj", "rotary_emb": "rope",
    "o_proj": "o_proj", "gate_up_proj": "gate_up_proj", "act_fn": "act", "down_proj": "down_proj",
    "final_layernorm": "final_norm", "lm_head": "lm_head", "sampler": "sampler",
}


def _tp_from_dir(folder: Path) -> int | None:
    match = re.fullmatch(r"tp(\d+)", folder.name)
    return int(match.group(1)) if match else None


def _v0_context(path: Path) -> dict:
    parts = path.resolve().parts  # .../<GPU>/<org>/<model>/tp<N>/<file>
    return {"source": "llmservingsim_v0", "gpu": gpu_label(parts[-5]),
            "model": model_label(f"{parts[-4]}/{parts[-3]}"), "device": parts[-5],
            "framework": "huggingface eager (pytorch profiler)", "dtype": "bf16", "path": str(path)}


def _detect_v0(path: Path) -> bool:
    if not is_csv(path):
        return False
    cols = header(path)
    return "latency(ns)" in cols or "time_stats.attn_prefill.median" in cols


def _v0_layers(path: Path) -> pd.DataFrame:
    raw = read_table(path, ("layer_name", "input", "tp_size", "latency(ns)"))
    attn_rows = raw[raw["layer_name"] == "attn"]  # whole-sequence prefill attention, nothing cached
    df = raw.assign(op=raw["layer_name"].map(_V0_OPS)).dropna(subset=["op"])
    # q/k/v and gate/up are separate modules in HF; vLLM fuses them, so sum per batch size. The
    # two layernorms stay separate rows (one call each), as does everything else.
    fused = df["op"].isin(["qkv_proj", "gate_up_proj"])
    summed = (df[fused].groupby(["op", "input", "tp_size"], as_index=False)["latency(ns)"].sum()
              .assign(layer_name=lambda d: d["op"]))
    df = pd.concat([df[~fused], summed], ignore_index=True)
    out = pd.DataFrame({"op": df["op"], "num_tokens": df["input"], "tp": df["tp_size"],
                        "latency_s": df["latency(ns)"].astype(float) * 1e-9,
                        "kernel": df["layer_name"], **_v0_context(path)})
    out = pd.concat([out, pd.DataFrame({
        "op": "attn_prefill", "batch_size": 1, "chunk_len": attn_rows["input"], "prefix_len": 0,
        "tp": attn_rows["tp_size"], "latency_s": attn_rows["latency(ns)"] * 1e-9,
        "kernel": "hf attn", **_v0_context(path)})], ignore_index=True)
    return make_profile(out[out["latency_s"] > 0])


def _v0_attention(path: Path) -> pd.DataFrame:
    df = read_table(path, ("is_prefill", "batch_size", "prefill_chunk_size", "kv_cache_size",
                           "n_q_head", "n_kv_head", "num_tensor_parallel_workers",
                           "time_stats.attn_prefill.median", "time_stats.attn_decode.median"))
    tp = df["num_tensor_parallel_workers"]
    prefill = df["is_prefill"].astype(bool)
    base = {"tp": tp, "num_heads": df["n_q_head"] // tp,
            "num_kv_heads": (df["n_kv_head"] // tp).clip(lower=1), "head_dim": 128,
            "kernel": df.get("attention_backend", "flash_attention"), **_v0_context(path)}
    if "n_embd" in df.columns:
        base["head_dim"] = df["n_embd"] // df["n_q_head"]
    out = pd.DataFrame(base)
    out["op"] = prefill.map({True: "attn_prefill", False: "attn_decode"})
    out["batch_size"] = df["batch_size"]
    out.loc[prefill, "chunk_len"] = df.loc[prefill, "prefill_chunk_size"]
    out.loc[prefill, "prefix_len"] = df.loc[prefill, "kv_cache_size"]
    out.loc[~prefill, "context_len"] = df.loc[~prefill, "kv_cache_size"]
    out["latency_s"] = df["time_stats.attn_prefill.median"].where(
        prefill, df["time_stats.attn_decode.median"]).astype(float) * 1e-3
    return make_profile(out[out["latency_s"] > 0])


@register_importer("llmservingsim_v0", _detect_v0)
def import_llmservingsim_v0(path: Path) -> pd.DataFrame:
    return _v0_layers(path) if "latency(ns)" in header(path) else _v0_attention(path)


# ---- vLLM 0.19 profiler ------------------------------------------------------------------------
_V019_FILES = ("dense.csv", "per_sequence.csv", "attention.csv", "attention.csv.gz")


def _detect_v019(path: Path) -> bool:
    if path.is_dir():
        return any((path / f).is_file() for f in _V019_FILES)
    return is_csv(path) and "time_us" in header(path)


def _v019_context(tp_dir: Path) -> dict:
    tp_dir = tp_dir.resolve()
    meta_path = tp_dir.parent / "meta.yaml"
    meta = yaml.safe_load(meta_path.read_text()) if meta_path.is_file() else {}
    parts = tp_dir.parts  # .../<GPU>/<org>/<model>/<dtype>/tp<N>
    device = str(meta.get("gpu") or parts[-5])
    model = str(meta.get("model") or f"{parts[-4]}/{parts[-3]}")
    variant = str(meta.get("variant") or parts[-2])
    tp = _tp_from_dir(tp_dir)
    return {"source": "llmservingsim", "gpu": gpu_label(device), "model": model_label(model),
            "device": device, "framework": f"vllm {meta.get('vllm_version', '0.19')} eager",
            "dtype": variant, "tp": tp, "skew_alpha": _skew_alpha(meta, tp, meta_path)}


def _skew_alpha(meta: dict, tp: int | None, meta_path: Path) -> float | None:
    """The pooled decode-skew factor the profiler fitted for this TP (``skew_fit.per_tp``).

    The profiler measured each skewed decode batch three ways (all at the mean context, all at
    the max, the real mix) and fitted alpha = (t_skew - t_mean) / (t_max - t_mean) by weighted
    least squares. Its per-bucket table (``tp<N>/skew_fit.csv``) is not always shipped; the pooled
    ``alpha_default`` in meta.yaml always is. None when the skew profile was not enabled.
    """
    fit = meta.get("skew_fit") if isinstance(meta, dict) else None
    if not isinstance(fit, dict) or not fit.get("enabled") or tp is None:
        return None
    per_tp = fit.get("per_tp") or {}
    entry = per_tp.get(tp, per_tp.get(str(tp)))
    if not isinstance(entry, dict) or entry.get("alpha_default") is None:
        return None
    try:
        alpha = float(entry["alpha_default"])
    except (TypeError, ValueError):
        raise InputError("skew_fit alpha_default must be a number", path=str(meta_path),
                         field=f"skew_fit.per_tp.{tp}.alpha_default") from None
    if not 0.0 <= alpha <= 1.0:
        raise InputError(f"skew_fit alpha_default {alpha} is outside [0, 1]", path=str(meta_path),
                         field=f"skew_fit.per_tp.{tp}.alpha_default", allowed="0 .. 1")
    return alpha


def _v019_file(path: Path, ctx: dict) -> pd.DataFrame:
    name = path.name.lower()
    if name.startswith("attention"):
        df = read_table(path, ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode", "time_us"))
        out = pd.DataFrame({"op": "attn_mixed", "chunk_len": df["prefill_chunk"],
                            "prefix_len": df["kv_prefill"], "batch_size": df["n_decode"],
                            "context_len": df["kv_decode"], "kernel": "vllm attention",
                            "latency_s": df["time_us"].astype(float) * 1e-6})
    else:
        count = "sequences" if name.startswith("per_sequence") else "tokens"
        df = read_table(path, ("layer", count, "time_us"))
        df = df.assign(op=df["layer"].map(_V019_OPS)).dropna(subset=["op"])
        out = pd.DataFrame({"op": df["op"], "num_tokens": df[count], "kernel": df["layer"],
                            "latency_s": df["time_us"].astype(float) * 1e-6})
    ctx = dict(ctx)
    skew_alpha = ctx.pop("skew_alpha", None)
    out = out.assign(path=str(path), **ctx)
    if name.startswith("attention") and skew_alpha is not None:
        out = out.assign(skew_alpha=skew_alpha)
    return out[out["latency_s"] > 0]


@register_importer("llmservingsim", _detect_v019)
def import_llmservingsim(path: Path) -> pd.DataFrame:
    files = [path / f for f in _V019_FILES if (path / f).is_file()] if path.is_dir() else [path]
    tp_dir = path if path.is_dir() else path.parent
    ctx = _v019_context(tp_dir)
    if ctx["tp"] is None:
        raise InputError("cannot tell the TP degree: expected the files inside a 'tp<N>' folder",
                         path=str(path), field="tp")
    return make_profile(pd.concat([_v019_file(f, ctx) for f in files], ignore_index=True))
