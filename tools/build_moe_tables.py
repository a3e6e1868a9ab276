"""Regenerate ``simulator/cost_model/data/moe_tables.json.gz`` from aiconfigurator's MoE tables.

    PYTHONPATH=. python tools/build_moe_tables.py [--profiles ../shared/data/gpu_profiles]

Keeps, for the MoE shapes of servesim's model catalogue (hidden, expert width, experts, top-k), every
``moe_perf`` row (Triton kernels where a format was measured with several backends) of vLLM 0.24.0 on H100/H200/B200 with the ``balanced`` (uniform routing) and
``power_law_1.01`` distributions: one FusedMoE layer on one GPU (router top-k, grouped expert GEMMs,
weighted combine; no all-to-all), latency in ms converted to seconds, per ``num_tokens`` entering
the layer on that GPU. Source: github ai-dynamo/aiconfigurator (Apache-2.0, Copyright (c) 2025-2026
NVIDIA CORPORATION & AFFILIATES), snapshot 095f58a5.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from aic_tables import AIC_ATTRIBUTION, write_tables_main  # tools/ is on sys.path when run as a script

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "simulator" / "cost_model" / "data" / "moe_tables.json.gz"
SOURCES = {"h100": "h100_sxm/vllm_0.24.0", "h200": "h200_sxm/vllm_0.24.0", "b200": "b200_sxm/vllm_0.24.0"}
DISTRIBUTIONS = ("balanced", "power_law_1.01")


def catalogue_shapes() -> set[tuple[int, int, int, int]]:
    import sys

    sys.path.insert(0, str(ROOT))
    from servesim.simulator.specs import available_models, resolve_model

    out = set()
    for name in available_models():
        m = resolve_model(name)
        if m.is_moe:
            out.add((m.hidden_size, m.intermediate_size, m.num_experts, m.experts_per_token))
    return out


def build(profiles: Path) -> dict:
    shapes = catalogue_shapes()
    tables = {}
    for gpu, folder in SOURCES.items():
        df = pd.read_csv(profiles / "aiconfigurator" / folder / "moe_perf.csv.gz")
        df = df[df["distribution"].isin(DISTRIBUTIONS)]
        keep = [tuple(r) in shapes for r in df[["hidden_size", "inter_size", "num_experts", "topk"]].itertuples(index=False)]
        df = df[keep]
        cols = ["moe_dtype", "hidden_size", "inter_size", "num_experts", "topk", "moe_tp_size", "moe_ep_size", "distribution"]
        for key, g in df.groupby(cols):
            # vLLM's default MoE backend on these GPUs is Triton; FlashInfer-CUTLASS needs opting in
            triton = g[g["kernel_source"].str.contains("triton")]
            g = triton if len(triton) else g
            agg = g.groupby("num_tokens")["latency"].median().sort_index()
            name = "|".join([gpu, *map(str, key)])
            tables[name] = [[int(t) for t in agg.index], [float(f"{v * 1e-3:.4e}") for v in agg.to_numpy()]]
    return {"format": "servesim-moe-tables", "version": 1,
            "key": "gpu|moe_dtype|hidden|inter|experts|topk|moe_tp|moe_ep|distribution",
            "units": {"x": "tokens entering the layer on one GPU", "y": "seconds per call"},
            "sources": {g: f"aiconfigurator/{f}/moe_perf.csv.gz" for g, f in SOURCES.items()},
            "attribution": AIC_ATTRIBUTION,
            "tables": tables}


def main() -> None:
    write_tables_main(__doc__.splitlines()[0], build, OUT, "curves")


if __name__ == "__main__":
    main()
