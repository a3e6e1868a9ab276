"""MambaManager: the KV cache group of Mamba / linear-attention layers (vLLM 0.19.1's MambaManager).

A Mamba layer keeps one recurrent state per request instead of per-token KV, so a request needs
only the block holding the state after its last computed token; every block before it is nulled
and freed (get_num_skipped_tokens = num_computed_tokens - 1). What prefix caching can reuse
depends on vLLM's --mamba-cache-mode (the group's `mamba_cache_mode`):

- "none": prefix caching off; the group's block size is max_model_len, so a request holds one
  block (+ num_speculative_blocks for MTP/EAGLE drafts) for its whole life.
- "all": the kernel writes the state at every block boundary; each full block is cached, and a
  hit is the rightmost cached block (earlier positions are null: only the last state is needed).
- "align": the state is written only at the end of a step, so schedule() cuts prefill chunks to
  block multiples (`mamba_block_aligned_split`); the running state lives in the last
  1 + num_speculative_blocks blocks and the block of two steps ago is freed.

Invariant (all modes): a hit found in a block cached by this same schedule() is refused for now
(the state is written only when the step runs): get_num_blocks_to_allocate then asks for more
blocks than the pool has, so the request waits for the next step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING

from servesim.scheduler.kv.block import KVCacheBlock
from servesim.scheduler.kv.block_pool import BlockPool
from servesim.scheduler.kv.single_type import KVCacheGroupSpec, SingleTypeKVCacheManager, cdiv

if TYPE_CHECKING:
    from servesim.scheduler.config import CacheConfig, SchedulerConfig
    from servesim.scheduler.request import Request


class MambaManager(SingleTypeKVCacheManager):
    def __init__(self, spec: KVCacheGroupSpec, block_pool: BlockPool, enable_caching: bool, group_id: int):
        super().__init__(spec, block_pool, enable_caching, group_id)
        # Keys (block hash + group id) of the blocks cached since the last new_step_starts().
        self.cached_blocks_this_step: set[bytes] = set()
        self.mamba_cache_mode = spec.mamba_cache_mode
        self.num_speculative_blocks = spec.num_speculative_blocks
        # align mode: request id -> index of the state block allocated the step before last (freed
        # once the state moved on), and the requests that got their running-state blocks.
        self.last_state_block_idx: dict[str, int] = {}
        self._allocated_block_reqs: set[str] = set()

    @classmethod
    def find_longest_cache_hit(cls, block_hashes, max_length, group_ids, block_pool, spec, use_eagle, alignment_tokens):
        # Right to left: only the last state matters, so the rightmost cached (aligned) block is
        # the hit; the blocks before it are null placeholders (the hit length counts them).
        computed: tuple[list[KVCacheBlock], ...] = tuple([] for _ in group_ids)
        block_size = spec.block_size
        for i in range(max_length // block_size - 1, -1, -1):
            cached = block_pool.get_cached_block(block_hashes[i], group_ids)
            if cached is None:
                continue
            if block_size != alignment_tokens and (i + 1) * block_size % alignment_tokens:
                continue
            for lst, blk in zip(computed, cached):
                lst.extend([block_pool.null_block] * i)
                lst.append(blk)
            break
        return computed

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> None:
        # Async scheduling counts draft tokens that may yet be rejected: assume they all are (vLLM
        # subtracts num_speculative_blocks from a token count here; kept as it is).
        num_computed = max(0, total_computed_tokens - self.num_speculative_blocks)
        super().remove_skipped_blocks(request_id, num_computed)
        if self.mamba_cache_mode != "align":
            return
        # The block of two steps ago: its state was copied forward last step and is not needed.
        idx = self.last_state_block_idx.get(request_id)
        if idx is not None and idx < cdiv(num_computed, self.block_size) - 1:
            blocks = self.req_to_blocks[request_id]
            if blocks[idx] is not self._null_block:
                self.block_pool.free_blocks([blocks[idx]])
                blocks[idx] = self._null_block

    def get_num_common_prefix_blocks(self, running_request_id: str) -> int:
        return 0  # no cascade attention for Mamba

    def get_num_blocks_to_allocate(self, request_id: str, num_tokens: int, new_computed_blocks: Sequence[KVCacheBlock],
                                   total_computed_tokens: int, num_tokens_main_model: int) -> int:
        if new_computed_blocks and new_computed_blocks[-1].block_hash in self.cached_blocks_this_step:
            # The hit's state is written by a step not run yet: more than the pool, so "not now".
            return self.block_pool.num_gpu_blocks + 1
        if self.mamba_cache_mode != "align":
            return super().get_num_blocks_to_allocate(
                request_id, num_tokens + self.block_size * self.num_speculative_blocks, new_computed_blocks,
                total_computed_tokens, num_tokens_main_model)
        # align: no lookahead slots (a draft model has no Mamba layers; lookahead would break the
        # alignment). An over-estimate: num_tokens may count drafts that get rejected.
        num_required = cdiv(num_tokens_main_model, self.block_size) + self.num_speculative_blocks
        num_new = num_required - len(new_computed_blocks) - len(self.req_to_blocks.get(request_id, ()))
        if num_new > 0:
            # A running request reuses last step's speculative blocks: one new block at most; a
            # first prefill takes its running-state block and the speculative ones.
            num_new = 1 if request_id in self._allocated_block_reqs else 1 + self.num_speculative_blocks
        num_evictable = sum(1 for b in new_computed_blocks if b.ref_cnt == 0 and not b.is_null)
        return num_new + num_evictable

    def allocate_new_blocks(self, request_id: str, num_tokens: int, num_tokens_main_model: int) -> list[KVCacheBlock]:
        if self.mamba_cache_mode != "align":
            return super().allocate_new_blocks(
                request_id, num_tokens + self.block_size * self.num_speculative_blocks, num_tokens_main_model)
        req_blocks = self.req_to_blocks[request_id]
        num_required = cdiv(num_tokens_main_model, self.block_size) + self.num_speculative_blocks
        prev_len = len(req_blocks)
        if num_required == prev_len:
            return []
        assert num_required > prev_len, f"num_required_blocks {num_required} < len(req_blocks) {prev_len}"
        allocated = request_id in self._allocated_block_reqs
        if allocated:
            # the running state sits in the last 1 + num_speculative_blocks blocks
            self.last_state_block_idx[request_id] = prev_len - 1 - self.num_speculative_blocks
        elif prev_len > 0:
            self.last_state_block_idx[request_id] = prev_len - 1  # a prefix hit: its last block holds the state
        num_skipped = num_required - self.num_speculative_blocks - 1
        if prev_len < num_skipped:
            req_blocks.extend([self._null_block] * (num_skipped - prev_len))
        if allocated:
            # last step's speculative blocks move to the end instead of taking new ones
            for idx in range(prev_len - self.num_speculative_blocks, prev_len):
                if idx >= num_skipped:
                    break
                req_blocks.append(req_blocks[idx])
                req_blocks[idx] = self._null_block
        num_new = num_required - len(req_blocks)
        assert num_new <= (1 if allocated else self.num_speculative_blocks + 1)
        req_blocks.extend(self.block_pool.get_new_blocks(num_new))
        self._allocated_block_reqs.add(request_id)
        return req_blocks[prev_len:]

    def free(self, request_id: str) -> None:
        self._allocated_block_reqs.discard(request_id)
        self.last_state_block_idx.pop(request_id, None)
        super().free(request_id)

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return num_computed_tokens - 1  # only the state after the last computed token is needed

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        rid = request.request_id
        before = self.num_cached_block.get(rid, 0)
        super().cache_blocks(request, num_tokens)
        after = self.num_cached_block.get(rid, 0)
        for block in self.req_to_blocks[rid][before:after]:
            if not block.is_null:
                assert block.block_hash is not None
                self.cached_blocks_this_step.add(block.block_hash)

    def new_step_starts(self) -> None:
        self.cached_blocks_this_step.clear()

    def num_blocks_for_tokens(self, num_tokens: int) -> int:
        if self.mamba_cache_mode == "align":
            return 1 + self.num_speculative_blocks  # what a first admission asks for
        return cdiv(num_tokens, self.block_size) + self.num_speculative_blocks


def mamba_block_aligned_split(request: Request, num_new_tokens: int, num_new_local_computed_tokens: int = 0,
                              num_external_computed_tokens: int = 0, *, block_size: int, use_eagle: bool) -> int:
    """vLLM's Scheduler._mamba_block_aligned_split (align mode): cut a prefill chunk to a multiple
    of block_size so the state written at the step's end lands on a block boundary, and end a
    chunk exactly at the last block boundary of the prompt so that state is cached too. Decode
    steps (and a chunk shorter than a block) are left alone. Returns the new num_new_tokens (0:
    not schedulable this step)."""
    if num_external_computed_tokens:
        raise ValueError("mamba_cache_mode='align' with a KV connector: vLLM 0.19.1 refuses it "
                         "(External KV connector is not verified yet)")
    num_computed = request.num_computed_tokens + num_new_local_computed_tokens
    # `num_tokens - 1`: a resumed request recomputes its outputs as prefill; a decode step is not split
    if num_computed < max(request.num_prompt_tokens, request.num_tokens - 1):
        last_cache_position = request.num_tokens - request.num_tokens % block_size
        if use_eagle:  # eagle drops the last hit block: keep the last chunk at least a block long
            last_cache_position = max(last_cache_position - block_size, 0)
        after = num_computed + num_new_tokens
        if after < last_cache_position:
            num_new_tokens = num_new_tokens // block_size * block_size
        elif num_computed < last_cache_position < after:
            num_new_tokens = last_cache_position - num_computed
    return num_new_tokens


def make_mamba_split(scheduler_config: SchedulerConfig, cache_config: CacheConfig) -> Callable[..., int] | None:
    """The scheduler's split (block_size: the cache's, as vLLM's cache_config.block_size) when Mamba
    groups run in align mode (vLLM's need_mamba_block_aligned_split), else None; raises what vLLM
    refuses of the configs first."""
    check_mamba_configs(scheduler_config, cache_config)
    if not has_mamba_groups(cache_config) or cache_config.mamba_cache_mode != "align":
        return None
    return partial(mamba_block_aligned_split, block_size=cache_config.block_size, use_eagle=scheduler_config.use_eagle)


def has_mamba_groups(cache_config: CacheConfig) -> bool:
    return any(g.kind == "mamba" for g in cache_config.kv_cache_groups)


def check_mamba_configs(scheduler_config: SchedulerConfig, cache_config: CacheConfig) -> None:
    """vLLM's refusals for align mode that involve the scheduler's settings (MambaModelConfig and
    VllmConfig's align-mode checks, vllm/model_executor/models/config.py, vllm/config/vllm.py)."""
    if not has_mamba_groups(cache_config):
        return
    for g in cache_config.kv_cache_groups:
        if g.kind == "mamba" and g.num_speculative_blocks != scheduler_config.num_spec_tokens:
            raise ValueError(f"a mamba group's num_speculative_blocks ({g.num_speculative_blocks}) must equal "
                             f"num_spec_tokens ({scheduler_config.num_spec_tokens}) (vLLM's MambaBase)")
    if cache_config.mamba_cache_mode != "align":
        return
    bs = cache_config.block_size
    if not scheduler_config.enable_chunked_prefill:
        raise ValueError("Chunked prefill is required for mamba cache mode 'align' (vLLM)")
    if bs > scheduler_config.max_num_batched_tokens:
        raise ValueError(f"In Mamba cache align mode, block_size ({bs}) must be <= max_num_batched_tokens "
                         f"({scheduler_config.max_num_batched_tokens}) (vLLM)")
    threshold = scheduler_config.long_prefill_token_threshold
    if 0 < threshold < bs:
        raise ValueError(f"In Mamba cache align mode, long_prefill_token_threshold ({threshold}) must be >= "
                         f"block_size ({bs}) (vLLM)")


def groups_for_run(groups: Sequence[KVCacheGroupSpec], enable_caching: bool,
                   max_model_len: int) -> list[KVCacheGroupSpec]:
    """With prefix caching off vLLM sizes a Mamba group's block to max_model_len (MambaModelConfig:
    mamba_block_size = max_model_len), so a request holds one state block for its whole life."""
    if enable_caching:
        return list(groups)
    return [replace(g, block_size=max_model_len) if g.kind == "mamba" else g for g in groups]
