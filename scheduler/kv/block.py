"""KV cache blocks and the free-block queue (a doubly linked list threaded through the blocks).

Blocks carry their own prev/next pointers so the queue never allocates: popleft, append and
removal from the middle (a prefix-cache hit on an eviction candidate) are all O(1).
"""

from __future__ import annotations


class KVCacheBlock:
    __slots__ = ("block_id", "ref_cnt", "_block_hash", "private_hash", "prev_free_block", "next_free_block", "is_null")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0  # requests (and pins) holding this block
        # Hash key (block hash + group id) while the block is in the prefix cache, else None.
        self._block_hash: bytes | None = None
        # Block hash (no group id) while the block caches a private request's tokens outside the
        # hash map (block_pool.py, "Private blocks"); then _block_hash is None. Never both set.
        self.private_hash: bytes | None = None
        self.prev_free_block: KVCacheBlock | None = None
        self.next_free_block: KVCacheBlock | None = None
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
    """Free blocks in eviction order: least recently freed first.

    Invariant: a block is linked into this queue iff its ref_cnt is 0 (the null block aside).
    Within one request's freed blocks, the tail of the chain is appended first (the caller
    reverses), so the most specific prefix blocks are evicted before the shared ones.
    """

    __slots__ = ("num_free_blocks", "_head", "_tail")

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        self.num_free_blocks = len(blocks)
        # Sentinels make every real block have both neighbours, so no branch on the ends.
        self._head = KVCacheBlock(block_id=-1)
        self._tail = KVCacheBlock(block_id=-1)
        prev = self._head
        for block in blocks:
            prev.next_free_block = block
            block.prev_free_block = prev
            prev = block
        prev.next_free_block = self._tail
        self._tail.prev_free_block = prev

    def popleft(self) -> KVCacheBlock:
        first = self._head.next_free_block
        if first is self._tail:
            raise ValueError("no free blocks available")
        assert first is not None and first.next_free_block is not None
        self._head.next_free_block = first.next_free_block
        first.next_free_block.prev_free_block = self._head
        first.prev_free_block = first.next_free_block = None
        self.num_free_blocks -= 1
        return first

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        if n == 0:
            return []
        if n > self.num_free_blocks:
            raise ValueError(f"cannot pop {n} blocks: only {self.num_free_blocks} free")
        self.num_free_blocks -= n
        out = []
        # Never None: n <= num_free_blocks, and the tail sentinel ends the chain.
        cur: KVCacheBlock = self._head.next_free_block  # type: ignore[assignment]
        for _ in range(n):
            out.append(cur)
            nxt = cur.next_free_block
            cur.prev_free_block = cur.next_free_block = None
            cur = nxt  # type: ignore[assignment]
        self._head.next_free_block = cur
        cur.prev_free_block = self._head
        return out

    def remove(self, block: KVCacheBlock) -> None:
        prev, nxt = block.prev_free_block, block.next_free_block
        if prev is None or nxt is None:
            raise RuntimeError(f"remove() of a block that is not in the free queue: {block}")
        prev.next_free_block = nxt
        nxt.prev_free_block = prev
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        last: KVCacheBlock = self._tail.prev_free_block  # type: ignore[assignment]  # (the head at least)
        last.next_free_block = block
        block.prev_free_block = last
        block.next_free_block = self._tail
        self._tail.prev_free_block = block
        self.num_free_blocks += 1

    def append_n(self, blocks: list[KVCacheBlock]) -> None:
        if not blocks:
            return
        last: KVCacheBlock = self._tail.prev_free_block  # type: ignore[assignment]  # (the head at least)
        for block in blocks:
            block.prev_free_block = last
            last.next_free_block = block
            last = block
        last.next_free_block = self._tail
        self._tail.prev_free_block = last
        self.num_free_blocks += len(blocks)

    def index_of_first(self, block_ids: set[int], limit: int) -> int:
        """Position (0: popped first) of the first free block whose id is in block_ids, looking at
        the first `limit` blocks only; `limit` (or the queue length) if none is. O(limit)."""
        limit = min(limit, self.num_free_blocks)
        cur: KVCacheBlock = self._head.next_free_block  # type: ignore[assignment]  # (the tail ends it)
        for i in range(limit):
            if cur.block_id in block_ids:
                return i
            cur = cur.next_free_block  # type: ignore[assignment]
        return limit

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """Free blocks front (evicted first) to back. O(n): for tests and invariant checks."""
        out = []
        cur: KVCacheBlock = self._head.next_free_block  # type: ignore[assignment]  # (the tail ends it)
        while cur is not self._tail:
            out.append(cur)
            cur = cur.next_free_block  # type: ignore[assignment]
        return out

    def __len__(self) -> int:
        return self.num_free_blocks
