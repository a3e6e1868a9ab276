"""Measured MoE layer cost (aiconfigurator ``moe_perf``, shipped in ``data/moe_tables.json.gz``).

One curve per (GPU, expert weight format, hidden, expert width, experts, top-k, moe_tp, moe_ep,
routing distribution): seconds of one vLLM ``FusedMoE`` call on one GPU against the tokens that
enter the layer there (router top-k, grouped expert GEMMs, weighted combine; no all-to-all).
Rebuilt by ``tools/build_moe_tables.py``. Under tensor parallelism vLLM splits every expert's
width over the TP ranks (moe_tp = tp, moe_ep = 1); with ``--enable-expert-parallel`` it splits the
experts instead (moe_tp = 1, moe_ep = tp x dp).
"""

from __future__ import annotations

import gzip
import json
from functools import cache
from pathlib import Path

from ..specs import GpuSpec, ModelSpec
from .interp import Curve

_FILE = Path(__file__).with_name("data") / "moe_tables.json.gz"
# servesim weight format -> aiconfigurator moe_dtype. W8A8 fp8 checkpoints (compressed-tensors,
# per-channel) run vLLM's Triton fp8 MoE kernel, which the tables measured under fp8_block; their
# per-tensor "fp8" rows are ModelOpt's FlashInfer-CUTLASS path (slower than bf16 at small batches).
_DTYPES = {"bf16": "bfloat16", "fp16": "bfloat16", "fp8": "fp8_block", "fp8_block": "fp8_block",
           "int4": "int4_wo", "mxfp4": "w4a16_mxfp4", "nvfp4": "nvfp4"}
DISTRIBUTIONS = ("balanced", "power_law_1.01")


@cache
def _tables() -> dict[str, list]:
    if not _FILE.is_file():
        return {}
    return json.loads(gzip.decompress(_FILE.read_bytes()))["tables"]


def moe_curve(model: ModelSpec, gpu: GpuSpec, moe_tp: int, moe_ep: int,
              distribution: str = "balanced") -> Curve | None:
    """The measured curve for this deployment, or None (then the roofline costs the experts)."""
    dtype = _DTYPES.get(model.experts_dtype)
    if dtype is None or not model.is_moe:
        return None
    key = "|".join(str(x) for x in (gpu.name, dtype, model.hidden_size, model.intermediate_size,
                                    model.num_experts, model.experts_per_token, moe_tp, moe_ep,
                                    distribution))
    pts = _tables().get(key)
    return None if pts is None else Curve(pts[0], pts[1])
