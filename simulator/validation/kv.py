"""KV-cache capacity for replaying a measured run: recorded, given, or derived like vLLM does.

vLLM V1 sizes the KV pool after a profiling forward pass:

    available = gpu_memory_utilization * total - weights - peak_activation - non_torch
    num_gpu_blocks = available // (block_size * kv_bytes_per_token / tp)

``simulator/kv_capacity.py`` implements the formula with a fixed activation reserve
(``hardware.activation_reserve_gib``, default 2 GiB). For a run we estimate the reserve from what
the profiling pass actually allocates for this run's settings instead:

* the largest live set of one decoder layer at ``max_num_batched_tokens`` tokens: residual +
  normed input + gate_up output + activation output = T * (2 h + 3 i / tp) elements;
* the dummy sampler pass over ``max_num_seqs`` rows of fp32 logits (V1 computes logits only for
  sampled rows): logits, probabilities and log-probabilities, 3 * rows * vocab * 4 bytes;
* a fixed 1 GiB for non-torch allocations (cuBLAS workspaces, NCCL/custom all-reduce buffers) and
  the CUDA-graph memory pool, which vLLM does not subtract exactly. This constant is an estimate,
  not a measurement; the report says which source was used and how much the pool would change
  with the project default instead.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from servesim.simulator.kv_capacity import derive_num_gpu_blocks
from servesim.simulator.specs import resolve_model

FIXED_OVERHEAD_GIB = 1.0
SAMPLER_COPIES = 3


def estimate_activation_reserve_gib(model: str, tp: int, max_num_batched_tokens: int, max_num_seqs: int) -> float:
    spec = resolve_model(model)
    t = max_num_batched_tokens
    layer = t * (2 * spec.hidden_size + 3 * spec.intermediate_size // tp) * spec.dtype_bytes
    rows = min(max_num_seqs, max_num_batched_tokens)
    sampler = SAMPLER_COPIES * rows * spec.vocab_size * 4
    return (max(layer, sampler) + FIXED_OVERHEAD_GIB * 2**30) / 2**30


@dataclass(slots=True)
class KvChoice:
    num_gpu_blocks: int
    source: str  # "recorded" | "given" | "derived"
    detail: str
    activation_reserve_gib: float | None = None
    blocks_with_project_default_reserve: int | None = None
    tokens: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def choose_kv_blocks(model: str, gpu: str, tp: int, block_size: int, gpu_memory_utilization: float,
                     max_num_batched_tokens: int, max_num_seqs: int, recorded: int | None = None,
                     given: int | None = None, pp: int = 1, data_parallel_size: int = 1) -> KvChoice:
    """Recorded in the run > given on the command line > derived from memory (vLLM's formula)."""
    if recorded is not None:
        return KvChoice(int(recorded), "recorded", "num_gpu_blocks recorded by the run",
                        tokens=int(recorded) * block_size)
    if given is not None:
        return KvChoice(int(given), "given", "--num-gpu-blocks", tokens=int(given) * block_size)
    reserve = estimate_activation_reserve_gib(model, tp, max_num_batched_tokens, max_num_seqs)
    cap = derive_num_gpu_blocks(model, gpu, tp, block_size, gpu_memory_utilization, reserve, pp=pp,
                                data_parallel_size=data_parallel_size)
    default = derive_num_gpu_blocks(model, gpu, tp, block_size, gpu_memory_utilization, 2.0, pp=pp,
                                    data_parallel_size=data_parallel_size)
    detail = (f"derived: {gpu_memory_utilization:g} x GPU memory - weights - {reserve:.2f} GiB activation "
              f"peak (estimated for max_num_batched_tokens={max_num_batched_tokens}, "
              f"max_num_seqs={max_num_seqs}) -> {cap.num_gpu_blocks} blocks of {block_size} tokens")
    return KvChoice(cap.num_gpu_blocks, "derived", detail, reserve, default.num_gpu_blocks,
                    cap.num_gpu_blocks * block_size)
