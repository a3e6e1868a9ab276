"""Model, accelerator and host specs used by the cost models and the engine's memory sizing."""

from .gpus import GpuSpec, available_gpus, find_gpu, resolve_gpu
from .hosts import HostSpec, available_hosts, default_host, host_for, resolve_host
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
    "GpuSpec", "HostSpec", "MlaSpec", "ModelSpec", "available_gpus", "available_hosts", "available_models",
    "default_host", "find_gpu", "host_for", "kv_bytes_per_token", "layer_weight_elems", "model_from_hf_config",
    "register_model", "resolve_gpu", "resolve_host", "resolve_model", "weight_bytes", "with_precision",
]
