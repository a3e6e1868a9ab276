"""SinkFullAttentionManager: full attention with sink_len learned "sink" tokens in front of every
sequence (vLLM 0.19.1's SinkFullAttentionManager, a FullAttentionManager subclass there; here a
manager of its own that shares full attention's hit search and common-prefix count, functions of
single_type.py, so no class sits three deep).

The sink tokens' KV is shared by every request: the manager takes sink_len // block_size blocks
off the free queue once, when it is built (the first free blocks, right after the null block),
and never returns them. Everything else is full attention.
"""

from __future__ import annotations

from typing import ClassVar

from servesim.scheduler.kv.block_pool import BlockPool
from servesim.scheduler.kv.single_type import (
    KVCacheGroupSpec, SingleTypeKVCacheManager, full_attention_hit, num_common_prefix_blocks,
)


class SinkFullAttentionManager(SingleTypeKVCacheManager):
    is_full_attention: ClassVar[bool] = True  # vLLM's SinkFullAttentionSpec is a FullAttentionSpec

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

    @classmethod
    def find_longest_cache_hit(cls, block_hashes, max_length, group_ids, block_pool, spec, use_eagle, alignment_tokens):
        return full_attention_hit(block_hashes, max_length, group_ids, block_pool, spec, use_eagle, alignment_tokens)

    def get_num_common_prefix_blocks(self, running_request_id: str) -> int:
        return num_common_prefix_blocks(self.req_to_blocks, running_request_id)
