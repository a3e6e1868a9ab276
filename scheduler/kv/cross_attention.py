"""vLLM 0.19.1's CrossAttentionManager (v1/core/single_type_kv_cache_manager.py): the KV blocks of an
encoder-decoder model's cross-attention layers.

They hold the encoder's output states of one request (Whisper's audio, a BART source text), sized by
its encoder tokens, so nothing is shared between requests: no prefix-cache hits, no cached blocks,
no common prefix. Allocation itself is the base class's (blocks for the tokens asked); vLLM's
coordinator asks a cross-attention group for `num_encoder_tokens` slots instead of the decoder's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from servesim.scheduler.kv.block import KVCacheBlock
from servesim.scheduler.kv.single_type import SingleTypeKVCacheManager

if TYPE_CHECKING:
    from servesim.scheduler.request import Request


class CrossAttentionManager(SingleTypeKVCacheManager):
    def allocate_new_computed_blocks(self, request_id: str, new_computed_blocks: Sequence[KVCacheBlock],
                                     num_local_computed_tokens: int, num_external_computed_tokens: int) -> None:
        # Cross-attention blocks are never shared, so a lookup never hands this group any.
        assert len(new_computed_blocks) == 0

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        raise ValueError("cross-attention blocks are never cached (prefix caching is off for encoder-decoder models)")

    def get_num_common_prefix_blocks(self, running_request_id: str) -> int:
        return 0  # request-specific encoder states

    @classmethod
    def find_longest_cache_hit(cls, block_hashes, max_length, group_ids, block_pool, spec, use_eagle, alignment_tokens):
        raise NotImplementedError("CrossAttentionManager does not support caching")
