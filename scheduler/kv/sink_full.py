"""SinkFullAttentionManager: full attention with sink_len learned "sink" tokens in front of every
sequence (vLLM 0.19.1's SinkFullAttentionManager, a FullAttentionManager).

The sink tokens' KV is shared by every request: the manager takes sink_len // block_size blocks
off the free queue once, when it is built (the first free blocks, right after the null block),
and never returns them. Everything else is full attention.
"""

from __future__ import annotations

from servesim.scheduler.kv.block_pool import BlockPool
from servesim.scheduler.kv.single_type import FullAttentionManager, KVCacheGroupSpec


class SinkFullAttentionManager(FullAttentionManager):
    def __init__(self, spec: KVCacheGroupSpec, block_pool: BlockPool, enable_caching: bool, group_id: int):
        super().__init__(spec, block_pool, enable_caching, group_id)
        sink_len = spec.sink_len
        if sink_len is None or sink_len <= 0 or sink_len % self.block_size:
            raise ValueError(f"a sink_full KV cache group needs sink_len > 0 tokens, a multiple of its block_size "
                             f"({self.block_size}), got {sink_len}")
        num_sink_blocks = sink_len // self.block_size
        if num_sink_blocks > block_pool.free_block_queue.num_free_blocks:
            raise ValueError(f"sink_len {sink_len} needs {num_sink_blocks} blocks; the pool has "
                             f"{block_pool.free_block_queue.num_free_blocks} free")
        # Off the free queue for good, with ref_cnt 0 (as vLLM: popped, never allocated).
        self.sink_blocks = block_pool.free_block_queue.popleft_n(num_sink_blocks)
