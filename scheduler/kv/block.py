"""KV cache blocks and the free-block queue: an array of the free blocks in eviction order.

Why an array, not vLLM's doubly linked list threaded through the blocks: after some churn the
queue's order is the order of frees, scattered over the blocks in memory, so walking a linked list
to pop n blocks is a chain of n dependent cache misses (on the compiled Azure conversation hour,
~190 ns a block, 5 % of the process). Popping from an array reads the n block addresses from
contiguous memory: the loads of the blocks themselves are independent and the CPU overlaps them.

FreeKVCacheBlockQueue keeps vLLM's semantics and order exactly (popleft from the front, append at
the back, remove from the middle in O(1) for a prefix hit on an eviction candidate) with lazy
deletion. Invariants:
- `_order[_head:]` holds every free block once, front (evicted first) to back, and a None for
  each block removed from the middle since it was appended (a hole; `_num_holes` counts them):
  num_free_blocks + _num_holes == len(_order) - _head. No block that is not free is in it.
- a free block sits at `_order[block.free_pos - _base]` (free_pos is absolute: dropping the
  consumed prefix moves `_base`, not every block's position). A block that is not free keeps a
  stale free_pos; the identity test `_order[i] is block` tells the two apart.
- holes and the consumed prefix `_order[:_head]` are dropped in bulk (_trim, _compact) when they
  outgrow the live part, so memory stays O(blocks) and every operation O(1) amortized.
"""

from __future__ import annotations

from typing import Final, cast

# Below these sizes the consumed prefix and the holes stay: dropping them costs a call each time.
MIN_TRIM: Final = 1024
MIN_COMPACT: Final = 256


class KVCacheBlock:
    __slots__ = ("block_id", "ref_cnt", "_block_hash", "private_hash", "free_pos", "is_null")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0  # requests (and pins) holding this block
        # Hash key (block hash + group id) while the block is in the prefix cache, else None.
        self._block_hash: bytes | None = None
        # Block hash (no group id) while the block caches a private request's tokens outside the
        # hash map (block_pool.py, "Private blocks"); then _block_hash is None. Never both set.
        self.private_hash: bytes | None = None
        # Absolute position in FreeKVCacheBlockQueue's order while free; stale otherwise.
        self.free_pos = 0
        self.is_null = False  # block 0: placeholder for skipped (sliding-window) positions

    @property
    def block_hash(self) -> bytes | None:
        return self._block_hash

    @block_hash.setter
    def block_hash(self, value: bytes) -> None:
        assert self._block_hash is None, "block already has a hash"
        self._block_hash = value

    def reset_hash(self) -> None:
        self._block_hash = None

    def __repr__(self) -> str:
        return f"KVCacheBlock(id={self.block_id}, ref_cnt={self.ref_cnt}, hashed={self._block_hash is not None})"


class FreeKVCacheBlockQueue:
    """Free blocks in eviction order: least recently freed first (the module docstring: layout).

    Invariant: a block is in this queue iff its ref_cnt is 0 (the null block aside).
    Within one request's freed blocks, the tail of the chain is appended first (the caller
    reverses), so the most specific prefix blocks are evicted before the shared ones.
    """

    __slots__ = ("num_free_blocks", "_order", "_head", "_base", "_num_holes", "_min_trim", "_min_compact")

    def __init__(self, blocks: list[KVCacheBlock], min_trim: int = MIN_TRIM, min_compact: int = MIN_COMPACT) -> None:
        """`min_trim`, `min_compact`: the sizes from which the consumed prefix and the holes are
        dropped (tests pass small ones to exercise _trim and _compact on small pools)."""
        self.num_free_blocks = len(blocks)
        self._min_trim = min_trim
        self._min_compact = min_compact
        self._order: list[KVCacheBlock | None] = list(blocks)
        self._head = 0  # _order[:_head] is consumed (popped, or holes passed)
        self._base = 0  # free_pos of _order[0]
        self._num_holes = 0
        for i, block in enumerate(blocks):
            block.free_pos = i

    def popleft(self) -> KVCacheBlock:
        if self.num_free_blocks == 0:
            raise ValueError("no free blocks available")
        order = self._order
        i = self._head
        block = order[i]
        while block is None:  # a free block follows: num_free_blocks > 0
            i += 1
            block = order[i]
        self._num_holes -= i - self._head
        self._head = i + 1
        self.num_free_blocks -= 1
        self._trim()
        return block

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        if n == 0:
            return []
        if n > self.num_free_blocks:
            raise ValueError(f"cannot pop {n} blocks: only {self.num_free_blocks} free")
        self.num_free_blocks -= n
        order = self._order
        head = self._head
        if self._num_holes == 0:
            end = head + n
            out = cast(list[KVCacheBlock], order[head:end])  # no hole among them
        else:
            # Slices, not one item at a time: a slice's copy touches its blocks in a tight loop,
            # so their cache misses overlap (the filter then finds them in cache).
            end = head + n
            out = [block for block in order[head:end] if block is not None]
            while len(out) < n:  # n free blocks follow the head: the loop ends
                need = n - len(out)
                out.extend([block for block in order[end:end + need] if block is not None])
                end += need
            self._num_holes -= end - head - n
        self._head = end
        self._trim()
        return out

    def remove(self, block: KVCacheBlock) -> None:
        order = self._order
        i = block.free_pos - self._base
        if i < self._head or i >= len(order) or order[i] is not block:
            raise RuntimeError(f"remove() of a block that is not in the free queue: {block}")
        order[i] = None
        self.num_free_blocks -= 1
        self._num_holes += 1
        if self._num_holes > self.num_free_blocks and self._num_holes >= self._min_compact:
            self._compact()

    def append(self, block: KVCacheBlock) -> None:
        order = self._order
        block.free_pos = self._base + len(order)
        order.append(block)
        self.num_free_blocks += 1

    def append_n(self, blocks: list[KVCacheBlock]) -> None:
        order = self._order
        pos = self._base + len(order)
        for block in blocks:
            block.free_pos = pos
            pos += 1
        order.extend(blocks)
        self.num_free_blocks += len(blocks)

    def index_of_first(self, block_ids: set[int], limit: int) -> int:
        """Position (0: popped first) of the first free block whose id is in block_ids, looking at
        the first `limit` blocks only; `limit` (or the queue length) if none is. O(limit + holes)."""
        limit = min(limit, self.num_free_blocks)
        order = self._order
        i = self._head
        seen = 0
        while seen < limit:  # limit free blocks follow the head
            block = order[i]
            i += 1
            if block is not None:
                if block.block_id in block_ids:
                    return seen
                seen += 1
        return limit

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """Free blocks front (evicted first) to back. O(n): for tests and invariant checks."""
        return [block for block in self._order[self._head:] if block is not None]

    def check(self) -> str | None:
        """The module docstring's invariants: what is broken, or None. O(n): for invariant checks."""
        live = self._order[self._head:]
        holes = sum(1 for block in live if block is None)
        if holes != self._num_holes:
            return f"free queue: {holes} holes, counted {self._num_holes}"
        if len(live) - holes != self.num_free_blocks:
            return f"free queue: {len(live) - holes} blocks, counted {self.num_free_blocks}"
        for i, block in enumerate(live, self._head):
            if block is not None and block.free_pos - self._base != i:
                return f"free queue: {block} at {i}, its free_pos says {block.free_pos - self._base}"
        return None

    def _trim(self) -> None:
        """Drop the consumed prefix once it is longer than the rest (the move is paid for by the
        pops that consumed it); positions stay valid: _base moves instead."""
        head = self._head
        if head >= self._min_trim and head + head >= len(self._order):
            del self._order[:head]
            self._base += head
            self._head = 0

    def _compact(self) -> None:
        """Drop every hole once they outnumber the free blocks (paid for by the removes that made
        them), renumbering the free blocks from _base."""
        live = self.get_all_free_blocks()
        pos = self._base
        for block in live:
            block.free_pos = pos
            pos += 1
        self._order = cast(list[KVCacheBlock | None], live)
        self._head = 0
        self._num_holes = 0

    def __len__(self) -> int:
        return self.num_free_blocks
