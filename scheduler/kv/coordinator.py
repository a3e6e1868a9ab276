"""Coordinators: spread each KV-manager call over the KV cache groups.

- NoPrefixCache: caching off; any number of groups; never hits.
- Unitary: one group (the common case).
- Hybrid: several groups (e.g. full + sliding window); the hit length is the fixed point where
  every attention type accepts it.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import lcm
from typing import TYPE_CHECKING

from servesim.scheduler.kv.block import KVCacheBlock
from servesim.scheduler.kv.block_pool import BlockPool
from servesim.scheduler.kv.kinds import MANAGERS
from servesim.scheduler.kv.single_type import KVCacheGroupSpec, SingleTypeKVCacheManager, full_attention_hit

if TYPE_CHECKING:
    from servesim.scheduler.request import Request

BlocksByGroup = tuple[Sequence[KVCacheBlock], ...]


class KVCacheCoordinator:
    def __init__(self, groups: Sequence[KVCacheGroupSpec], num_blocks: int, enable_caching: bool,
                 use_eagle: bool, enable_kv_cache_events: bool):
        self.groups = tuple(groups)
        self.enable_caching = enable_caching
        self.use_eagle = use_eagle
        self.block_pool = BlockPool(num_blocks, enable_caching, enable_kv_cache_events)
        # One registry lookup per group here (unknown kinds get a did-you-mean); the cache-hit
        # search below reuses the classes.
        self._manager_types: dict[str, type[SingleTypeKVCacheManager]] = {
            g.kind: MANAGERS.get(g.kind) for g in self.groups}
        if enable_caching and use_eagle and "chunked_local" in self._manager_types:
            # vLLM asserts this in ChunkedLocalAttentionManager.find_longest_cache_hit
            raise ValueError("eagle speculative decoding with a chunked_local KV cache group and prefix caching: "
                             "vLLM 0.19.1 does not support it")
        self.managers: tuple[SingleTypeKVCacheManager, ...] = tuple(
            self._manager_types[g.kind](g, self.block_pool, enable_caching, i) for i, g in enumerate(self.groups)
        )
        # Cross-attention groups (encoder-decoder) are sized by the encoder's tokens, not the decoder's.
        self.is_cross = tuple(g.kind == "cross_attention" for g in self.groups)

    def get_num_blocks_to_allocate(self, request_id: str, num_tokens: int, new_computed_blocks: BlocksByGroup,
                                   total_computed_tokens: int, num_tokens_main_model: int,
                                   num_encoder_tokens: int = 0) -> int:
        """Blocks the request needs for num_tokens slots; a cross-attention group asks for one static
        allocation of num_encoder_tokens instead (0 after admission: nothing more), as vLLM."""
        total = 0
        for i, m in enumerate(self.managers):
            if self.is_cross[i]:
                total += m.get_num_blocks_to_allocate(request_id, num_encoder_tokens, (), 0, num_encoder_tokens)
            else:
                total += m.get_num_blocks_to_allocate(request_id, num_tokens, new_computed_blocks[i],
                                                      total_computed_tokens, num_tokens_main_model)
        return total

    def allocate_new_computed_blocks(self, request_id: str, new_computed_blocks: BlocksByGroup,
                                     num_local_computed_tokens: int, num_external_computed_tokens: int) -> None:
        for i, m in enumerate(self.managers):
            m.allocate_new_computed_blocks(
                request_id, new_computed_blocks[i], num_local_computed_tokens, num_external_computed_tokens
            )

    def allocate_new_blocks(self, request_id: str, num_tokens: int, num_tokens_main_model: int,
                            num_encoder_tokens: int = 0) -> BlocksByGroup:
        cross = self.is_cross
        return tuple(m.allocate_new_blocks(request_id, num_encoder_tokens if cross[i] else num_tokens,
                                           num_tokens_main_model) for i, m in enumerate(self.managers))

    def new_step_starts(self) -> None:
        for m in self.managers:
            m.new_step_starts()

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        for m in self.managers:
            m.cache_blocks(request, num_computed_tokens)

    def free(self, request_id: str) -> None:
        for m in self.managers:
            m.free(request_id)

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        return [m.get_num_common_prefix_blocks(running_request_id) for m in self.managers]

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> None:
        for m in self.managers:
            m.remove_skipped_blocks(request_id, total_computed_tokens)

    def get_blocks(self, request_id: str) -> BlocksByGroup:
        return tuple(m.req_to_blocks.get(request_id) or [] for m in self.managers)

    def find_longest_cache_hit(self, block_hashes: list[bytes], max_cache_hit_length: int) -> tuple[BlocksByGroup, int]:
        raise NotImplementedError


class KVCacheCoordinatorNoPrefixCache(KVCacheCoordinator):
    def __init__(self, groups, num_blocks, use_eagle, enable_kv_cache_events):
        super().__init__(groups, num_blocks, False, use_eagle, enable_kv_cache_events)

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        return [0] * len(self.managers)

    def find_longest_cache_hit(self, block_hashes, max_cache_hit_length):
        return tuple([] for _ in self.managers), 0


class UnitaryKVCacheCoordinator(KVCacheCoordinator):
    def __init__(self, groups, num_blocks, enable_caching, use_eagle, enable_kv_cache_events):
        super().__init__(groups, num_blocks, enable_caching, use_eagle, enable_kv_cache_events)
        assert len(self.groups) == 1
        self.spec = self.groups[0]
        self.block_size = self.spec.block_size
        # plain full attention: its manager's lookup is full_attention_hit, called directly (a
        # router reads every replica's cache at every decision; the classmethod call is generic)
        self._full = self.spec.kind == "full"

    def find_longest_cache_hit(self, block_hashes, max_cache_hit_length):
        if self._full:
            hit = full_attention_hit(block_hashes, max_cache_hit_length, [0], self.block_pool, self.spec,
                                     self.use_eagle, self.block_size)
        else:
            hit = type(self.managers[0]).find_longest_cache_hit(
                block_hashes, max_cache_hit_length, [0], self.block_pool, self.spec, self.use_eagle, self.block_size
            )
        return hit, len(hit[0]) * self.block_size


class HybridKVCacheCoordinator(KVCacheCoordinator):
    def __init__(self, groups, num_blocks, enable_caching, use_eagle, enable_kv_cache_events):
        super().__init__(groups, num_blocks, enable_caching, use_eagle, enable_kv_cache_events)
        # Merge identical specs into one lookup; full attention first (vLLM: its left-to-right
        # scan gives the tightest first bound). sorted() is stable: group order otherwise.
        merged: list[tuple[KVCacheGroupSpec, list[int]]] = []
        for i, spec in enumerate(self.groups):
            for existing, ids in merged:
                if existing == spec:
                    ids.append(i)
                    break
            else:
                merged.append((spec, [i]))
        if len(merged) < 2:
            raise ValueError("a hybrid KV cache needs at least two different attention groups")
        self.attention_groups = sorted(merged, key=lambda x: not self._manager_types[x[0].kind].is_full_attention)
        self.lcm_block_size = lcm(*(spec.block_size for spec, _ in merged))
        # Block hashes are computed at the scheduler's block size; vLLM re-chunks them for groups
        # with a larger block size (BlockHashListWithBlockSize). Not ported: with prefix caching on
        # vLLM gives hybrid Mamba models one block size (mamba_block_size = block_size).
        if len({spec.block_size for spec, _ in merged}) != 1:
            raise ValueError("with prefix caching on, every KV cache group must have the same block_size "
                             f"(got {sorted({spec.block_size for spec, _ in merged})})")

    def find_longest_cache_hit(self, block_hashes, max_cache_hit_length):
        """Shrink the candidate length until every attention type accepts it (a fixed point)."""
        hit_by_group: list[list[KVCacheBlock] | None] = [None] * len(self.groups)
        hit_length = max_cache_hit_length
        types = self._manager_types
        simple = len(self.attention_groups) == 2 and types[self.attention_groups[0][0].kind].is_full_attention
        while True:
            curr = hit_length
            for spec, ids in self.attention_groups:
                cached = hit_by_group[ids[0]]
                if types[spec.kind].is_full_attention and cached is not None:
                    # A full-attention hit of length L contains every shorter prefix.
                    curr = curr // spec.block_size * spec.block_size
                    continue
                hit = types[spec.kind].find_longest_cache_hit(
                    block_hashes, curr, ids, self.block_pool, spec, self.use_eagle, self.lcm_block_size
                )
                curr = len(hit[0]) * spec.block_size
                for gid, blocks in zip(ids, hit):
                    hit_by_group[gid] = blocks
            if curr >= hit_length:
                break
            hit_length = curr
            if simple:
                break
        spec, ids = self.attention_groups[0]
        if types[spec.kind].is_full_attention:
            n = hit_length // spec.block_size
            for gid in ids:
                if hit_by_group[gid] is not None:
                    del hit_by_group[gid][n:]
        return tuple(b if b is not None else [] for b in hit_by_group), hit_length


def make_coordinator(groups: Sequence[KVCacheGroupSpec], num_blocks: int, enable_caching: bool,
                     use_eagle: bool, enable_kv_cache_events: bool) -> KVCacheCoordinator:
    if not enable_caching:
        return KVCacheCoordinatorNoPrefixCache(groups, num_blocks, use_eagle, enable_kv_cache_events)
    if len(groups) == 1:
        return UnitaryKVCacheCoordinator(groups, num_blocks, enable_caching, use_eagle, enable_kv_cache_events)
    return HybridKVCacheCoordinator(groups, num_blocks, enable_caching, use_eagle, enable_kv_cache_events)
