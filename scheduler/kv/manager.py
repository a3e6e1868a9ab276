"""KVCacheManager: the scheduler-facing facade over the coordinator and block pool."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from servesim.scheduler.kv.block import KVCacheBlock
from servesim.scheduler.kv.coordinator import make_coordinator
from servesim.scheduler.kv.mamba import groups_for_run
from servesim.scheduler.kv.single_type import KVCacheGroupSpec
from servesim.scheduler.kv.root_set import KeyRootSet

if TYPE_CHECKING:
    from servesim.scheduler.config import CacheConfig
    from servesim.scheduler.request import Request


@dataclass(slots=True)
class KVCacheBlocks:
    """Blocks per KV cache group: blocks[group][i] (the scheduler never looks inside)."""

    blocks: tuple[Sequence[KVCacheBlock], ...]

    def get_block_ids(self) -> tuple[list[int], ...]:
        return tuple([b.block_id for b in group] for group in self.blocks)

    def get_block_ids_or_none(self) -> tuple[list[int], ...] | None:
        """None when no group got a block (a cached request with nothing new)."""
        if all(len(g) == 0 for g in self.blocks):
            return None
        return self.get_block_ids()


@dataclass(slots=True)
class PrefixCacheStats:
    """Prefix-cache lookups since the last reset; preempted requests are counted apart."""

    requests: int = 0  # lookups by requests never preempted
    queries: int = 0  # tokens looked up
    hits: int = 0  # tokens found
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0
    reset: bool = False  # reset_prefix_cache() ran

    def record(self, num_tokens: int, num_hits: int, preempted: bool) -> None:
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hits


def group_specs_from_config(cache_config: CacheConfig) -> list[KVCacheGroupSpec]:
    bs = cache_config.block_size
    if cache_config.attention == "groups":
        return list(cache_config.kv_cache_groups)
    if cache_config.attention == "full":
        return [KVCacheGroupSpec("full", bs)]
    if cache_config.attention == "sliding_window":
        return [KVCacheGroupSpec("sliding_window", bs, cache_config.sliding_window)]
    return [KVCacheGroupSpec("full", bs), KVCacheGroupSpec("sliding_window", bs, cache_config.sliding_window)]


class KVCacheManager:
    def __init__(self, cache_config: CacheConfig, max_model_len: int, use_eagle: bool = False,
                 log_stats: bool = True):
        self.max_model_len = max_model_len
        self.enable_caching = cache_config.enable_prefix_caching
        self.block_size = cache_config.block_size
        self.log_stats = log_stats
        self.prefix_cache_stats = PrefixCacheStats()
        groups = groups_for_run(group_specs_from_config(cache_config), self.enable_caching, max_model_len)
        self.coordinator = make_coordinator(
            groups, cache_config.num_gpu_blocks, self.enable_caching,
            use_eagle, cache_config.enable_kv_cache_events,
        )
        self.num_kv_cache_groups = len(self.coordinator.managers)
        self.block_pool = self.coordinator.block_pool
        # Shared immutable "no blocks" value; allocate_slots uses identity to spot it (as vLLM).
        self.empty_kv_cache_blocks = KVCacheBlocks(tuple(() for _ in range(self.num_kv_cache_groups)))
        # One full-attention group (the common case): allocate_slots has an exact shortcut.
        managers = self.coordinator.managers
        self._single_full = managers[0] if len(managers) == 1 and managers[0].spec.kind == "full" else None
        # Private caching (block_pool.py, "Private blocks"): the key roots of the requests seen so
        # far, while every one of them has been distinct. One full-attention group only (the
        # published key's group id is that group's); KV events report every insertion as it happens.
        self._private_caching = (self.enable_caching and self._single_full is not None
                                 and not cache_config.enable_kv_cache_events)
        self._key_roots = KeyRootSet()  # (root_set.py: no object per root)

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    def make_prefix_cache_stats(self) -> PrefixCacheStats:
        """Return and reset the stats gathered since the last call."""
        stats, self.prefix_cache_stats = self.prefix_cache_stats, PrefixCacheStats()
        return stats

    def get_computed_blocks(self, request: Request) -> tuple[KVCacheBlocks, int]:
        """Longest prefix-cache hit, in whole blocks, capped at num_tokens - 1 so the last token is
        recomputed (its logits are needed)."""
        if not self.enable_caching or request.skip_reading_prefix_cache:
            return self.empty_kv_cache_blocks, 0
        blocks, num_hit_tokens = self.peek_computed_blocks(request)
        if self.log_stats:
            self.prefix_cache_stats.record(request.num_tokens, num_hit_tokens, request.num_preemptions > 0)
        return blocks, num_hit_tokens

    def peek_computed_blocks(self, request: Request) -> tuple[KVCacheBlocks, int]:
        """The longest prefix-cache hit get_computed_blocks returns, without recording the lookup
        in the prefix-cache stats."""
        if not self.enable_caching or request.skip_reading_prefix_cache:
            return self.empty_kv_cache_blocks, 0
        # capped at num_tokens - 1: the last token is recomputed (its logits are needed)
        blocks, num_hit_tokens = self.coordinator.find_longest_cache_hit(request.block_hashes, request.num_tokens - 1)
        return self._blocks(blocks), num_hit_tokens

    def can_fit_full_sequence(self, request: Request, num_new_computed_tokens: int = 0,
                              new_computed_blocks: KVCacheBlocks | None = None,
                              num_external_computed_tokens: int = 0, num_encoder_tokens: int = 0) -> bool:
        """Admission gate: could the whole prompt (not just the first chunk) get its blocks now?
        num_encoder_tokens: an encoder-decoder request's cross-attention slots, as allocate_slots."""
        ncb = (new_computed_blocks or self.empty_kv_cache_blocks).blocks
        local = request.num_computed_tokens + num_new_computed_tokens
        total_computed = min(local + num_external_computed_tokens, self.max_model_len)
        full = min(request.num_tokens, self.max_model_len)
        need = self.coordinator.get_num_blocks_to_allocate(request.request_id, full, ncb, total_computed, full,
                                                           num_encoder_tokens)
        return need <= self.block_pool.get_num_free_blocks()

    def allocate_slots(self, request: Request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks: KVCacheBlocks | None = None, num_lookahead_tokens: int = 0,
                       num_external_computed_tokens: int = 0,
                       delay_cache_blocks: bool = False, num_encoder_tokens: int = 0) -> KVCacheBlocks | None:
        """Give the request slots for num_new_tokens (+ lookahead) after its computed prefix, and
        (encoder-decoder models) its cross-attention groups slots for num_encoder_tokens.

        Returns the newly allocated blocks, or None on shortage -- in which case nothing changed
        except blocks that slid out of a sliding window (freeing those is always safe).
        Layout: | computed | new hits | external hits | new | lookahead |; only verified tokens
        (up to request.num_tokens) are entered into the prefix cache.
        """
        if num_new_tokens == 0 and num_external_computed_tokens == 0:
            raise ValueError("num_new_tokens must be > 0 when there are no external computed tokens")
        empty = self.empty_kv_cache_blocks
        mgr = self._single_full
        if (mgr is not None and num_external_computed_tokens == 0
                and (new_computed_blocks is None or new_computed_blocks is empty)):
            # One full-attention group and no new hits: nothing slides out of a window and no hit
            # leaves the free queue, so the general path below reduces to this (hot: every decode).
            max_len = self.max_model_len
            total_computed = request.num_computed_tokens + num_new_computed_tokens
            if total_computed > max_len:
                total_computed = max_len
            need_slot = total_computed + num_new_tokens + num_lookahead_tokens
            if need_slot > max_len:
                need_slot = max_len
            rid = request.request_id
            req_blocks = mgr.req_to_blocks.get(rid)
            n_new = -(-need_slot // self.block_size) - (len(req_blocks) if req_blocks is not None else 0)
            pool = self.block_pool
            if n_new > pool.free_block_queue.num_free_blocks:
                return None
            if req_blocks is None:
                req_blocks = mgr.req_to_blocks[rid]
            new = pool.get_new_blocks(n_new) if n_new > 0 else None
            if new:
                req_blocks.extend(new)
            if self.enable_caching and not delay_cache_blocks:
                num_tokens = request.num_tokens
                upto = total_computed + num_new_tokens
                mgr.cache_blocks(request, upto if upto < num_tokens else num_tokens)
            return KVCacheBlocks((new,)) if new else empty
        ncb = (new_computed_blocks or empty).blocks
        local = request.num_computed_tokens + num_new_computed_tokens
        total_computed = min(local + num_external_computed_tokens, self.max_model_len)
        num_tokens_main = total_computed + num_new_tokens
        num_tokens_need_slot = min(num_tokens_main + num_lookahead_tokens, self.max_model_len)
        rid = request.request_id
        self.coordinator.remove_skipped_blocks(rid, total_computed)
        need = self.coordinator.get_num_blocks_to_allocate(
            rid, num_tokens_need_slot, ncb, local + num_external_computed_tokens, num_tokens_main, num_encoder_tokens
        )
        if need > self.block_pool.get_num_free_blocks():
            return None
        if ncb is not self.empty_kv_cache_blocks.blocks or num_external_computed_tokens > 0:
            self.coordinator.allocate_new_computed_blocks(rid, ncb, local, num_external_computed_tokens)
        new_blocks = self.coordinator.allocate_new_blocks(rid, num_tokens_need_slot, num_tokens_main,
                                                          num_encoder_tokens)
        if self.enable_caching and not delay_cache_blocks:
            self.coordinator.cache_blocks(request, min(total_computed + num_new_tokens, request.num_tokens))
        return self._blocks(new_blocks)

    @property
    def private_caching(self) -> bool:
        """Whether a request with a new key root still caches privately (block_pool.py)."""
        return self._private_caching

    def note_request(self, request: Request) -> None:
        """A request reaches the scheduler (before any lookup of its blocks). It caches privately
        when its key root is new; a root seen before means two requests may share keys: every
        private block is published and private caching ends (block_pool.py, "Private blocks")."""
        if not self._private_caching:
            return
        root = request.key_root
        if root is None:  # hashed ids, never private
            return
        if self._key_roots.add(root):  # (note_lookup's test and the add in one probe)
            self.block_pool.private_ids.add(request.request_id)
        else:
            self._end_private_caching()

    def note_lookup(self, request: Request) -> bool:
        """Keys like request's are about to be looked up (its own admission, or a router probing
        the cache with a throwaway request): when its key root was seen before, publish every
        private block first, ending private caching, so the lookup finds what it would had every
        block entered the map when cached. True when its keys could be shared with another's."""
        if not self._private_caching:
            return False
        root = request.key_root
        if root is None:
            return False  # hashed ids: its keys cannot equal a provenance key (block_keys.py)
        if root not in self._key_roots:
            return False
        self._end_private_caching()
        return True

    def _end_private_caching(self) -> None:
        """Publish every private block (two requests may share keys now); private caching ends."""
        mgr = self._single_full
        assert mgr is not None
        self.block_pool.end_private_caching(mgr.group_id)
        self._private_caching = False
        self._key_roots = KeyRootSet()

    def free(self, request: Request) -> None:
        rid = request.request_id
        pool = self.block_pool
        if rid in pool.private_ids:
            # A request that may run again (a preemption) could look its own blocks up: publish them.
            mgr = self._single_full
            assert mgr is not None
            pool.end_private(rid, mgr.req_to_blocks.get(rid, ()), mgr.group_id, not request.is_finished())
        self.coordinator.free(rid)

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        if self.enable_caching:
            self.coordinator.cache_blocks(request, num_computed_tokens)

    def reset_prefix_cache(self) -> bool:
        if not self.block_pool.reset_prefix_cache():
            return False
        self.prefix_cache_stats.reset = True
        return True

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        return self.coordinator.get_num_common_prefix_blocks(running_request_id)

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        return self._blocks(self.coordinator.get_blocks(request_id))

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        return self.get_blocks(request_id).get_block_ids()

    def num_blocks_held(self, request_id: str) -> int:
        return sum(len(m.req_to_blocks.get(request_id, ())) for m in self.coordinator.managers)

    def take_events(self):
        return self.block_pool.take_events()

    def new_step_starts(self) -> None:
        """schedule() begins (vLLM calls it first thing): Mamba forgets the blocks cached last step."""
        self.coordinator.new_step_starts()

    def blocks_needed(self, num_tokens: int, num_encoder_tokens: int = 0) -> int:
        """Blocks a request of num_tokens (and num_encoder_tokens of encoder input, which the
        cross-attention groups hold) holds at most, over every group (the never-fits check)."""
        n = min(num_tokens, self.max_model_len)
        cross = self.coordinator.is_cross
        return sum(m.num_blocks_for_tokens(num_encoder_tokens if cross[i] else n)
                   for i, m in enumerate(self.coordinator.managers))

    def _blocks(self, blocks: tuple[Sequence[KVCacheBlock], ...]) -> KVCacheBlocks:
        # (any over a generator: mypyc compiles it to a loop, not a call to the builtin)
        return KVCacheBlocks(blocks) if any(group for group in blocks) else self.empty_kv_cache_blocks

