"""A copy stream between host and device memory, as a FIFO clock.

Both KV host tiers use it: SGLang's HiCache (scheduler/sglang/hicache.py: a write and a load
stream) and vLLM's CPU offload tier (simulator/kv_offload.py: a store and a load stream); so do the
lanes of a P/D KV link (simulator/cluster/link.py, sharing "lanes"). Copies
issued on one stream run one after another, as kernels on one CUDA stream do; two streams
overlap each other and the compute. Invariant: ``free_at_s`` never decreases.
"""

from __future__ import annotations


class TransferStream:
    """One CUDA copy stream: copies run one after another."""

    __slots__ = ("free_at_s",)

    def __init__(self) -> None:
        self.free_at_s = 0.0

    def submit(self, now_s: float, duration_s: float) -> float:
        """End time of a copy issued at now_s."""
        self.free_at_s = max(now_s, self.free_at_s) + duration_s
        return self.free_at_s
