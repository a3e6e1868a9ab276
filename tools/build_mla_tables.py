"""Regenerate ``simulator/cost_model/data/mla_tables.json.gz`` from aiconfigurator's MLA decode tables.

    PYTHONPATH=. python tools/build_mla_tables.py [--profiles ../shared/data/gpu_profiles]

Keeps every ``generation_mla_perf`` row of vLLM 0.14.0 (the MLA decode attention kernel alone, one
layer on one GPU, no projections: ``vllm_flash_attn_mla`` for a bf16 KV cache and ``vllm_flashmla``
for fp8 on Hopper, ``vllm_triton_mla`` on A100; the kernels per table are listed under ``kernels``),
bf16 activations, per KV-cache dtype (bf16 / fp8) and query heads per GPU (``num_heads``; the table's
``tp_size`` x ``num_heads`` is the model's 128): latency (ms -> s) per (batch, context), the context
being ``isl + step`` (tokens already in the cache). Points measured more than once (the same heads per
GPU under two tp_size values) keep their fastest time: the repeats differ by isolated spikes of up to 7x. Source:
github ai-dynamo/aiconfigurator (Apache-2.0, Copyright (c) 2025-2026 NVIDIA CORPORATION & AFFILIATES),
snapshot 095f58a5.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from aic_tables import AIC_ATTRIBUTION, engine_versions, write_tables_main  # tools/ is on sys.path when run as a script

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "simulator" / "cost_model" / "data" / "mla_tables.json.gz"
SOURCES = {"a100-80gb": "a100_sxm/vllm_0.14.0", "h100": "h100_sxm/vllm_0.14.0", "h200": "h200_sxm/vllm_0.14.0",
           "l40s": "l40s/vllm_0.14.0"}


def build(profiles: Path) -> dict:
    sys.path.insert(0, str(ROOT))
    from servesim.simulator.cost_model.interp import NestedGrid

    tables, kernels = {}, {}
    for gpu, folder in SOURCES.items():
        path = profiles / "aiconfigurator" / folder / "generation_mla_perf.csv.gz"
        if not path.is_file():
            continue
        df = pd.read_csv(path)
        df = df[df["mla_dtype"] == "bfloat16"]
        df = df.assign(context=df["isl"] + df["step"])
        for (kv, heads), g in df.groupby(["kv_cache_dtype", "num_heads"]):
            kernels[f"{gpu}|{kv}"] = sorted(set(g["kernel_source"]))
            agg = g.groupby(["batch_size", "context"])["latency"].min().reset_index()
            grid = NestedGrid.from_points(("batch", "context"), agg[["batch_size", "context"]].to_numpy(float),
                                          agg["latency"].to_numpy(float) * 1e-3)
            tables[f"{gpu}|{kv}|{int(heads)}"] = grid.to_dict()
    return {"format": "servesim-mla-tables", "version": 1, "key": "gpu|kv_cache_dtype|heads_per_gpu",
            "units": {"x": "(decode requests, mean context tokens)", "y": "seconds per layer"},
            "sources": {g: f"aiconfigurator/{f}/generation_mla_perf.csv.gz" for g, f in SOURCES.items()},
            "engine_versions": engine_versions(SOURCES), "attribution": AIC_ATTRIBUTION,
            "kernels": kernels, "tables": tables}


def main() -> None:
    write_tables_main(__doc__.splitlines()[0], build, OUT, "grids")


if __name__ == "__main__":
    main()
