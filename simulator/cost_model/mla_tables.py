"""Measured MLA decode attention (aiconfigurator ``generation_mla_perf``, shipped in
``data/mla_tables.json.gz``, rebuilt by ``tools/build_mla_tables.py``).

One grid per (GPU, KV-cache dtype, query heads per GPU): seconds of one layer's MLA decode attention
kernel on one GPU (vLLM 0.14: FlashAttention-MLA for a bf16 cache and FlashMLA for fp8 on Hopper,
Triton MLA on A100 / L40S) over (decode requests in the batch, context tokens each). The roofline
uses it for the decodes of MLA models (DeepSeek-V2/V3 style) where it covers the deployment;
prefill chunks stay on the roofline (the context tables time a different, unabsorbed kernel path).
"""

from __future__ import annotations

import gzip
import json
from functools import cache
from pathlib import Path

from ..specs import GpuSpec, ModelSpec
from .interp import NestedGrid

_FILE = Path(__file__).with_name("data") / "mla_tables.json.gz"


@cache
def _tables() -> dict[str, dict]:
    if not _FILE.is_file():
        return {}
    return json.loads(gzip.decompress(_FILE.read_bytes()))["tables"]


def mla_decode_grid(model: ModelSpec, gpu: GpuSpec, tp: int) -> NestedGrid | None:
    """The measured (batch, context) -> seconds grid for this deployment, or None."""
    if model.mla is None:
        return None
    kv = "fp8" if model.kv_bytes_per_elem == 1 else "bfloat16"
    d = _tables().get(f"{gpu.name}|{kv}|{model.heads_per_gpu(tp)}")
    return None if d is None else NestedGrid.from_dict(d)
