"""Measured MoE layer cost (aiconfigurator ``moe_perf``, shipped in ``data/moe_tables.json.gz``).

Two things per measured GPU, both rebuilt by ``tools/build_moe_tables.py``:

* **tables**: one curve per (GPU, expert weight format, hidden, expert width, experts, top-k,
  moe_tp, moe_ep, routing distribution) for the MoE shapes of servesim's model registry: seconds of
  one vLLM ``FusedMoE`` call on one GPU against the tokens that enter the layer there (router
  top-k, grouped expert GEMMs, weighted combine; no all-to-all). Under tensor parallelism vLLM
  splits every expert's width over the TP ranks (moe_tp = tp, moe_ep = 1); with
  ``--enable-expert-parallel`` it splits the experts instead (moe_tp = 1, moe_ep = tp x dp).
* **efficiency curves**: per (GPU, weight format), the measured time over the roofline's
  (roofline_moe.expert_roofline_s, at the GPU's fitted efficiencies, balanced routing) by tokens
  per expert T·k/E: the median ratio over every measured shape and layout in octave buckets.
  Where no table covers a deployment, the roofline's expert time is scaled by the curve of this
  GPU, else of a GPU of the same compute capability, else of its generation
  (specs/gpu_generation.py), else of the nearest compute capability, each choice named in the
  source.

Every table carries the engine version it was measured under (``engine_versions``).
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from ..specs import GpuSpec, ModelSpec, resolve_gpu
from ..specs.gpu_generation import compute_capability, gpu_generation
from .interp import Curve

_FILE = Path(__file__).with_name("data") / "moe_tables.json.gz"
# servesim weight format -> aiconfigurator moe_dtype. W8A8 fp8 checkpoints (compressed-tensors,
# per-channel) run vLLM's Triton fp8 MoE kernel, which the tables measured under fp8_block; their
# per-tensor "fp8" rows are ModelOpt's FlashInfer-CUTLASS path (slower than bf16 at small batches).
_DTYPES = {"bf16": "bfloat16", "fp16": "bfloat16", "fp8": "fp8_block", "fp8_block": "fp8_block",
           "int4": "int4_wo", "mxfp4": "w4a16_mxfp4", "nvfp4": "nvfp4"}
DISTRIBUTIONS = ("balanced", "power_law_1.01")


@dataclass(slots=True, frozen=True)
class MeasuredMoe:
    """What prices a deployment's routed experts from measurements: a table's seconds by tokens
    entering the layer, or an efficiency curve's achieved/roofline ratio by tokens per expert."""

    curve: Curve
    source: str  # for the cost model's moe_source, e.g. "measured table h100 vLLM 0.24.0 ..."
    engine_version: str  # "vllm 0.24.0": the engine the kernels were measured under


@cache
def _data() -> dict:
    if not _FILE.is_file():
        return {"tables": {}, "efficiency": {}, "engine_versions": {}}
    return json.loads(gzip.decompress(_FILE.read_bytes()))


def _version(gpu_name: str) -> str:
    return _data().get("engine_versions", {}).get(gpu_name, "unknown engine version")


def moe_curve(model: ModelSpec, gpu: GpuSpec, moe_tp: int, moe_ep: int,
              distribution: str = "balanced") -> MeasuredMoe | None:
    """The measured curve for this deployment, or None (then the roofline costs the experts)."""
    dtype = _DTYPES.get(model.experts_dtype)
    if dtype is None or not model.is_moe:
        return None
    key = "|".join(str(x) for x in (gpu.name, dtype, model.hidden_size, model.intermediate_size,
                                    model.num_experts, model.experts_per_token, moe_tp, moe_ep,
                                    distribution))
    pts = _data()["tables"].get(key)
    if pts is None:
        return None
    version = _version(gpu.name)
    return MeasuredMoe(Curve(pts[0], pts[1]), f"measured table {gpu.name} {version} (aiconfigurator moe_perf)",
                       version)


def moe_efficiency(model: ModelSpec, gpu: GpuSpec) -> MeasuredMoe | None:
    """The efficiency curve for this GPU and the experts' weight format (module docstring: which
    GPU's), or None when no GPU measured the format."""
    dtype = _DTYPES.get(model.experts_dtype)
    if dtype is None or not model.is_moe:
        return None
    have = [g for g in _data()["efficiency"] if g.endswith(f"|{dtype}")]
    if not have:
        return None
    measured = [resolve_gpu(k.split("|", 1)[0]) for k in have]
    cc, gen = compute_capability(gpu), gpu_generation(gpu)

    def rank(g: GpuSpec) -> tuple:  # this GPU, same part, same generation, nearest compute capability
        major, minor = compute_capability(g)
        return (g.name != gpu.name, (major, minor) != cc, gpu_generation(g) != gen,
                abs((major + minor / 10) - (cc[0] + cc[1] / 10)))

    src = min(measured, key=rank)  # ties: the file's order (build tool's SOURCES)
    xs, ys = _data()["efficiency"][f"{src.name}|{dtype}"]
    src_gen, src_cc = gpu_generation(src), compute_capability(src)
    why = f"{src.name} ({src_gen}" + (f", sm{src_cc[0]}{src_cc[1]}; this GPU is sm{cc[0]}{cc[1]}, a different part"
                                      if src_gen == gen and src_cc[0] != cc[0] else "") + ")"
    if src_gen != gen:
        why += f" [no {gen} curve measured: nearest generation]"
    version = _version(src.name)
    # a ratio, clamped at both ends (no extrapolation of the measured range)
    return MeasuredMoe(Curve(xs, ys, tail_slope=0.0),
                       f"efficiency curve from {why} {dtype}, {version} (aiconfigurator moe_perf)", version)
