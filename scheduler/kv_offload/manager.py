"""The CPU tier's bookkeeping on the scheduler side: vLLM 0.19.1's CPUOffloadingManager
(vllm/v1/kv_offload/cpu/manager.py with the OffloadingManager contract of abstract.py).

It knows which offload blocks (keyed by the hash of their last GPU block) the tier holds, where
(CPU block ids), and protects them while transfers use them:
- `lookup`: how many of the given blocks, from the first, are held and ready;
- `prepare_load` / `complete_load`: a load reads the blocks (ref_cnt > 0: not evictable);
- `touch`: recency (the policy's order);
- `prepare_store` / `complete_store`: room for the blocks not held yet, evicting if needed
  (a block in flight is not ready: not loadable, not evictable), then ready once stored.
CPU block ids: fresh ids 0, 1, ... until the tier is full, then ids freed by evictions, last freed
first (vLLM's free list). Events (stored / removed hashes) are kept only when enabled. With a
ReuseTracker (store_threshold), lookups count hashes and stores keep only blocks seen often enough
(vLLM's FilterReusedOffloadingManager around this manager; reuse.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from servesim.scheduler.kv_offload.policies import CACHE_POLICIES, BlockStatus
from servesim.scheduler.kv_offload.reuse import ReuseTracker

CPU_MEDIUM = "CPU"  # vLLM's CPULoadStoreSpec.medium()


@dataclass(slots=True)
class PrepareStoreOutput:
    block_hashes_to_store: list[bytes]  # the given blocks the tier did not hold, now in flight
    store_block_ids: list[int]  # their CPU block ids (vLLM's CPULoadStoreSpec), same order
    block_hashes_evicted: list[bytes]


@dataclass(slots=True)
class OffloadingEvent:
    block_hashes: list[bytes]
    block_size: int  # tokens per offload block
    medium: str
    removed: bool  # True: evicted; False: stored


class CPUOffloadingManager:
    __slots__ = ("block_size", "medium", "_num_blocks", "_num_allocated_blocks", "_free_list", "events",
                 "_policy", "reuse")

    def __init__(self, block_size: int, num_blocks: int, cache_policy: str = "lru",
                 enable_events: bool = False, reuse: ReuseTracker | None = None) -> None:
        policy_cls = CACHE_POLICIES.get(cache_policy)  # unknown: UnknownNameError with a did-you-mean
        self.block_size = block_size
        self.medium = CPU_MEDIUM
        self._num_blocks = num_blocks
        self._num_allocated_blocks = 0
        self._free_list: list[int] = []
        self.events: list[OffloadingEvent] | None = [] if enable_events else None
        self._policy = policy_cls(cache_capacity=num_blocks)
        # store_threshold >= 2: lookups count hashes, stores skip the rarely seen (reuse.py)
        self.reuse = reuse

    # --- block pool ---
    def num_free_blocks(self) -> int:
        return len(self._free_list) + self._num_blocks - self._num_allocated_blocks

    def _allocate_blocks(self, n: int) -> list[BlockStatus]:
        num_fresh = min(n, self._num_blocks - self._num_allocated_blocks)
        assert len(self._free_list) >= n - num_fresh
        blocks = [BlockStatus(self._num_allocated_blocks + i) for i in range(num_fresh)]
        self._num_allocated_blocks += num_fresh
        blocks.extend(BlockStatus(self._free_list.pop()) for _ in range(n - num_fresh))
        return blocks

    # --- the OffloadingManager contract ---
    def lookup(self, block_hashes: Iterable[bytes]) -> int:
        """Blocks held and ready, counted from the first until a miss."""
        if self.reuse is not None:
            block_hashes = list(block_hashes)
            self.reuse.record(block_hashes)
        hits = 0
        for block_hash in block_hashes:
            block = self._policy.get(block_hash)
            if block is None or not block.is_ready:
                break
            hits += 1
        return hits

    def prepare_load(self, block_hashes: Iterable[bytes]) -> list[int]:
        """Pin the blocks (all held and ready) for a load; their CPU block ids."""
        ids = []
        for block_hash in block_hashes:
            block = self._policy.get(block_hash)
            assert block is not None and block.is_ready, f"block {block_hash!r} not loadable"
            block.ref_cnt += 1
            ids.append(block.block_id)
        return ids

    def touch(self, block_hashes: Iterable[bytes]) -> None:
        self._policy.touch(block_hashes)

    def complete_load(self, block_hashes: Iterable[bytes]) -> None:
        for block_hash in block_hashes:
            block = self._policy.get(block_hash)
            assert block is not None and block.ref_cnt > 0, f"block {block_hash!r} was not being loaded"
            block.ref_cnt -= 1

    def prepare_store(self, block_hashes: Iterable[bytes]) -> PrepareStoreOutput | None:
        """Room for the blocks not held yet (evicting others, never one of the given blocks), or
        None when not enough blocks can be evicted."""
        hashes = list(block_hashes) if self.reuse is None else self.reuse.eligible(block_hashes)
        policy = self._policy
        to_store = [h for h in hashes if policy.get(h) is None]
        if not to_store:
            return PrepareStoreOutput([], [], [])
        num_to_evict = len(to_store) - self.num_free_blocks()
        evicted: list[bytes] = []
        if num_to_evict > 0:
            victims = policy.evict(num_to_evict, set(hashes))
            if victims is None:
                return None
            for block_hash, block in victims:
                self._free_list.append(block.block_id)
                evicted.append(block_hash)
        if evicted and self.events is not None:
            self.events.append(OffloadingEvent(evicted, self.block_size, self.medium, removed=True))
        blocks = self._allocate_blocks(len(to_store))
        for block_hash, block in zip(to_store, blocks):
            policy.insert(block_hash, block)
        return PrepareStoreOutput(to_store, [b.block_id for b in blocks], evicted)

    def complete_store(self, block_hashes: Iterable[bytes], success: bool = True) -> None:
        """Stored blocks become ready (loadable); a failed store frees the blocks still in flight."""
        stored: list[bytes] = []
        policy = self._policy
        for block_hash in block_hashes:
            block = policy.get(block_hash)
            if block is None or block.is_ready:
                continue
            if success:
                block.is_ready = True
                block.ref_cnt = 0
                stored.append(block_hash)
            else:
                policy.remove(block_hash)
                self._free_list.append(block.block_id)
        if stored and self.events is not None:
            self.events.append(OffloadingEvent(stored, self.block_size, self.medium, removed=False))

    def take_events(self) -> Iterator[OffloadingEvent]:
        if self.events is not None:
            yield from self.events
            self.events.clear()
