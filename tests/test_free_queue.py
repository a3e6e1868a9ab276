"""FreeKVCacheBlockQueue (an array with holes, scheduler/kv/block.py) against a plain list with
vLLM's documented semantics: the same order, counts and errors after every operation, through
random popleft / popleft_n / remove / append / append_n / index_of_first sequences on small pools
with the prefix trim and the hole compaction forced (small thresholds), plus the edge cases."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.scheduler.kv.block import FreeKVCacheBlockQueue, KVCacheBlock
from servesim.scheduler.kv.block_pool import BlockPool


class ListQueue:
    """The reference: free blocks in a list, front (evicted first) to back."""

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        self.blocks = list(blocks)

    def popleft(self) -> KVCacheBlock:
        if not self.blocks:
            raise ValueError
        return self.blocks.pop(0)

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        if n > len(self.blocks):
            raise ValueError
        out, self.blocks = self.blocks[:n], self.blocks[n:]
        return out

    def remove(self, block: KVCacheBlock) -> None:
        if block not in self.blocks:
            raise RuntimeError
        self.blocks.remove(block)

    def append_n(self, blocks: list[KVCacheBlock]) -> None:
        self.blocks.extend(blocks)

    def index_of_first(self, block_ids: set[int], limit: int) -> int:
        limit = min(limit, len(self.blocks))
        return next((i for i, b in enumerate(self.blocks[:limit]) if b.block_id in block_ids), limit)


def _check_layout(q: FreeKVCacheBlockQueue) -> None:
    """The module docstring's invariants (FreeKVCacheBlockQueue.check)."""
    assert q.check() is None
    assert len(q._order) - q._head == q.num_free_blocks + q._num_holes


def _outcome(fn, *args):
    """What a call returns, or the type of what it raises."""
    try:
        return fn(*args)
    except (ValueError, RuntimeError) as e:
        return type(e)


# remove twice as likely as the others: holes pile up until a compaction
OPS = st.lists(st.tuples(st.sampled_from(["popleft", "popleft_n", "remove", "remove", "append", "append_n", "index"]),
                         st.integers(0, 10**6), st.integers(0, 12)), min_size=30, max_size=400)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(num_blocks=st.integers(1, 24), min_trim=st.integers(1, 8), min_compact=st.integers(1, 8), ops=OPS)
def test_queue_matches_a_list(num_blocks: int, min_trim: int, min_compact: int, ops) -> None:
    blocks = [KVCacheBlock(i) for i in range(num_blocks)]
    q = FreeKVCacheBlockQueue(blocks, min_trim=min_trim, min_compact=min_compact)
    ref = ListQueue(blocks)
    held: list[KVCacheBlock] = []  # blocks out of the queue, in the order they left it
    for op, a, k in ops:
        if op == "popleft":
            got, want = _outcome(q.popleft), _outcome(ref.popleft)
            assert got is want
            if isinstance(got, KVCacheBlock):
                held.append(got)
        elif op == "popleft_n":
            got, want = _outcome(q.popleft_n, k), _outcome(ref.popleft_n, k)
            assert got == want
            if isinstance(got, list):
                held.extend(got)
        elif op == "remove":  # mostly a free one (a prefix hit); any block: a held one raises
            choices = ref.blocks if a & 3 and ref.blocks else blocks
            block = choices[(a >> 2) % len(choices)]
            assert _outcome(q.remove, block) is _outcome(ref.remove, block)
            if block not in held:
                held.append(block)
        elif op == "append" and held:
            block = held.pop(a % len(held))
            q.append(block)
            ref.append_n([block])
        elif op == "append_n":  # k held blocks, from a scattered start
            start = a % (len(held) + 1)
            chunk, held[start:start + k] = held[start:start + k], []
            q.append_n(chunk[::-1] if a & 1 else chunk)
            ref.append_n(chunk[::-1] if a & 1 else chunk)
        elif op == "index":
            ids = {(a >> s) % num_blocks for s in range(0, 12, 4)}
            assert q.index_of_first(ids, k) == ref.index_of_first(ids, k)
        assert q.get_all_free_blocks() == ref.blocks
        assert q.num_free_blocks == len(q) == len(ref.blocks)
        _check_layout(q)


def test_trim_and_compaction_keep_the_array_small() -> None:
    """A long churn (pop, remove from the middle, append back) on 50 blocks: the array never grows
    past what the thresholds allow, and the order stays the reference's."""
    blocks = [KVCacheBlock(i) for i in range(50)]
    q = FreeKVCacheBlockQueue(blocks, min_trim=16, min_compact=8)
    ref = ListQueue(blocks)
    for i in range(5000):
        popped = q.popleft_n(3)
        assert popped == ref.popleft_n(3)
        victim = ref.blocks[(i * 7) % len(ref.blocks)]
        q.remove(victim)
        ref.remove(victim)
        back = [victim, *popped][:: 1 if i % 3 else -1]
        q.append_n(back)
        ref.append_n(back)
        assert len(q._order) <= 2 * 16 + 2 * 50 + 8
    assert q.get_all_free_blocks() == ref.blocks
    _check_layout(q)


def test_empty_queue() -> None:
    q = FreeKVCacheBlockQueue([])
    assert len(q) == q.num_free_blocks == 0 and q.get_all_free_blocks() == []
    assert q.popleft_n(0) == []
    assert q.index_of_first({0}, 5) == 0
    with pytest.raises(ValueError, match="no free blocks available"):
        q.popleft()
    with pytest.raises(ValueError, match="cannot pop 1 blocks: only 0 free"):
        q.popleft_n(1)
    block = KVCacheBlock(3)
    with pytest.raises(RuntimeError, match="not in the free queue"):
        q.remove(block)
    q.append(block)
    assert q.popleft() is block and len(q) == 0


def test_pop_more_than_free_changes_nothing() -> None:
    blocks = [KVCacheBlock(i) for i in range(4)]
    q = FreeKVCacheBlockQueue(blocks)
    q.remove(blocks[1])
    with pytest.raises(ValueError, match="cannot pop 4 blocks: only 3 free"):
        q.popleft_n(4)
    assert q.get_all_free_blocks() == [blocks[0], blocks[2], blocks[3]]
    assert q.popleft_n(3) == [blocks[0], blocks[2], blocks[3]]


def test_remove_twice_and_after_pop_raise() -> None:
    """A stale position (the block left the queue, its slot is a hole, consumed or reused after
    a compaction) never passes for membership."""
    blocks = [KVCacheBlock(i) for i in range(6)]
    q = FreeKVCacheBlockQueue(blocks, min_trim=1, min_compact=1)
    q.remove(blocks[2])
    with pytest.raises(RuntimeError, match="not in the free queue"):
        q.remove(blocks[2])
    first = q.popleft()
    with pytest.raises(RuntimeError, match="not in the free queue"):
        q.remove(first)
    for b in blocks[3:]:  # removing 4 compacts (3 holes, 2 free): 1 and 5 renumbered from _base
        q.remove(b)
    assert q.get_all_free_blocks() == [blocks[1]] and q._order == [blocks[1], None]
    for b in (blocks[0], blocks[2], blocks[3]):
        with pytest.raises(RuntimeError, match="not in the free queue"):
            q.remove(b)
    q.append_n([blocks[4], blocks[2]])
    q.remove(blocks[4])
    assert q.get_all_free_blocks() == [blocks[1], blocks[2]]


def test_index_of_first_skips_holes() -> None:
    blocks = [KVCacheBlock(i) for i in range(8)]
    q = FreeKVCacheBlockQueue(blocks)
    q.remove(blocks[0])
    q.remove(blocks[2])
    # free: 1 3 4 5 6 7
    assert q.index_of_first({4}, 10) == 2
    assert q.index_of_first({4}, 2) == 2
    assert q.index_of_first({9}, 10) == 6
    assert q.index_of_first({1, 7}, 10) == 0


def test_null_block_is_never_free() -> None:
    """BlockPool pops block 0 as its null block: it never comes back, whatever is freed or hit."""
    pool = BlockPool(5, enable_caching=True)
    q = pool.free_block_queue
    assert [b.block_id for b in q.get_all_free_blocks()] == [1, 2, 3, 4]
    with pytest.raises(RuntimeError, match="not in the free queue"):
        q.remove(pool.null_block)
    got = pool.get_new_blocks(2)
    pool.touch([pool.null_block])  # a sliding-window placeholder in a hit: no queue operation
    pool.free_blocks([got[1], pool.null_block, got[0]])
    assert [b.block_id for b in q.get_all_free_blocks()] == [3, 4, 2, 1]


def test_check_reports_a_broken_layout() -> None:
    """check() (run by scheduler/invariants.py) names a block whose position is off."""
    blocks = [KVCacheBlock(i) for i in range(3)]
    q = FreeKVCacheBlockQueue(blocks)
    q.remove(blocks[0])
    assert q.check() is None
    blocks[2].free_pos = 1
    assert q.check() == "free queue: KVCacheBlock(id=2, ref_cnt=0, hashed=False) at 2, its free_pos says 1"
