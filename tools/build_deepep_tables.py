"""Regenerate ``simulator/cost_model/data/deepep_tables.json.gz`` from aiconfigurator's DeepEP tables.

    python tools/build_deepep_tables.py [--profiles ../shared/data/gpu_profiles]

Keeps, for H100/H200/B200, every shape of SGLang 0.5.12's DeepEP benchmark (``wideep_deepep_ll_perf``:
low-latency mode; ``wideep_deepep_normal_perf``: high-throughput mode at ``dispatch_sms`` 20, the SM
budget vLLM's ``DeepEPAll2AllManagerBase`` uses): the seconds of one MoE layer's dispatch + combine
per tokens per rank (``num_token``), one node of 8 GPUs (``node_num`` 1, EP 8). The ``*_us`` columns
are MICROseconds (unlike every other aiconfigurator table): LL sums ``dispatch_avg_t_us`` +
``combine_avg_t_us``; normal sums transmit + notify of dispatch and of combine, as aiconfigurator's
``moe_a2a.rs`` does. Repeated points keep their median. Source: github ai-dynamo/aiconfigurator
(Apache-2.0, Copyright (c) 2025-2026 NVIDIA CORPORATION & AFFILIATES), snapshot 095f58a5, file commit
f678dbe3b6eca72fe6cfa24a2f94160896f2a809.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from aic_tables import AIC_ATTRIBUTION, engine_versions, write_tables_main  # tools/ is on sys.path when run as a script

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "simulator" / "cost_model" / "data" / "deepep_tables.json.gz"
SOURCES = {"h100": "h100_sxm/sglang_0.5.12", "h200": "h200_sxm/sglang_0.5.12", "b200": "b200_sxm/sglang_0.5.12"}
GPUS_PER_NODE = 8  # the 0.5.12 sets ran on one 8-GPU HGX node: EP = node_num x 8 (moe_a2a.rs)
VLLM_DEEPEP_HT_SMS = 20  # vllm/distributed/device_communicators/all2all.py: self.num_sms = 20
_US = 1e-6
# mode -> (file, the columns summed into one layer's dispatch + combine)
MODES = {"ll": ("wideep_deepep_ll_perf.csv.gz", ("dispatch_avg_t_us", "combine_avg_t_us")),
         "ht": ("wideep_deepep_normal_perf.csv.gz", ("dispatch_transmit_us", "dispatch_notify_us",
                                                     "combine_transmit_us", "combine_notify_us"))}


def build(profiles: Path) -> dict:
    tables = {}
    for gpu, folder in SOURCES.items():
        for mode, (name, cols) in MODES.items():
            df = pd.read_csv(profiles / "aiconfigurator" / folder / name)
            df = df[df["node_num"] == 1]
            if mode == "ht":
                df = df[df["dispatch_sms"] == VLLM_DEEPEP_HT_SMS]
            df = df.assign(seconds=df[list(cols)].sum(axis=1) * _US)
            for (hidden, topk, experts), g in df.groupby(["hidden_size", "num_topk", "num_experts"]):
                agg = g.groupby("num_token")["seconds"].median().sort_index()
                key = "|".join(map(str, (gpu, mode, hidden, topk, experts, GPUS_PER_NODE)))
                tables[key] = [[int(t) for t in agg.index], [float(f"{v:.6e}") for v in agg.to_numpy()]]
    return {"format": "servesim-deepep-tables", "version": 1,
            "key": "gpu|mode (ll, ht)|hidden|topk|experts|ep",
            "units": {"x": "tokens per EP rank", "y": "seconds of dispatch + combine, one MoE layer"},
            "sources": {g: [f"aiconfigurator/{f}/{n}" for n, _ in MODES.values()] for g, f in SOURCES.items()},
            "engine_versions": engine_versions(SOURCES),
            "attribution": AIC_ATTRIBUTION + "; file commit f678dbe3b6eca72fe6cfa24a2f94160896f2a809",
            "tables": tables}


def main() -> None:
    write_tables_main(__doc__.splitlines()[0], build, OUT, "curves")


if __name__ == "__main__":
    main()
