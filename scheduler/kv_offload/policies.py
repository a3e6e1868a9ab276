"""The CPU tier's cache policies: which offloaded blocks a store evicts (vLLM 0.19.1's
vllm/v1/kv_offload/cpu/policies/{abstract,lru,arc}.py, same data structures and orders).

A policy holds every block the tier knows, keyed by block hash, and picks eviction victims; the
manager (manager.py) owns the CPU block ids, reference counts and events. A block is evictable only
when it is ready (its store completed) and no load reads it (`ref_cnt == 0`). Evictions are atomic:
either exactly n victims are chosen or nothing changes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from servesim.scheduler.registry import Registry


@dataclass(slots=True)
class BlockStatus:
    """One CPU block slot. vLLM keeps `ref_cnt = -1` for "store in flight"; here that is
    `is_ready = False` (ref_cnt stays 0 until the store completes)."""

    block_id: int  # index of the CPU buffer slot
    ref_cnt: int = 0  # loads reading this block
    is_ready: bool = False  # the store that fills it has completed

    @property
    def evictable(self) -> bool:
        return self.is_ready and self.ref_cnt == 0


class CachePolicy(Protocol):
    def get(self, block_hash: bytes) -> BlockStatus | None:
        """The block with this hash, or None when the tier does not hold it."""
        ...

    def insert(self, block_hash: bytes, block: BlockStatus) -> None:
        """Add a newly allocated block (ARC: also forgets its ghost entry)."""
        ...

    def remove(self, block_hash: bytes) -> None:
        """Drop a block (a failed store)."""
        ...

    def touch(self, block_hashes: Iterable[bytes]) -> None:
        """Mark blocks recently used; the first hash ends up the most recent (reverse order)."""
        ...

    def evict(self, n: int, protected: set[bytes]) -> list[tuple[bytes, BlockStatus]] | None:
        """Exactly n evictable blocks not in protected, removed; None (and no change) if fewer."""
        ...


class LRUCachePolicy:
    """One OrderedDict, least recently used first."""

    __slots__ = ("blocks",)

    def __init__(self, cache_capacity: int) -> None:
        del cache_capacity  # LRU needs none; the constructor is uniform
        self.blocks: OrderedDict[bytes, BlockStatus] = OrderedDict()

    def get(self, block_hash: bytes) -> BlockStatus | None:
        return self.blocks.get(block_hash)

    def insert(self, block_hash: bytes, block: BlockStatus) -> None:
        self.blocks[block_hash] = block

    def remove(self, block_hash: bytes) -> None:
        del self.blocks[block_hash]

    def touch(self, block_hashes: Iterable[bytes]) -> None:
        blocks = self.blocks
        for block_hash in reversed(list(block_hashes)):
            if block_hash in blocks:
                blocks.move_to_end(block_hash)

    def evict(self, n: int, protected: set[bytes]) -> list[tuple[bytes, BlockStatus]] | None:
        if n == 0:
            return []
        victims: list[tuple[bytes, BlockStatus]] = []
        for block_hash, block in self.blocks.items():
            if block.evictable and block_hash not in protected:
                victims.append((block_hash, block))
                if len(victims) == n:
                    break
        if len(victims) < n:
            return None
        for block_hash, _ in victims:
            del self.blocks[block_hash]
        return victims


class ARCCachePolicy:
    """Adaptive Replacement Cache: T1 (seen once) and T2 (seen again) hold blocks, B1 and B2 are
    ghost lists of hashes evicted from them; a touch of a B1 ghost grows the target size of T1, of
    a B2 ghost shrinks it. Eviction takes T1's oldest evictable block while T1 is at least its target
    (int() of it), else T2's; ghost lists are trimmed to the capacity after each eviction."""

    __slots__ = ("cache_capacity", "target_t1_size", "t1", "t2", "b1", "b2")

    def __init__(self, cache_capacity: int) -> None:
        self.cache_capacity = cache_capacity
        self.target_t1_size = 0.0  # a float, as vLLM's (deltas are ratios of ghost list sizes)
        self.t1: OrderedDict[bytes, BlockStatus] = OrderedDict()
        self.t2: OrderedDict[bytes, BlockStatus] = OrderedDict()
        self.b1: OrderedDict[bytes, None] = OrderedDict()
        self.b2: OrderedDict[bytes, None] = OrderedDict()

    def get(self, block_hash: bytes) -> BlockStatus | None:
        return self.t1.get(block_hash) or self.t2.get(block_hash)

    def insert(self, block_hash: bytes, block: BlockStatus) -> None:
        self.t1[block_hash] = block
        self.b1.pop(block_hash, None)
        self.b2.pop(block_hash, None)

    def remove(self, block_hash: bytes) -> None:
        if self.t1.pop(block_hash, None) is None:
            self.t2.pop(block_hash, None)

    def touch(self, block_hashes: Iterable[bytes]) -> None:
        t1, t2, b1, b2 = self.t1, self.t2, self.b1, self.b2
        for block_hash in reversed(list(block_hashes)):
            if block_hash in t1:
                block = t1.pop(block_hash)
                if block.is_ready:
                    t2[block_hash] = block  # seen twice: promoted
                else:
                    t1[block_hash] = block  # only just prepared for a store: stays in T1, as MRU
            elif block_hash in t2:
                t2.move_to_end(block_hash)
            elif block_hash in b1:
                delta = max(1, len(b2) / len(b1))
                self.target_t1_size = min(self.target_t1_size + delta, self.cache_capacity)
                b1.move_to_end(block_hash)
            elif block_hash in b2:
                delta = max(1, len(b1) / len(b2))
                self.target_t1_size = max(self.target_t1_size - delta, 0)
                b2.move_to_end(block_hash)

    def _first_evictable(self, queue: OrderedDict[bytes, BlockStatus], protected: set[bytes],
                         selected: set[bytes]) -> tuple[bytes, BlockStatus] | None:
        for block_hash, block in queue.items():
            if block.evictable and block_hash not in protected and block_hash not in selected:
                return block_hash, block
        return None

    def evict(self, n: int, protected: set[bytes]) -> list[tuple[bytes, BlockStatus]] | None:
        if n == 0:
            return []
        chosen: list[tuple[bytes, BlockStatus, bool]] = []  # (hash, block, from T1)
        selected: set[bytes] = set()
        virtual_t1_size = len(self.t1)  # T1's size as the victims chosen so far would leave it
        for _ in range(n):
            found, from_t1 = None, False
            if virtual_t1_size >= int(self.target_t1_size):
                found = self._first_evictable(self.t1, protected, selected)
                if found is not None:
                    from_t1 = True
                    virtual_t1_size -= 1
            if found is None:
                found = self._first_evictable(self.t2, protected, selected)
                if found is None:
                    return None
            chosen.append((found[0], found[1], from_t1))
            selected.add(found[0])
        victims: list[tuple[bytes, BlockStatus]] = []
        for block_hash, block, from_t1 in chosen:
            if from_t1:
                del self.t1[block_hash]
                self.b1[block_hash] = None
            else:
                del self.t2[block_hash]
                self.b2[block_hash] = None
            victims.append((block_hash, block))
        for ghost in (self.b1, self.b2):
            for _ in range(len(ghost) - self.cache_capacity):
                ghost.popitem(last=False)
        return victims


# vLLM's kv_connector_extra_config["eviction_policy"] names (cpu/manager.py::_CACHE_POLICIES).
CACHE_POLICIES: Registry[type] = Registry("offload eviction policy")
CACHE_POLICIES.add("lru", LRUCachePolicy)
CACHE_POLICIES.add("arc", ARCCachePolicy)
