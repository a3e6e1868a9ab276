"""ChunkedLocalAttentionManager: layers that attend only within their fixed chunk of
attention_chunk_size tokens (Llama 4's local layers; vLLM 0.19.1's ChunkedLocalAttentionManager).

The next token sees only the tokens of its own chunk, so every block wholly before the current
chunk is skipped: nulled and freed (get_num_skipped_tokens), and a cache hit counts those blocks
as computed without looking them up (null placeholders), then needs the blocks of the current
chunk cached contiguously.
"""

from __future__ import annotations

from servesim.scheduler.kv.block import KVCacheBlock
from servesim.scheduler.kv.block_pool import BlockPool
from servesim.scheduler.kv.single_type import KVCacheGroupSpec, SingleTypeKVCacheManager


class ChunkedLocalAttentionManager(SingleTypeKVCacheManager):
    def __init__(self, spec: KVCacheGroupSpec, block_pool: BlockPool, enable_caching: bool, group_id: int):
        super().__init__(spec, block_pool, enable_caching, group_id)
        if spec.attention_chunk_size is None or spec.attention_chunk_size < 1:
            raise ValueError(f"a chunked_local KV cache group needs attention_chunk_size >= 1 tokens, "
                             f"got {spec.attention_chunk_size}")
        self.attention_chunk_size = spec.attention_chunk_size

    @classmethod
    def find_longest_cache_hit(cls, block_hashes, max_length, group_ids, block_pool, spec, use_eagle, alignment_tokens):
        # vLLM asserts both (the coordinator refuses them up front: kv/coordinator.py)
        assert not use_eagle, "eagle with chunked local attention"
        assert spec.block_size == alignment_tokens, "chunked local attention with other block sizes"
        block_size, chunk = spec.block_size, spec.attention_chunk_size
        max_num_blocks = max_length // block_size
        # blocks before the chunk holding position max_length are out of the window: computed
        start_block = (max_length // chunk * chunk if max_length > 0 else 0) // block_size
        computed: tuple[list[KVCacheBlock], ...] = tuple([block_pool.null_block] * start_block for _ in group_ids)
        for i in range(start_block, max_num_blocks):
            cached = block_pool.get_cached_block(block_hashes[i], group_ids)
            if cached is None:
                break
            for lst, blk in zip(computed, cached):
                lst.append(blk)
        return computed

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        # the tokens of the chunks before the next token's chunk
        return num_computed_tokens // self.attention_chunk_size * self.attention_chunk_size

    def get_num_common_prefix_blocks(self, running_request_id: str) -> int:
        return 0  # no cascade attention for chunked local attention
