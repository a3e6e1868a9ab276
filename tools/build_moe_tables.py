"""Regenerate ``simulator/cost_model/data/moe_tables.json.gz`` from aiconfigurator's MoE tables.

    PYTHONPATH=. python tools/build_moe_tables.py [--profiles ../shared/data/gpu_profiles]

From every ``moe_perf`` of vLLM 0.24.0 (H100, H200, B200, RTX PRO 6000, L40S; Triton kernels
where a format was measured with several backends; FlashInfer-CUTLASS where it is the only one, as
for every format on the RTX PRO 6000): one FusedMoE layer on one GPU (router top-k, grouped expert
GEMMs, weighted combine; no all-to-all), latency in ms converted to seconds, per ``num_tokens``
entering the layer on that GPU. Two products:

* tables (H100, H200, B200, RTX PRO 6000): for the MoE shapes of servesim's model registry (hidden,
  expert width, experts, top-k) only, every row with the ``balanced`` (uniform routing) and ``power_law_1.01`` distributions;
* efficiency curves, per (GPU, moe_dtype): each ``balanced`` row of every measured shape and layout
  divided by the roofline of the same call (roofline_moe.expert_roofline_s at the GPU's gpus.yaml
  efficiencies, the balanced kernel's min(T·k, E) active experts per rank), grouped by tokens per
  expert x = T·k/E into octave buckets (round(log2 x)); the curve is the median ratio of
  each bucket with at least 5 rows, at x = 2^bucket.

Each GPU's engine version is recorded (``engine_versions``). Source: github ai-dynamo/aiconfigurator
(Apache-2.0, Copyright (c) 2025-2026 NVIDIA CORPORATION & AFFILIATES), snapshot 095f58a5.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from aic_tables import AIC_ATTRIBUTION, engine_versions, write_tables_main  # tools/ is on sys.path when run as a script

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "simulator" / "cost_model" / "data" / "moe_tables.json.gz"
# order = preference among equally ranked curve sources (moe_tables.moe_efficiency)
SOURCES = {"h100": "h100_sxm/vllm_0.24.0", "h200": "h200_sxm/vllm_0.24.0", "b200": "b200_sxm/vllm_0.24.0",
           "rtx-pro-6000": "rtx_pro_6000_server/vllm_0.24.0", "l40s": "l40s/vllm_0.24.0"}
DISTRIBUTIONS = ("balanced", "power_law_1.01")
COLS = ["moe_dtype", "hidden_size", "inter_size", "num_experts", "topk", "moe_tp_size", "moe_ep_size", "distribution"]
# aiconfigurator moe_dtype -> servesim weight format (the roofline's bytes and tensor-core rate)
# (the per-tensor "fp8" rows, ModelOpt's FlashInfer-CUTLASS path, price no servesim format: fp8
# checkpoints run the fp8_block Triton kernel, moe_tables._DTYPES)
FORMATS = {"bfloat16": "bf16", "fp8_block": "fp8_block", "int4_wo": "int4", "w4a16_mxfp4": "mxfp4",
           "nvfp4": "nvfp4"}
# GPUs whose tables ship (the others give their efficiency curves only: a small file)
TABLE_GPUS = ("h100", "h200", "b200", "rtx-pro-6000")
MIN_ROWS_PER_BUCKET = 5


def catalogue_shapes() -> set[tuple[int, int, int, int]]:
    from servesim.simulator.specs import available_models, resolve_model

    out = set()
    for name in available_models():
        m = resolve_model(name)
        if m.is_moe:
            out.add((m.hidden_size, m.intermediate_size, m.num_experts, m.experts_per_token))
    return out


def kernel_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Per (format, shape, layout, distribution): the Triton rows where there are any (vLLM's
    default MoE backend on Hopper/Ada; FlashInfer-CUTLASS needs opting in), else all."""
    triton = df["kernel_source"].str.contains("triton")
    has_triton = triton.groupby([df[c] for c in COLS]).transform("any")
    return df[triton | ~has_triton]


def roofline_s(gpu, row) -> float:
    """The roofline of one measured call (the balanced kernel touches min(T·k, E) experts)."""
    from servesim.simulator.cost_model.roofline_params import RooflineParams
    from servesim.simulator.cost_model.roofline_moe import expert_gemm_rates, expert_roofline, expert_roofline_s
    from servesim.simulator.specs import ModelSpec

    fmt = FORMATS[row.moe_dtype]
    spec = ModelSpec(name="shape", hf_id="shape", num_layers=1, hidden_size=int(row.hidden_size),
                     num_attention_heads=1, num_kv_heads=1, head_dim=1, intermediate_size=int(row.inter_size),
                     vocab_size=1, max_position_embeddings=1, num_experts=int(row.num_experts),
                     experts_per_token=int(row.topk), expert_weight_dtype=fmt)
    c, wbytes = expert_gemm_rates(gpu, fmt, gpu.compute_efficiency)
    terms = expert_roofline(spec, int(row.moe_tp_size), int(row.moe_ep_size), c, wbytes)
    tokens = float(row.num_tokens)
    active = min(tokens * terms[5], float(terms[0]))
    return expert_roofline_s(terms, tokens, active, 1.0 / (gpu.peak_mem_bytes_per_s * gpu.memory_efficiency),
                             RooflineParams().kernel_overhead_s)


def efficiency_curves(gpu_name: str, df: pd.DataFrame) -> dict[str, list]:
    from servesim.simulator.specs import resolve_gpu

    gpu = resolve_gpu(gpu_name)
    out = {}
    bal = df[(df["distribution"] == "balanced") & df["moe_dtype"].isin(FORMATS)]
    for dtype, g in bal.groupby("moe_dtype"):
        ratio = g["latency"].to_numpy() * 1e-3 / np.array([roofline_s(gpu, r) for r in g.itertuples(index=False)])
        per_expert = g["num_tokens"].to_numpy() * g["topk"].to_numpy() / g["num_experts"].to_numpy()
        bucket = np.round(np.log2(per_expert)).astype(int)
        med = pd.Series(ratio).groupby(bucket).agg(["median", "size"])
        med = med[med["size"] >= MIN_ROWS_PER_BUCKET]
        out[f"{gpu_name}|{dtype}"] = [[float(2.0 ** b) for b in med.index],
                                      [round(float(v), 4) for v in med["median"]]]
    return out


def build(profiles: Path) -> dict:
    sys.path.insert(0, str(ROOT))
    shapes = catalogue_shapes()
    tables, efficiency = {}, {}
    for gpu, folder in SOURCES.items():
        df = kernel_rows(pd.read_csv(profiles / "aiconfigurator" / folder / "moe_perf.csv.gz"))
        efficiency.update(efficiency_curves(gpu, df))
        if gpu not in TABLE_GPUS:
            continue
        df = df[df["distribution"].isin(DISTRIBUTIONS)]
        keep = [tuple(r) in shapes for r in df[["hidden_size", "inter_size", "num_experts", "topk"]].itertuples(index=False)]
        for key, g in df[keep].groupby(COLS):
            agg = g.groupby("num_tokens")["latency"].median().sort_index()
            tables["|".join([gpu, *map(str, key)])] = [[int(t) for t in agg.index],
                                                      [float(f"{v * 1e-3:.4e}") for v in agg.to_numpy()]]
    assert all(math.isfinite(y) for _, ys in efficiency.values() for y in ys)
    return {"format": "servesim-moe-tables", "version": 2,
            "key": "gpu|moe_dtype|hidden|inter|experts|topk|moe_tp|moe_ep|distribution",
            "units": {"x": "tokens entering the layer on one GPU", "y": "seconds per call"},
            "efficiency_key": "gpu|moe_dtype",
            "efficiency_units": {"x": "tokens per expert (T k / E)", "y": "measured / roofline time"},
            "efficiency_rule": f"median over balanced rows of all shapes and layouts per octave bucket "
                               f"of tokens per expert (>= {MIN_ROWS_PER_BUCKET} rows)",
            "sources": {g: f"aiconfigurator/{f}/moe_perf.csv.gz" for g, f in SOURCES.items()},
            "engine_versions": engine_versions(SOURCES),
            "attribution": AIC_ATTRIBUTION,
            "tables": tables, "efficiency": efficiency}


def main() -> None:
    write_tables_main(__doc__.splitlines()[0], build, OUT, "curves")


if __name__ == "__main__":
    main()
