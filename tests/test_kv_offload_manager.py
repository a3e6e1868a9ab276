"""The CPU tier's manager and its LRU / ARC policies (scheduler/kv_offload/), by hand and by property.

Hand-built sequences follow vLLM 0.19.1's semantics (vllm/v1/kv_offload/cpu/manager.py and
policies/): CPU block ids fresh first then last-freed first, blocks in flight neither loadable nor
evictable, loads pin, a store never evicts one of its own blocks, an impossible store changes nothing.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.scheduler.kv_offload.manager import CPUOffloadingManager
from servesim.scheduler.kv_offload.policies import ARCCachePolicy, LRUCachePolicy

A, B, C, D, E, F, X = (bytes([i]) for i in range(7))


def _stored(m: CPUOffloadingManager, hashes: list[bytes]) -> list[int]:
    out = m.prepare_store(hashes)
    assert out is not None
    m.complete_store(out.block_hashes_to_store)
    return out.store_block_ids


def test_lru_store_lookup_evict_and_reuse_ids():
    m = CPUOffloadingManager(block_size=32, num_blocks=4, cache_policy="lru", enable_events=True)
    out = m.prepare_store([A, B, C])
    assert (out.block_hashes_to_store, out.store_block_ids, out.block_hashes_evicted) == ([A, B, C], [0, 1, 2], [])
    assert m.lookup([A, B, C]) == 0  # in flight: not loadable yet
    m.complete_store([A, B, C])
    assert m.lookup([A, B, C, D]) == 3
    assert m.lookup([B, A]) == 2 and m.lookup([D, A]) == 0  # from the first block only
    out = m.prepare_store([D, E])  # one free block: evict the least recent (A); fresh id 3, then A's 0
    assert (out.store_block_ids, out.block_hashes_evicted) == ([3, 0], [A])
    events = list(m.take_events())
    assert [(e.block_hashes, e.removed) for e in events] == [([A, B, C], False), ([A], True)]
    assert list(m.take_events()) == []
    m.complete_store([D, E])
    m.touch([B])  # order now C, D, E, B
    assert m.prepare_load([C]) == [2]  # pinned: not evictable
    out = m.prepare_store([F])
    assert (out.store_block_ids, out.block_hashes_evicted) == ([3], [D])
    m.complete_load([C])
    # Already held blocks are not stored again, and never evicted for the others.
    out = m.prepare_store([E, X])
    assert out.block_hashes_to_store == [X] and out.block_hashes_evicted == [C]


def test_store_that_cannot_get_room_changes_nothing():
    m = CPUOffloadingManager(block_size=16, num_blocks=2, cache_policy="lru")
    _stored(m, [A])
    m.prepare_store([B])  # in flight: not evictable
    assert m.prepare_store([C, D]) is None  # needs 2 victims, only A is evictable
    assert m.lookup([A]) == 1 and m.num_free_blocks() == 0
    m.prepare_load([A])
    assert m.prepare_store([C]) is None  # A pinned by a load, B in flight


def test_touch_order_first_hash_becomes_most_recent():
    m = CPUOffloadingManager(block_size=16, num_blocks=3, cache_policy="lru")
    _stored(m, [A, B, C])
    m.touch([C, A])  # reversed: A then C moved to the end -> B, A, C
    assert m.prepare_store([D]).block_hashes_evicted == [B]


def test_failed_store_frees_the_blocks_in_flight():
    m = CPUOffloadingManager(block_size=16, num_blocks=2, cache_policy="arc")
    _stored(m, [A])
    m.prepare_store([B])
    m.complete_store([A, B], success=False)  # A is ready: kept; B was in flight: dropped
    assert m.lookup([A]) == 1 and m.lookup([B]) == 0 and m.num_free_blocks() == 1
    assert m.prepare_store([C]).store_block_ids == [1]  # B's freed id


def test_arc_promotion_ghost_hits_and_target():
    m = CPUOffloadingManager(block_size=16, num_blocks=2, cache_policy="arc")
    arc = m._policy
    assert isinstance(arc, ARCCachePolicy)
    _stored(m, [A, B])
    m.touch([A])  # seen again: T2
    assert list(arc.t1) == [B] and list(arc.t2) == [A]
    out = m.prepare_store([C])  # T1 (1) >= target (0): evict T1's oldest
    assert out.block_hashes_evicted == [B] and out.store_block_ids == [1] and list(arc.b1) == [B]
    m.touch([B])  # B1 ghost hit: target + max(1, |B2|/|B1|) = 1
    assert arc.target_t1_size == 1
    m.complete_store([C])
    assert m.prepare_store([D]).block_hashes_evicted == [C]  # T1 (1) >= 1
    m.touch([B])
    assert arc.target_t1_size == 2  # capped at the capacity
    m.complete_store([D])
    assert m.prepare_store([E]).block_hashes_evicted == [A]  # T1 (1) < 2: from T2
    assert list(arc.b2) == [A] and list(arc.b1) == [C, B]  # the ghost hit moved B to the end
    m.touch([A])  # B2 ghost hit: target - max(1, |B1|/|B2| = 2)
    assert arc.target_t1_size == 0


def test_arc_touch_keeps_a_block_in_flight_in_t1():
    arc = ARCCachePolicy(cache_capacity=4)
    m = CPUOffloadingManager(block_size=16, num_blocks=4, cache_policy="arc")
    m._policy = arc
    m.prepare_store([A, B])
    m.touch([A, B])
    assert list(arc.t1) == [B, A] and not arc.t2


def test_arc_ghost_lists_trimmed_to_capacity():
    m = CPUOffloadingManager(block_size=16, num_blocks=1, cache_policy="arc")
    for h in (A, B, C, D):
        _stored(m, [h])
    assert list(m._policy.b1) == [C]


def test_unknown_policy_suggests_a_name():
    with pytest.raises(ValueError, match="unknown offload eviction policy 'arcc'; did you mean 'arc'"):
        CPUOffloadingManager(block_size=16, num_blocks=1, cache_policy="arcc")


# --- properties ------------------------------------------------------------------------------
_ops = st.lists(st.tuples(st.sampled_from(["store", "complete", "load", "unload", "touch", "fail"]),
                          st.lists(st.integers(0, 11), min_size=1, max_size=4, unique=True)),
                max_size=60)


@settings(max_examples=200, deadline=None)
@given(policy=st.sampled_from(["lru", "arc"]), capacity=st.integers(1, 6), ops=_ops)
def test_manager_invariants(policy, capacity, ops):
    """Whatever the calls: at most `capacity` blocks, distinct CPU ids below it, pinned and in-flight
    blocks never evicted, an impossible store changes nothing, ARC's lists bounded."""
    m = CPUOffloadingManager(block_size=16, num_blocks=capacity, cache_policy=policy)
    pinned: dict[bytes, int] = {}
    for op, keys in ops:
        hashes = [bytes([k]) for k in keys]
        pol = m._policy
        held = dict(pol.blocks) if policy == "lru" else {**pol.t1, **pol.t2}
        if op == "store":
            out = m.prepare_store(hashes)
            if out is None:
                after = dict(pol.blocks) if policy == "lru" else {**pol.t1, **pol.t2}
                assert after == held
                continue
            for h in out.block_hashes_evicted:
                assert held[h].is_ready and held[h].ref_cnt == 0 and h not in hashes and h not in pinned
        elif op == "complete":
            m.complete_store(hashes)
        elif op == "fail":
            m.complete_store(hashes, success=False)
        elif op == "load":
            n = m.lookup(hashes)
            m.prepare_load(hashes[:n])
            for h in hashes[:n]:
                pinned[h] = pinned.get(h, 0) + 1
        elif op == "unload":
            done = [h for h in hashes if h in pinned]
            m.complete_load(done)
            for h in done:
                pinned[h] -= 1
                if not pinned[h]:
                    del pinned[h]
        else:
            m.touch(hashes)
        now = dict(pol.blocks) if policy == "lru" else {**pol.t1, **pol.t2}
        ids = [b.block_id for b in now.values()]
        assert len(now) <= capacity and len(set(ids)) == len(ids) and all(0 <= i < capacity for i in ids)
        assert len(now) + m.num_free_blocks() == capacity
        assert all(h in now and now[h].ref_cnt == n for h, n in pinned.items())
        if policy == "arc":
            assert len(pol.b1) <= capacity and len(pol.b2) <= capacity and 0 <= pol.target_t1_size <= capacity
            assert not (set(pol.t1) & set(pol.t2))


@settings(max_examples=200, deadline=None)
@given(capacity=st.integers(1, 5), ops=st.lists(st.tuples(st.booleans(), st.integers(0, 9)), max_size=50))
def test_lru_evicts_in_recency_order(capacity, ops):
    """LRU against a plain list model: stores of ready blocks evict the least recently touched."""
    m = CPUOffloadingManager(block_size=16, num_blocks=capacity, cache_policy="lru")
    order: list[bytes] = []  # least recent first
    for is_touch, k in ops:
        h = bytes([k])
        if is_touch:
            m.touch([h])
            if h in order:
                order.remove(h)
                order.append(h)
            continue
        out = m.prepare_store([h])
        expected_victims = [] if h in order or len(order) < capacity else [order[0]]
        assert out.block_hashes_evicted == expected_victims
        m.complete_store([h])
        for v in expected_victims:
            order.remove(v)
        if h not in order:
            order.append(h)
    assert list(m._policy.blocks) == order
    assert isinstance(m._policy, LRUCachePolicy)
