"""Model and accelerator specs used by the cost models and the engine's memory sizing."""

from .gpus import GpuSpec, available_gpus, find_gpu, resolve_gpu
from .models import (
    MlaSpec,
    ModelSpec,
    available_models,
    kv_bytes_per_token,
    layer_weight_elems,
    model_from_hf_config,
    register_model,
    resolve_model,
    weight_bytes,
    with_precision,
)

__all__ = [
    "GpuSpec", "MlaSpec", "ModelSpec", "available_gpus", "available_models", "find_gpu", "kv_bytes_per_token",
    "layer_weight_elems", "model_from_hf_config", "register_model", "resolve_gpu", "resolve_model", "weight_bytes", "with_precision",
]
