"""Pipeline parallelism: which layers each stage holds, and what that stage keeps in memory.

vLLM splits the decoder layers over the pipeline stages evenly, handing the remainder to the
stages just before the last (the last already holds the final norm and lm_head): vLLM's
`get_pp_indices` without VLLM_PP_LAYER_PARTITION. The first stage also holds the embedding, the
last the lm_head -- also when the model ties them, since the two live on different GPUs.

A model with dense-first layers (DeepSeek's first_k_dense_replace) has them at the front, so
they fall to the first stages.
"""

from __future__ import annotations

from servesim.traces.errors import InputError

from .model_spec import ModelSpec
from .models import kv_bytes_per_token, weight_parts


def pp_layer_partition(num_layers: int, pp: int) -> tuple[int, ...]:
    """Decoder layers per stage, first to last (sums to num_layers)."""
    if not isinstance(pp, int) or isinstance(pp, bool) or pp < 1:
        raise InputError(f"pipeline-parallel degree must be a positive integer, got {pp!r}", field="pp")
    if pp > num_layers:
        raise InputError(f"{num_layers} layers cannot fill {pp} pipeline stages", field="pp",
                         allowed=f"1 to {num_layers}")
    parts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):  # the remainder goes to the stages before the last
        parts[-i] += 1
    return tuple(parts)


def stage_weight_bytes(model: ModelSpec, tp: int, pp: int) -> list[int]:
    """Weight bytes on one GPU of each stage (tensor parallel within the stage)."""
    per_layer, dense, moe, embed, lm_head = weight_parts(model, tp)
    out, first = [], 0
    parts = pp_layer_partition(model.num_layers, pp)
    for s, n in enumerate(parts):
        n_dense = max(0, min(first + n, model.dense_mlp_layers) - first)
        total = n * per_layer + n_dense * dense + (n - n_dense) * moe  # a dense model: n_dense = n
        head = (embed if s == 0 else 0)
        if s == pp - 1:  # lm_head (a tied one too, unless one stage holds both) + final norm
            head += (lm_head if pp > 1 or not model.tied_embeddings else 0) + model.hidden_size
        out.append(int(total + head * model.dtype_bytes))
        first += n
    return out


def stage_kv_bytes_per_token(model: ModelSpec, tp: int, pp: int) -> list[int]:
    """KV-cache bytes one token occupies on one GPU of each stage (its layers only)."""
    per_token = kv_bytes_per_token(model, tp)  # all layers; every layer holds the same per token
    return [per_token * n // model.num_layers for n in pp_layer_partition(model.num_layers, pp)]
