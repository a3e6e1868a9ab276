"""KV cache: free queue, block pool, prefix caching, eviction order (exact block ids)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from servesim.scheduler import CacheConfig, KVCacheManager, Request, SamplingParams, make_block_hasher
from servesim.scheduler.kv.block import FreeKVCacheBlockQueue, KVCacheBlock
from servesim.scheduler.kv.block_pool import BlockPool
from servesim.scheduler.kv.events import BlockRemoved, BlockStored


def mk(rid, tokens, bs=4, **kw):
    return Request(rid, tokens, SamplingParams(max_tokens=8), block_hasher=make_block_hasher(bs), **kw)


def ids(blocks):
    return [b.block_id for b in blocks]


def test_free_queue_operations():
    blocks = [KVCacheBlock(i) for i in range(6)]
    q = FreeKVCacheBlockQueue(blocks)
    assert ids(q.get_all_free_blocks()) == [0, 1, 2, 3, 4, 5]
    assert q.popleft().block_id == 0
    q.remove(blocks[3])
    assert ids(q.get_all_free_blocks()) == [1, 2, 4, 5] and q.num_free_blocks == 4
    assert ids(q.popleft_n(2)) == [1, 2]
    q.append(blocks[0])
    q.append_n([blocks[3], blocks[1]])
    assert ids(q.get_all_free_blocks()) == [4, 5, 0, 3, 1]
    with pytest.raises(RuntimeError):
        q.remove(blocks[2])  # not in the queue
    with pytest.raises(ValueError):
        q.popleft_n(6)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["pop", "popn", "append", "remove"]), st.integers(0, 9)), max_size=60))
def test_free_queue_matches_a_list_model(ops):
    blocks = [KVCacheBlock(i) for i in range(10)]
    q = FreeKVCacheBlockQueue(blocks)
    model = list(range(10))
    for op, x in ops:
        if op == "pop" and model:
            assert q.popleft().block_id == model.pop(0)
        elif op == "popn":
            n = min(x % 4, len(model))
            assert ids(q.popleft_n(n)) == model[:n]
            del model[:n]
        elif op == "append" and x not in model:
            q.append(blocks[x])
            model.append(x)
        elif op == "remove" and x in model:
            q.remove(blocks[x])
            model.remove(x)
        assert ids(q.get_all_free_blocks()) == model
        assert q.num_free_blocks == len(model)


def manager(num_blocks=11, bs=4, caching=True, events=False, **kw):
    return KVCacheManager(CacheConfig(block_size=bs, num_gpu_blocks=num_blocks, enable_prefix_caching=caching,
                                      enable_kv_cache_events=events, **kw), max_model_len=1000)


def test_null_block_and_first_allocation_ids():
    kvm = manager()
    assert kvm.block_pool.null_block.block_id == 0
    r = mk("a", list(range(10)))
    blocks = kvm.allocate_slots(r, 10)
    assert blocks.get_block_ids() == ([1, 2, 3],)
    assert kvm.block_pool.get_num_free_blocks() == 10 - 3
    assert kvm.usage == pytest.approx(3 / 10)


def test_prefix_hit_capped_at_num_tokens_minus_one():
    kvm = manager()
    a = mk("a", list(range(8)))  # exactly two full blocks
    kvm.allocate_slots(a, 8)
    b = mk("b", list(range(8)))
    blocks, n = kvm.get_computed_blocks(b)
    # 8 tokens would all hit, but the last token must be recomputed: only 1 full block (4) counts.
    assert n == 4 and ids(blocks.blocks[0]) == [1]
    c = mk("c", list(range(9)))
    blocks, n = kvm.get_computed_blocks(c)
    assert n == 8 and ids(blocks.blocks[0]) == [1, 2]
    st_ = kvm.make_prefix_cache_stats()
    assert (st_.requests, st_.queries, st_.hits) == (2, 17, 12)


def test_only_full_blocks_are_cached_and_partial_block_grows():
    kvm = manager()
    a = mk("a", list(range(6)))
    kvm.allocate_slots(a, 6)
    assert kvm.block_pool.get_num_cached_blocks() == 1  # [0..3]; [4,5] is partial
    a.append_output_token_ids([6, 7])
    a.num_computed_tokens = 6
    kvm.allocate_slots(a, 2)
    assert kvm.block_pool.get_num_cached_blocks() == 2


def test_free_in_reverse_order_and_lru_eviction():
    kvm = manager(num_blocks=7)  # 6 usable
    a = mk("a", list(range(12)))
    kvm.allocate_slots(a, 12)  # blocks 1,2,3
    kvm.free(a)
    # Freed tail first: the free queue is 4,5,6 (never used) then 3,2,1.
    assert ids(kvm.block_pool.free_block_queue.get_all_free_blocks()) == [4, 5, 6, 3, 2, 1]
    b = mk("b", list(range(100, 116)))  # 4 blocks, no hit: takes 4,5,6 then evicts 3 (a's tail)
    kvm.allocate_slots(b, 16)
    assert kvm.get_block_ids("b") == ([4, 5, 6, 3],)
    c = mk("c", list(range(12)) + [99])  # a's first two blocks are still cached
    blocks, n = kvm.get_computed_blocks(c)
    assert n == 8 and ids(blocks.blocks[0]) == [1, 2]


def test_touch_removes_eviction_candidates_from_free_queue():
    kvm = manager()
    a = mk("a", list(range(8)))
    kvm.allocate_slots(a, 8)
    kvm.free(a)
    free_before = kvm.block_pool.get_num_free_blocks()
    b = mk("b", list(range(8)) + [1, 2, 3])
    blocks, n = kvm.get_computed_blocks(b)
    assert n == 8
    assert kvm.allocate_slots(b, 3, num_new_computed_tokens=8, new_computed_blocks=blocks) is not None
    assert kvm.get_block_ids("b") == ([1, 2, 3],)
    assert kvm.block_pool.get_num_free_blocks() == free_before - 3  # 2 hits + 1 new block


def test_allocate_slots_returns_none_without_side_effects():
    kvm = manager(num_blocks=4)  # 3 usable
    a = mk("a", list(range(8)))
    kvm.allocate_slots(a, 8)
    free = kvm.block_pool.get_num_free_blocks()
    b = mk("b", list(range(100, 112)))
    assert kvm.allocate_slots(b, 12) is None
    assert kvm.block_pool.get_num_free_blocks() == free and kvm.get_block_ids("b") == ([],)


def test_duplicate_content_keeps_both_blocks_and_events():
    kvm = manager(events=True)
    a, b = mk("a", list(range(4))), mk("b", list(range(4)))
    kvm.allocate_slots(a, 4)
    kvm.allocate_slots(b, 4)  # no lookup: same content cached twice, block tables stay append-only
    assert kvm.get_block_ids("a") == ([1],) and kvm.get_block_ids("b") == ([2],)
    ev = kvm.take_events()
    assert [type(e) for e in ev] == [BlockStored, BlockStored] and ev[0].token_ids == (0, 1, 2, 3)
    kvm.free(a)
    kvm.free(b)
    c = mk("c", list(range(200, 240)))
    kvm.allocate_slots(c, 40)  # takes every block, evicting both cached copies
    assert [type(e) for e in kvm.take_events()].count(BlockRemoved) == 2


def test_cache_salt_and_lora_isolate_hashes():
    h = make_block_hasher(4)
    base = Request("x", list(range(8)), SamplingParams(), block_hasher=h)
    salted = Request("y", list(range(8)), SamplingParams(), block_hasher=h, cache_salt="s")
    lora = Request("z", list(range(8)), SamplingParams(), block_hasher=h, lora_id=3)
    assert base.block_hashes[0] != salted.block_hashes[0]
    assert base.block_hashes[1] != salted.block_hashes[1]  # chained: salt reaches every block
    assert len({base.block_hashes[1], lora.block_hashes[1]}) == 2


def test_reset_prefix_cache_refused_while_in_use():
    kvm = manager()
    a = mk("a", list(range(8)))
    kvm.allocate_slots(a, 8)
    assert not kvm.reset_prefix_cache()
    kvm.free(a)
    assert kvm.reset_prefix_cache()
    assert kvm.get_computed_blocks(mk("b", list(range(9))))[1] == 0


def test_sliding_window_frees_blocks_outside_window():
    kvm = manager(num_blocks=20, sliding_window=8)
    r = mk("a", list(range(40)))
    kvm.allocate_slots(r, 40)  # 10 blocks
    r.num_computed_tokens = 40
    r.append_output_token_ids(7)
    kvm.allocate_slots(r, 1)
    held = kvm.get_block_ids("a")[0]
    # Tokens 0..32 fall outside a window of 8 ending at token 40: 8 leading blocks become null.
    assert held[:8] == [0] * 8 and 0 not in held[8:]


def test_sliding_window_hit_needs_only_the_window():
    kvm = manager(num_blocks=30, sliding_window=8)
    a = mk("a", list(range(24)))
    kvm.allocate_slots(a, 24)
    kvm.free(a)
    kvm.block_pool.get_new_blocks(kvm.block_pool.get_num_free_blocks() - 23)  # leave a's blocks cached
    b = mk("b", list(range(24)) + [5])
    blocks, n = kvm.get_computed_blocks(b)
    assert n == 24
    assert ids(blocks.blocks[0])[:4] == [0, 0, 0, 0]  # only the last 2 blocks matter for a window of 8


def test_hybrid_coordinator_fixed_point():
    kvm = manager(num_blocks=60, sliding_window=8, attention="hybrid")
    a = mk("a", list(range(24)))
    kvm.allocate_slots(a, 24)
    b = mk("b", list(range(24)) + [1])
    blocks, n = kvm.get_computed_blocks(b)
    assert n == 24
    assert len(blocks.blocks) == 2 and len(blocks.blocks[0]) == 6
