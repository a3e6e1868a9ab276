"""The block pool: all blocks, the free queue, and the prefix-cache map hash -> block(s).

Private blocks. A request whose prefix-cache keys no other request can produce (its key root is
its own: KVCacheManager.note_request decides) caches its full blocks *privately*: the block keeps
its hash in `private_hash` and stays out of the hash map. Only the request itself could ever look
those keys up again, and only after a preemption (a finished request never runs again), so
before a private request's blocks are freed while it may still run they are published: entered
in the map exactly as cache_full_blocks would have entered them. When a second request turns up
with the same root, every private block is published and private caching ends for the pool.
Every lookup therefore finds what it would find had every block been entered when cached (private
keys are distinct from every other key, so the map's insertion order decides nothing), and a
private block's eviction costs no map operation: on the Azure conversation hour most of the pool's
map traffic was blocks no one could ever hit. get_num_cached_blocks counts private blocks too.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Final

from servesim.scheduler.kv.block import FreeKVCacheBlockQueue, KVCacheBlock
from servesim.scheduler.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent

if TYPE_CHECKING:
    from servesim.scheduler.request import Request


def make_block_hash_with_group_id(block_hash: bytes, group_id: int) -> bytes:
    if group_id < _NUM_GROUP_SUFFIXES:  # every block's key: no to_bytes call per block
        return block_hash + _GROUP_SUFFIXES[group_id]
    return block_hash + group_id.to_bytes(4, "big", signed=False)


_NUM_GROUP_SUFFIXES: Final = 16
_GROUP_SUFFIXES: Final[list[bytes]] = [g.to_bytes(4, "big", signed=False) for g in range(_NUM_GROUP_SUFFIXES)]


def _group_suffix(group_id: int) -> bytes:
    """What make_block_hash_with_group_id appends to every block hash of group group_id."""
    return _GROUP_SUFFIXES[group_id] if group_id < _NUM_GROUP_SUFFIXES else group_id.to_bytes(4, "big", signed=False)


def get_block_hash(key: bytes) -> bytes:
    return key[:-4]


class BlockHashToBlockMap:
    """hash key -> one block, or {block_id: block} when identical content was cached twice.

    Duplicates are kept (not merged) so that block tables stay append-only; lookups return the
    first inserted block.
    """

    __slots__ = ("_cache",)

    def __init__(self) -> None:
        self._cache: dict[bytes, KVCacheBlock | dict[int, KVCacheBlock]] = {}

    def get_one_block(self, key: bytes) -> KVCacheBlock | None:
        blocks = self._cache.get(key)
        if blocks is None or isinstance(blocks, KVCacheBlock):
            return blocks
        return next(iter(blocks.values()))

    def insert(self, key: bytes, block: KVCacheBlock) -> None:
        blocks = self._cache.setdefault(key, block)  # one lookup when the key is new (the common case)
        if blocks is block:
            return
        if isinstance(blocks, KVCacheBlock):
            self._cache[key] = {blocks.block_id: blocks, block.block_id: block}
        else:
            blocks[block.block_id] = block

    def pop(self, key: bytes, block_id: int) -> KVCacheBlock | None:
        blocks = self._cache.pop(key, None)
        if blocks is None:
            return None
        if isinstance(blocks, KVCacheBlock):
            if blocks.block_id == block_id:
                return blocks
            self._cache[key] = blocks
            return None
        block = blocks.pop(block_id, None)
        if blocks:
            self._cache[key] = blocks
        return block

    def items(self):
        """(key, block) for every cached block (duplicates included). For invariant checks."""
        for key, blocks in self._cache.items():
            if isinstance(blocks, KVCacheBlock):
                yield key, blocks
            else:
                for block in blocks.values():
                    yield key, block

    def __len__(self) -> int:
        return len(self._cache)


class BlockPool:
    """Allocation, freeing, caching and LRU eviction of KV blocks. Block 0 is the null block."""

    def __init__(self, num_gpu_blocks: int, enable_caching: bool, enable_kv_cache_events: bool = False):
        if num_gpu_blocks < 2:
            raise ValueError("num_gpu_blocks must be >= 2 (block 0 is the null block)")
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        # The null block never enters the free queue and its ref_cnt is not maintained.
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True
        self.enable_kv_cache_events = enable_kv_cache_events
        self.kv_event_queue: list[KVCacheEvent] = []
        # Requests whose full blocks are cached privately (module docstring); KVCacheManager
        # decides membership (note_request) and ends it (free).
        self.private_ids: set[str] = set()
        self.num_private_cached = 0  # blocks whose private_hash is set

    def get_cached_block(self, block_hash: bytes, group_ids: Sequence[int]) -> list[KVCacheBlock] | None:
        """The cached block for each group, or None if any group misses."""
        out = []
        for gid in group_ids:
            block = self.cached_block_hash_to_block.get_one_block(make_block_hash_with_group_id(block_hash, gid))
            if block is None:
                return None
            out.append(block)
        return out

    def cache_full_blocks(
        self,
        request: Request,
        blocks: list[KVCacheBlock],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        group_id: int,
    ) -> None:
        """Give blocks[num_cached_blocks:num_full_blocks] their hashes and enter them in the cache."""
        if num_cached_blocks >= num_full_blocks:
            return
        new_full_blocks = blocks[num_cached_blocks:num_full_blocks]
        assert len(request.block_hashes) >= num_full_blocks, "block hashes lag the cached tokens"
        if request.request_id in self.private_ids:
            hashes = request.block_hashes
            for i, blk in enumerate(new_full_blocks):
                blk.private_hash = hashes[num_cached_blocks + i]
            self.num_private_cached += len(new_full_blocks)
            return
        if self.enable_kv_cache_events:
            self._cache_with_events(request, new_full_blocks, num_cached_blocks, num_full_blocks, block_size, group_id)
            return
        # One pass, in bulk (a prefill chunk caches hundreds of blocks): the group's key suffix is
        # made once and each key goes into the map with one dict call when it is new (the common
        # case); a duplicate goes through BlockHashToBlockMap.insert. The same entries, in the same
        # order, as entering each block with insert().
        suffix = _group_suffix(group_id)
        hashes = request.block_hashes
        cache_map = self.cached_block_hash_to_block
        entries = cache_map._cache
        i = num_cached_blocks
        for blk in new_full_blocks:
            if not blk.is_null:  # the null block: sliding-window positions that were skipped
                key = hashes[i] + suffix
                assert blk._block_hash is None, "block already has a hash"
                blk._block_hash = key
                if entries.setdefault(key, blk) is not blk:
                    cache_map.insert(key, blk)
            i += 1

    def _cache_with_events(self, request: Request, new_full_blocks: list[KVCacheBlock], num_cached_blocks: int,
                           num_full_blocks: int, block_size: int, group_id: int) -> None:
        """cache_full_blocks with KV cache events on: each block entered, then one BlockStored."""
        new_hashes: list[bytes] = []
        for i, blk in enumerate(new_full_blocks):
            if blk.is_null:  # sliding-window positions that were skipped
                continue
            block_hash = request.block_hashes[num_cached_blocks + i]
            key = make_block_hash_with_group_id(block_hash, group_id)
            blk.block_hash = key
            self.cached_block_hash_to_block.insert(key, blk)
            new_hashes.append(block_hash)
        parent = request.block_hashes[num_cached_blocks - 1] if num_cached_blocks else None
        tokens = request.all_token_ids[num_cached_blocks * block_size : num_full_blocks * block_size]
        self.kv_event_queue.append(BlockStored(tuple(new_hashes), parent, tuple(tokens), block_size, request.lora_id))

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Pop blocks from the front of the free queue, evicting their cached hashes (LRU)."""
        if num_blocks > self.free_block_queue.num_free_blocks:
            raise ValueError(f"cannot get {num_blocks} free blocks from the pool")
        ret = self.free_block_queue.popleft_n(num_blocks)
        if not self.enable_caching:
            for block in ret:
                block.ref_cnt += 1
            return ret
        # _maybe_evict_cached_block for each, inlined for the common cases (a prefill chunk pops
        # hundreds of blocks, on a full pool most of them still cached, each the one block under
        # its key): the same map operations in the same order. A key holding other blocks too
        # (duplicates) is left to _maybe_evict_cached_block, which pops it and puts back what
        # remains.
        entries = self.cached_block_hash_to_block._cache
        events = self.enable_kv_cache_events
        for block in ret:
            key = block._block_hash
            if key is not None:
                # get, then del: two lookups of one key (the second in cache) cost less than
                # dict.pop with a default, a method call in compiled code
                held = entries.get(key)
                if held is block:
                    del entries[key]
                    block._block_hash = None
                    if events:
                        self.kv_event_queue.append(BlockRemoved((get_block_hash(key),)))
                elif held is not None:
                    self._maybe_evict_cached_block(block)
            elif block.private_hash is not None:
                block.private_hash = None  # no map entry to drop: nobody else could have hit it
                self.num_private_cached -= 1
            block.ref_cnt += 1
        return ret

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool:
        key = block.block_hash
        if key is None:
            if block.private_hash is None:
                return False
            block.private_hash = None  # no map entry to drop: nobody else could have hit it
            self.num_private_cached -= 1
            return True
        if self.cached_block_hash_to_block.pop(key, block.block_id) is None:
            return False
        block.reset_hash()
        if self.enable_kv_cache_events:
            self.kv_event_queue.append(BlockRemoved((get_block_hash(key),)))
        return True

    def touch(self, blocks: Sequence[KVCacheBlock]) -> None:
        """A prefix-cache hit: take a reference, pulling eviction candidates off the free queue."""
        for block in blocks:
            if block.ref_cnt == 0 and not block.is_null:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference from each; those reaching 0 join the free queue in the given order."""
        blocks = list(ordered_blocks)
        for block in blocks:
            block.ref_cnt -= 1
        self.free_block_queue.append_n([b for b in blocks if b.ref_cnt == 0 and not b.is_null])

    def evict_blocks(self, block_ids: set[int]) -> None:
        for block_id in block_ids:
            self._maybe_evict_cached_block(self.blocks[block_id])

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; refused (False) while any block is still in use."""
        if self.num_gpu_blocks - self.get_num_free_blocks() != 1:  # the null block is always used
            return False
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        for block in self.blocks:
            block.reset_hash()
            block.private_hash = None
        self.num_private_cached = 0
        if self.enable_kv_cache_events:
            self.kv_event_queue.append(AllBlocksCleared())
        return True

    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def get_num_cached_blocks(self) -> int:
        """Distinct keys in the prefix cache (a private block's key is distinct from every other)."""
        return len(self.cached_block_hash_to_block) + self.num_private_cached

    # --- private blocks (module docstring) ---------------------------------------------------
    def end_private(self, request_id: str, blocks: Sequence[KVCacheBlock], group_id: int, publish: bool) -> None:
        """The request stops caching privately: `publish` (it may run again) enters its privately
        cached `blocks` in the map as cache_full_blocks would have; otherwise (it finished) they
        stay out, keeping their private hashes until they are evicted."""
        self.private_ids.discard(request_id)
        if publish:
            self._publish(blocks, group_id)

    def end_private_caching(self, group_id: int) -> None:
        """A request can share keys with an earlier one: publish every private block, and cache
        every block in the map from now on."""
        self.private_ids.clear()
        self._publish(self.blocks, group_id)

    def _publish(self, blocks: Sequence[KVCacheBlock], group_id: int) -> None:
        cache = self.cached_block_hash_to_block
        for blk in blocks:
            block_hash = blk.private_hash
            if block_hash is None:
                continue
            key = make_block_hash_with_group_id(block_hash, group_id)
            blk.private_hash = None
            blk.block_hash = key
            cache.insert(key, blk)
            self.num_private_cached -= 1

    def get_usage(self) -> float:
        """Fraction of usable blocks (null block excluded) that are not free."""
        total = self.num_gpu_blocks - 1
        return 1.0 - self.get_num_free_blocks() / total if total else 0.0

    def take_events(self) -> list[KVCacheEvent]:
        if not self.enable_kv_cache_events:
            return []
        events, self.kv_event_queue = self.kv_event_queue, []
        return events
