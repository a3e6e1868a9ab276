"""Per-attention-type block managers: full attention and sliding window.

Each manager owns req_to_blocks (the block table of every request holding KV) for one KV cache
group; all groups share one BlockPool.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from servesim.scheduler.kv.block import KVCacheBlock
from servesim.scheduler.kv.block_pool import BlockPool

if TYPE_CHECKING:
    from servesim.scheduler.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(slots=True, frozen=True)
class KVCacheGroupSpec:
    """One KV cache group: the layers that share a block table (vLLM's KVCacheGroupSpec with its
    layer spec folded in). ``kind`` names the group's manager in ``MANAGERS``
    (scheduler/kv/kinds.py); each kind reads only its own fields below."""

    kind: str  # a name in MANAGERS: "full", "sliding_window", ...
    block_size: int  # tokens per block
    sliding_window: int | None = None  # tokens, for kind == "sliding_window"
    attention_chunk_size: int | None = None  # tokens, for kind == "chunked_local"
    sink_len: int | None = None  # tokens, for kind == "sink_full"
    # For kind == "mamba": vLLM's CacheConfig.mamba_cache_mode ("none" | "align" | "all") and the
    # extra state blocks kept for speculative decoding (MambaSpec.num_speculative_blocks).
    mamba_cache_mode: str = "none"
    num_speculative_blocks: int = 0


class SingleTypeKVCacheManager:
    # vLLM's isinstance(spec, FullAttentionSpec): the hybrid coordinator searches these groups
    # first and shrinks their hit in place (a full-attention hit holds every shorter prefix).
    is_full_attention: ClassVar[bool] = False

    def __init__(self, spec: KVCacheGroupSpec, block_pool: BlockPool, enable_caching: bool, group_id: int):
        self.spec = spec
        self.block_size = spec.block_size
        self.block_pool = block_pool
        self.enable_caching = enable_caching
        self.group_id = group_id
        self.req_to_blocks: defaultdict[str, list[KVCacheBlock]] = defaultdict(list)
        # request id -> number of its leading blocks already in the prefix cache. Only running
        # requests (or requests that got hits) are tracked; membership is vLLM's fast path.
        self.num_cached_block: dict[str, int] = {}
        self._null_block = block_pool.null_block

    # --- sizing ------------------------------------------------------------------------------
    def get_num_blocks_to_allocate(
        self, request_id: str, num_tokens: int, new_computed_blocks: Sequence[KVCacheBlock],
        total_computed_tokens: int, num_tokens_main_model: int,
    ) -> int:
        """Blocks the request still needs for num_tokens slots, counting hits that must leave the
        free queue (they reduce free capacity just like new blocks). num_tokens_main_model is
        num_tokens without the drafter's lookahead slots (only Mamba's align mode reads it)."""
        num_required = cdiv(num_tokens, self.block_size)
        num_req_blocks = len(self.req_to_blocks.get(request_id, ()))
        if request_id in self.num_cached_block:
            assert not new_computed_blocks  # a running request gets no new prefix hits
            return max(num_required - num_req_blocks, 0)
        num_skipped_blocks = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
        num_local_computed_blocks = len(new_computed_blocks) + num_req_blocks
        num_new_blocks = max(num_required - max(num_skipped_blocks, num_local_computed_blocks), 0)
        skip_in_new = max(0, num_skipped_blocks - num_req_blocks)
        num_evictable = sum(1 for b in new_computed_blocks[skip_in_new:] if b.ref_cnt == 0 and not b.is_null)
        return num_new_blocks + num_evictable

    # --- allocation --------------------------------------------------------------------------
    def allocate_new_computed_blocks(
        self, request_id: str, new_computed_blocks: Sequence[KVCacheBlock],
        num_local_computed_tokens: int, num_external_computed_tokens: int,
    ) -> None:
        if request_id in self.num_cached_block:
            assert not new_computed_blocks
            return
        req_blocks = self.req_to_blocks[request_id]
        assert not req_blocks
        total = num_local_computed_tokens + num_external_computed_tokens
        num_skipped_tokens = self.get_num_skipped_tokens(total)
        num_skipped_blocks = num_skipped_tokens // self.block_size
        if num_skipped_blocks > 0:
            new_computed_blocks = new_computed_blocks[num_skipped_blocks:]
            num_external_computed_tokens = min(total - num_skipped_tokens, num_external_computed_tokens)
        if self.enable_caching:
            self.block_pool.touch(new_computed_blocks)
        req_blocks.extend([self._null_block] * num_skipped_blocks)
        req_blocks.extend(new_computed_blocks)
        self.num_cached_block[request_id] = len(req_blocks)
        if num_external_computed_tokens > 0:
            req_blocks.extend(self.block_pool.get_new_blocks(cdiv(total, self.block_size) - len(req_blocks)))

    def allocate_new_blocks(self, request_id: str, num_tokens: int, num_tokens_main_model: int) -> list[KVCacheBlock]:
        req_blocks = self.req_to_blocks[request_id]
        num_new = cdiv(num_tokens, self.block_size) - len(req_blocks)
        if num_new <= 0:
            return []
        new_blocks = self.block_pool.get_new_blocks(num_new)
        req_blocks.extend(new_blocks)
        return new_blocks

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        num_cached = self.num_cached_block.get(request.request_id, 0)
        num_full = num_tokens // self.block_size
        if num_cached >= num_full:
            return
        self.block_pool.cache_full_blocks(
            request, self.req_to_blocks[request.request_id], num_cached, num_full, self.block_size, self.group_id
        )
        self.num_cached_block[request.request_id] = num_full

    def free(self, request_id: str) -> None:
        # Reverse order: the tail of the chain (most request-specific) is evicted first.
        req_blocks = self.req_to_blocks.pop(request_id, [])
        self.block_pool.free_blocks(reversed(req_blocks))
        self.num_cached_block.pop(request_id, None)

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> None:
        """Swap blocks that fell out of the attention window for the null block and free them."""
        num_skipped_tokens = self.get_num_skipped_tokens(total_computed_tokens)
        if num_skipped_tokens <= 0:
            return
        blocks = self.req_to_blocks[request_id]
        num_skipped_blocks = min(num_skipped_tokens // self.block_size, len(blocks))
        removed = []
        for i in range(num_skipped_blocks - 1, -1, -1):
            if blocks[i] is self._null_block:
                break  # everything before was nulled by an earlier call
            removed.append(blocks[i])
            blocks[i] = self._null_block
        self.block_pool.free_blocks(removed)

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return 0

    def new_step_starts(self) -> None:
        """A schedule() begins (only Mamba keeps per-step state)."""

    def num_blocks_for_tokens(self, num_tokens: int) -> int:
        """Blocks a request of num_tokens tokens holds at most in this group (the never-fits check)."""
        return cdiv(num_tokens, self.block_size)

    def get_num_common_prefix_blocks(self, running_request_id: str) -> int:
        raise NotImplementedError

    @classmethod
    def find_longest_cache_hit(
        cls, block_hashes: Sequence[bytes], max_length: int, group_ids: list[int], block_pool: BlockPool,
        spec: KVCacheGroupSpec, use_eagle: bool, alignment_tokens: int,
    ) -> tuple[list[KVCacheBlock], ...]:
        raise NotImplementedError


class FullAttentionManager(SingleTypeKVCacheManager):
    is_full_attention: ClassVar[bool] = True

    @classmethod
    def find_longest_cache_hit(cls, block_hashes, max_length, group_ids, block_pool, spec, use_eagle, alignment_tokens):
        return full_attention_hit(block_hashes, max_length, group_ids, block_pool, spec, use_eagle, alignment_tokens)

    def get_num_common_prefix_blocks(self, running_request_id: str) -> int:
        return num_common_prefix_blocks(self.req_to_blocks, running_request_id)


def full_attention_hit(block_hashes: Sequence[bytes], max_length: int, group_ids: list[int], block_pool: BlockPool,
                       spec: KVCacheGroupSpec, use_eagle: bool, alignment_tokens: int) -> tuple[list[KVCacheBlock], ...]:
    """Full attention's cache hit (every full-attention kind's): the cached prefix, left to right."""
    computed: tuple[list[KVCacheBlock], ...] = tuple([] for _ in group_ids)
    block_size = spec.block_size
    max_num_blocks = max_length // block_size
    # by index, not over a slice: a lookup usually misses at its first block, and a slice
    # copied the request's whole key list first (vLLM iterates an islice)
    for i in range(min(len(block_hashes), max_num_blocks)):
        cached = block_pool.get_cached_block(block_hashes[i], group_ids)
        if cached is None:
            break  # hashes are chained: nothing after a miss can hit
        for lst, blk in zip(computed, cached):
            lst.append(blk)
    if use_eagle and computed[0]:
        for lst in computed:
            lst.pop()  # eagle needs the last block's hidden states recomputed
    while block_size != alignment_tokens and len(computed[0]) * block_size % alignment_tokens:
        for lst in computed:
            lst.pop()
    return computed


def num_common_prefix_blocks(req_to_blocks: dict[str, list[KVCacheBlock]], running_request_id: str) -> int:
    """Leading blocks every request holding KV references (cascade attention's common prefix)."""
    n = len(req_to_blocks)
    count = 0
    for block in req_to_blocks[running_request_id]:
        if block.ref_cnt != n:
            break
        count += 1
    return count


class SlidingWindowManager(SingleTypeKVCacheManager):
    def __init__(self, spec, block_pool, enable_caching, group_id):
        super().__init__(spec, block_pool, enable_caching, group_id)
        assert spec.sliding_window is not None
        self.sliding_window = spec.sliding_window

    @classmethod
    def find_longest_cache_hit(cls, block_hashes, max_length, group_ids, block_pool, spec, use_eagle, alignment_tokens):
        # A hit only needs the last (window - 1) tokens contiguous; earlier blocks become null.
        block_size = spec.block_size
        needed = cdiv(spec.sliding_window - 1, block_size) + (1 if use_eagle else 0)
        max_num_blocks = max_length // block_size
        computed = tuple([block_pool.null_block] * max_num_blocks for _ in group_ids)
        num_contiguous = 0
        match_found = False
        for i in range(max_num_blocks - 1, -1, -1):  # right to left, stop at the first window
            cached = block_pool.get_cached_block(block_hashes[i], group_ids)
            if cached is None:
                num_contiguous = 0
                continue
            if num_contiguous == 0 and block_size != alignment_tokens and (i + 1) * block_size % alignment_tokens:
                continue
            for lst, blk in zip(computed, cached):
                lst[i] = blk
            num_contiguous += 1
            if num_contiguous >= needed:
                for lst in computed:
                    del lst[i + num_contiguous:]
                match_found = True
                break
        if not match_found:
            # A contiguous run from the very start is a hit even if shorter than the window.
            for lst in computed:
                del lst[num_contiguous:]
            while block_size != alignment_tokens and len(computed[0]) * block_size % alignment_tokens:
                for lst in computed:
                    lst.pop()
        if use_eagle and computed[0]:
            for lst in computed:
                lst.pop()
            while block_size != alignment_tokens and len(computed[0]) * block_size % alignment_tokens:
                for lst in computed:
                    lst.pop()
        return computed

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        # The next token attends to the last `sliding_window` tokens including itself.
        return max(0, num_computed_tokens - self.sliding_window + 1)

    def get_num_common_prefix_blocks(self, running_request_id: str) -> int:
        return 0  # prefix blocks are null here; cascade attention does not apply

