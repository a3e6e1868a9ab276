"""Paged-attention ops with two backends: ``"torch"`` (CPU/any device, the
reference) and ``"triton"`` (GPU, or CPU under ``TRITON_INTERPRET=1``).

Importing this package does not import triton; the triton backend is
imported on first use. Cache layout and conventions: docs/GPU_RUNNER.md.
"""

from __future__ import annotations

import os
import sys
from typing import Literal

import torch

from servesim.gpu_runner.ops import reference
from servesim.gpu_runner.ops.metadata import AttentionMetadata

Backend = Literal["torch", "triton"]
BACKENDS: tuple[Backend, ...] = ("torch", "triton")

__all__ = [
    "AttentionMetadata", "Backend", "BACKENDS", "backend_module", "reshape_and_cache", "unified_attention",
    "use_triton_interpreter",
]


def use_triton_interpreter() -> None:
    """Run the triton backend on CPU through the Triton interpreter.

    Must run before triton is first imported in the process: ``@triton.jit``
    (triton.language's helpers included) picks interpreter or compiler at
    import time. Raises if triton was already imported in compiler mode.
    """
    os.environ["TRITON_INTERPRET"] = "1"
    if "triton.language" in sys.modules:
        from triton.language import standard
        from triton.runtime.jit import JITFunction

        if isinstance(standard.zeros, JITFunction):
            raise RuntimeError("triton was imported before TRITON_INTERPRET=1 was set; set it earlier "
                               "(e.g. at the top of the test module, before any triton import)")


def backend_module(backend: Backend):
    """The module implementing ``backend`` (``reshape_and_cache``, ``unified_attention``)."""
    if backend == "torch":
        return reference
    if backend == "triton":
        from servesim.gpu_runner.ops import triton_kernels

        return triton_kernels
    raise ValueError(f"unknown attention backend {backend!r}; expected one of {BACKENDS}")


def reshape_and_cache(
    key: torch.Tensor,  # [T, KVH, D]
    value: torch.Tensor,  # [T, KVH, D]
    key_cache: torch.Tensor,  # [NB, BS, KVH, D]
    value_cache: torch.Tensor,  # [NB, BS, KVH, D]
    slot_mapping: torch.Tensor,  # [T] int64; -1 = padding token, not written
    *,
    backend: Backend = "torch",
) -> None:
    """Scatter the new tokens' keys and values into their cache slots (in place)."""
    backend_module(backend).reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)


def unified_attention(
    q: torch.Tensor,  # [T, H, D]
    key_cache: torch.Tensor,  # [NB, BS, KVH, D]
    value_cache: torch.Tensor,  # [NB, BS, KVH, D]
    out: torch.Tensor,  # [T, H, D]; written for every scheduled token
    query_start_loc: torch.Tensor,  # [S + 1] int32
    seq_lens: torch.Tensor,  # [S] int32
    block_table: torch.Tensor,  # [S, MB] int32
    scale: float,
    *,
    backend: Backend = "torch",
) -> None:
    """Causal attention of prefill chunks (over their cached prefix) and decodes, one call.

    Token i of sequence s (query length n) sits at position seq_lens[s] - n + i
    and attends to the keys at positions <= its own. H must be a multiple of KVH;
    query head h reads kv head h // (H // KVH).
    """
    backend_module(backend).unified_attention(
        q, key_cache, value_cache, out, query_start_loc, seq_lens, block_table, scale
    )
