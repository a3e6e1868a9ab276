"""KV capacity: how many blocks vLLM would get on a GPU, when a run does not record it.

vLLM profiles a forward pass, then gives the KV cache whatever fits under
gpu_memory_utilization x memory after weights and peak activations:
    blocks = (util * mem - weights/tp - activations) // (block_size * kv_bytes_per_token/tp)
We model the activation peak as a fixed reserve per GPU (configurable). Both terms follow the
model spec's precision and architecture (simulator/specs): weights in their stored format with
scales (fp8, int4, nvfp4, mxfp4 ...), KV bytes per token from the KV-cache dtype (``auto`` or fp8),
GQA heads per GPU, or MLA's latent (kv_lora_rank + rope dims, the same on every TP rank).
"""

from __future__ import annotations

from dataclasses import dataclass

from servesim.simulator.specs import resolve_gpu, resolve_model
from servesim.simulator.specs.models import kv_bytes_per_token, weight_bytes
from servesim.traces.errors import InputError


@dataclass(slots=True, frozen=True)
class KvCapacity:
    num_gpu_blocks: int  # blocks per GPU pool (vLLM's num_gpu_blocks)
    kv_bytes_per_block: int  # per GPU
    free_bytes: int  # per GPU, for KV
    source: str  # "derived" or "configured"


def derive_num_gpu_blocks(model: str, gpu: str, tp: int, block_size: int, gpu_memory_utilization: float,
                          activation_reserve_gib: float) -> KvCapacity:
    m, g = resolve_model(model), resolve_gpu(gpu)
    per_block = kv_bytes_per_token(m, tp) * block_size
    budget = gpu_memory_utilization * g.memory_bytes - weight_bytes(m, tp) - activation_reserve_gib * 2**30
    if budget < per_block * 2:
        raise InputError(
            f"{m.name} at tp={tp} does not fit on {g.name} ({g.memory_gib:g} GiB x {gpu_memory_utilization}): "
            f"weights take {weight_bytes(m, tp) / 2**30:.1f} GiB per GPU, leaving no room for a KV cache",
            field="hardware", allowed="a larger GPU, a higher tp, or a smaller model")
    return KvCapacity(int(budget // per_block), per_block, int(budget), "derived")
