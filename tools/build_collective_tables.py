"""Regenerate ``simulator/cost_model/data/collectives.json`` from aiconfigurator's comm tables.

    PYTHONPATH=. python tools/build_collective_tables.py [--profiles ../shared/data/gpu_profiles]

For every GPU we ship a collective table for, it keeps per GPU count: the NCCL ``all_reduce``,
``alltoall``, ``all_gather`` and ``reduce_scatter`` rows (``nccl_dtype`` half) and vLLM's custom
all-reduce under CUDA graphs (``backend`` vllm_graph, bf16), as (message bytes, seconds) pairs.
all_gather's size is the whole gathered buffer and reduce_scatter's the whole input (nccl-tests'
conventions, kept by aiconfigurator's collector). aiconfigurator stores
``message_size`` in ELEMENTS (2 bytes each for half/bf16) and latency in ms (see the shared data
README); both are converted here. Source: github ai-dynamo/aiconfigurator (Apache-2.0,
Copyright (c) 2025-2026 NVIDIA CORPORATION & AFFILIATES), snapshot 095f58a5; the exact folders are
recorded per GPU in the output file.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "simulator" / "cost_model" / "data" / "collectives.json"
DEFAULT_PROFILES = ROOT.parent / "shared" / "data" / "gpu_profiles"

# our GPU id -> (nccl table, custom all-reduce table), relative to gpu_profiles/aiconfigurator
SOURCES = {
    "a100-80gb": ("a100_sxm/nccl_2.27.3", "a100_sxm/vllm_0.14.0"),
    "h100": ("h100_sxm/nccl_2.29.2", "h100_sxm/vllm_0.24.0"),
    "h200": ("h200_sxm/nccl_2.29.2", "h200_sxm/vllm_0.24.0"),
    "b200": ("b200_sxm/nccl_2.29.2", "b200_sxm/vllm_0.24.0"),
    "l40s": ("l40s/nccl_2.27.3", "l40s/vllm_0.14.0"),
    "rtx-pro-6000": ("rtx_pro_6000_server/nccl_2.29.2", "rtx_pro_6000_server/vllm_0.24.0"),
}
_BYTES_PER_ELEM = 2  # half / bfloat16
# Pipeline-parallel hand-off between two GPUs of one node: Vidur's network profiles (MIT,
# github microsoft/vidur data/profiling/network/<topology>/send_recv.csv, sizes in bytes, ms).
SEND_RECV = {"a100-80gb": "vidur/network/a100_dgx/send_recv.csv.gz",
             "h100": "vidur/network/h100_dgx/send_recv.csv.gz"}


def _pairs(df: pd.DataFrame) -> list[list[float]]:
    agg = df.groupby("message_size")["latency"].median().sort_index()
    return [[int(m) * _BYTES_PER_ELEM, round(float(ms) * 1e-3, 10)] for m, ms in agg.items()]


def build(profiles: Path) -> dict:
    aic = profiles / "aiconfigurator"
    gpus = {}
    for gpu, (nccl_dir, car_dir) in SOURCES.items():
        nccl = pd.read_csv(aic / nccl_dir / "nccl_perf.csv.gz")
        nccl = nccl[nccl["nccl_dtype"] == "half"]
        car = pd.read_csv(aic / car_dir / "custom_allreduce_perf.csv.gz")
        car = car[(car["backend"] == "vllm_graph") & (car["allreduce_dtype"] == "bfloat16")]
        tables = {}
        for n in sorted(set(nccl["num_gpus"]) | set(car["num_gpus"])):
            tables[str(int(n))] = {
                "nccl_allreduce": _pairs(nccl[(nccl["num_gpus"] == n) & (nccl["op_name"] == "all_reduce")]),
                "nccl_alltoall": _pairs(nccl[(nccl["num_gpus"] == n) & (nccl["op_name"] == "alltoall")]),
                # the vocab-parallel logits gather of every step under TP (collectives.py)
                "nccl_allgather": _pairs(nccl[(nccl["num_gpus"] == n) & (nccl["op_name"] == "all_gather")]),
                # the MoE combine of vLLM's allgather_reducescatter all2all backend (moe_comm.py)
                "nccl_reducescatter": _pairs(nccl[(nccl["num_gpus"] == n) & (nccl["op_name"] == "reduce_scatter")]),
                "custom_allreduce": _pairs(car[car["num_gpus"] == n]),
            }
        gpus[gpu] = {"device": str(nccl["device"].iloc[0]),
                     "sources": [f"aiconfigurator/{nccl_dir}/nccl_perf.csv.gz",
                                 f"aiconfigurator/{car_dir}/custom_allreduce_perf.csv.gz"],
                     "num_gpus": tables}
        if gpu in SEND_RECV:
            sr = pd.read_csv(profiles / SEND_RECV[gpu])
            sr = sr[(sr["devices_per_node"] == 2) & (sr["num_workers"] == 2)]
            med = sr.groupby("size")["time_stats.send_recv.median"].median().sort_index()
            gpus[gpu]["send_recv"] = [[int(b), round(float(ms) * 1e-3, 10)] for b, ms in med.items()]
            gpus[gpu]["sources"].append(SEND_RECV[gpu])
    return {"format": "servesim-collective-tables", "version": 1,
            "units": {"bytes": "message bytes (bf16/half)", "seconds": "one call, out of place"},
            "attribution": "ai-dynamo/aiconfigurator (Apache-2.0), Copyright (c) 2025-2026 NVIDIA "
                           "CORPORATION & AFFILIATES; snapshot 095f58a51c4ca8e61b66ec108d86f223f8d559ce. "
                           "send_recv: microsoft/vidur (MIT), file commit 60277c06b41e49483609bdab55f71fe0fb5fdd54",
            "gpus": gpus}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", type=Path, default=DEFAULT_PROFILES)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    data = build(args.profiles)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, separators=(",", ":")) + "\n")
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes, {len(data['gpus'])} GPUs)")


if __name__ == "__main__":
    main()
