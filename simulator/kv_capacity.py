"""KV capacity: how many blocks vLLM would get on a GPU, when a run does not record it.

vLLM profiles a forward pass, then gives the KV cache whatever fits under
gpu_memory_utilization x memory after weights and peak activations:
    blocks = (util * mem - weights/tp - activations) // (block_size * kv_bytes_per_token/tp)
With pipeline parallelism every stage's GPUs hold their layers' weights and KV only, and the
engine's pool is the smallest any stage can hold (vLLM gives all workers the minimum block count).
We model the activation peak as a fixed reserve per GPU (configurable). Both terms follow the
model spec's precision and architecture (simulator/specs): weights in their stored format with
scales (fp8, int4, nvfp4, mxfp4 ...), KV bytes per token from the KV-cache dtype (``auto`` or fp8),
GQA heads per GPU, or MLA's latent (kv_lora_rank + rope dims, the same on every TP rank).
A hybrid model (sliding-window, chunked or Mamba layers) is sized by its KV cache groups
(simulator/kv_groups.py: vLLM's page x group size per block).
"""

from __future__ import annotations

from dataclasses import dataclass

from servesim.simulator.kv_groups import KvLayout, stage_ranges
from servesim.simulator.specs import GpuSpec, ModelSpec, resolve_gpu, resolve_model
from servesim.simulator.specs.models import kv_bytes_per_token, weight_bytes
from servesim.simulator.specs.pipeline_stages import stage_kv_bytes_per_token, stage_weight_bytes
from servesim.traces.errors import InputError


@dataclass(slots=True, frozen=True)
class KvCapacity:
    num_gpu_blocks: int  # blocks per GPU pool (vLLM's num_gpu_blocks)
    kv_bytes_per_block: int  # per GPU
    free_bytes: int  # per GPU, for KV
    source: str  # "derived" or "configured"


def derive_num_gpu_blocks(model: str, gpu: str, tp: int, block_size: int, gpu_memory_utilization: float,
                          activation_reserve_gib: float, pp: int = 1, data_parallel_size: int = 1,
                          layout: KvLayout | None = None) -> KvCapacity:
    """The pool of one engine: of a tp x pp deployment, one DP rank of data_parallel_size (whose
    GPUs hold 1/(tp x dp) of an MoE model's routed experts: vLLM shards them over the DP group).
    ``layout``: a hybrid model's KV cache groups (simulator/kv_groups.py), which size the pool
    as vLLM's hybrid manager does; None: every attention layer holds a page of each block."""
    m, g = resolve_model(model), resolve_gpu(gpu)
    reserve = activation_reserve_gib * 2**30
    if data_parallel_size > 1 and pp > 1:
        raise InputError("data-parallel ranks with pipeline stages are not modelled", field="hardware.pp",
                         allowed="1 with data parallelism")
    if layout is not None:
        return _derive_grouped(m, g, tp, pp, data_parallel_size, gpu_memory_utilization, reserve, layout)
    if pp == 1:
        stages = [(weight_bytes(m, tp, tp * data_parallel_size), kv_bytes_per_token(m, tp))]
    else:
        stages = list(zip(stage_weight_bytes(m, tp, pp), stage_kv_bytes_per_token(m, tp, pp)))
    best = None
    for weights, kv_per_token in stages:
        per_block = kv_per_token * block_size
        budget = gpu_memory_utilization * g.memory_bytes - weights - reserve
        if budget < per_block * 2:
            where = f"tp={tp}" if pp == 1 else f"tp={tp}, pp={pp}"
            raise InputError(
                f"{m.name} at {where} does not fit on {g.name} ({g.memory_gib:g} GiB x {gpu_memory_utilization}): "
                f"weights take {weights / 2**30:.1f} GiB per GPU, leaving no room for a KV cache",
                field="hardware", allowed="a larger GPU, a higher tp or pp, or a smaller model")
        cap = KvCapacity(int(budget // per_block), per_block, int(budget), "derived")
        if best is None or cap.num_gpu_blocks < best.num_gpu_blocks:
            best = cap
    assert best is not None
    return best


def _derive_grouped(m: ModelSpec, g: GpuSpec, tp: int, pp: int, dp: int, util: float, reserve: float,
                    layout: KvLayout) -> KvCapacity:
    """Every stage's KV memory over the layout's page x group size (vLLM's get_num_blocks); the
    engine runs with the smallest stage's count (get_kv_cache_configs)."""
    weights = [weight_bytes(m, tp, tp * dp)] if pp == 1 else stage_weight_bytes(m, tp, pp)
    stages = stage_ranges(m.num_layers, pp)
    per_block = layout.page_size_bytes * layout.group_size
    best = None
    for w, layers in zip(weights, stages):
        budget = int(util * g.memory_bytes - w - reserve)
        blocks = layout.num_blocks(budget, (layers,))
        if blocks < 2:
            where = f"tp={tp}" if pp == 1 else f"tp={tp}, pp={pp}"
            raise InputError(
                f"{m.name} at {where} does not fit on {g.name} ({g.memory_gib:g} GiB x {util}): "
                f"weights take {w / 2**30:.1f} GiB per GPU, leaving no room for a KV cache",
                field="hardware", allowed="a larger GPU, a higher tp or pp, or a smaller model")
        if best is None or blocks < best.num_gpu_blocks:
            best = KvCapacity(blocks, per_block, budget, "derived")
    assert best is not None
    return best
