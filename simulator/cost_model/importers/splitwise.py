"""Mutinifni/splitwise-sim ``perf_model.csv``: whole-request latencies of static batches.

Each row is ``batch_size`` requests with ``prompt_size`` input and ``token_size`` output tokens:
``prompt_time`` (ms) is the prefill of the whole batch and ``token_time`` (ms) one decode step.
We emit one ``model_prefill`` row (the whole prefill forward) and one ``model_decode`` row whose
context is the mean KV length over the decode phase (prompt + half the output).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..profile_schema import make_profile
from . import gpu_label, header, is_csv, model_label, read_table, register_importer

_REQUIRED = ("model", "hardware", "prompt_size", "batch_size", "token_size", "prompt_time",
             "token_time", "tensor_parallel")


def _detect(path: Path) -> bool:
    return is_csv(path) and {"prompt_time", "token_time", "hardware"} <= set(header(path))


@register_importer("splitwise", _detect)
def import_splitwise(path: Path) -> pd.DataFrame:
    df = read_table(path, _REQUIRED)
    # "h100-80gb-pcap" is a power-capped H100: not an h100, so it keeps its raw label.
    gpus = df["hardware"].astype(str).map(gpu_label)
    models = df["model"].astype(str).map(model_label)
    common = {"source": "splitwise", "gpu": gpus, "model": models, "tp": df["tensor_parallel"],
              "batch_size": df["batch_size"], "dtype": "fp16", "device": df["hardware"],
              "framework": "splitwise", "path": str(path)}
    prefill = pd.DataFrame({**common, "op": "model_prefill", "chunk_len": df["prompt_size"],
                            "prefix_len": 0, "num_tokens": df["batch_size"] * df["prompt_size"],
                            "latency_s": df["prompt_time"].astype(float) * 1e-3})
    decode = pd.DataFrame({**common, "op": "model_decode",
                           "context_len": df["prompt_size"] + df["token_size"] // 2,
                           "num_tokens": df["batch_size"],
                           "latency_s": df["token_time"].astype(float) * 1e-3})
    return make_profile(pd.concat([prefill, decode], ignore_index=True))
