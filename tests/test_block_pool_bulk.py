"""BlockPool's bulk loops (get_new_blocks' evictions, cache_full_blocks' insertions) against the
pool's one-block-at-a-time primitives (_maybe_evict_cached_block, BlockHashToBlockMap.insert):
the same map entries in the same order, the same block hashes, references, free-queue order,
private counts and KV cache events, through duplicates (identical content cached twice), private
blocks, null blocks and frees in random orders."""

from __future__ import annotations

import random

import pytest

from servesim.scheduler import Request, SamplingParams, make_block_hasher
from servesim.scheduler.kv.block_pool import BlockPool, make_block_hash_with_group_id

BLOCK = 4


def _request(rid: str, tokens: list[int]) -> Request:
    return Request(rid, tokens, SamplingParams(max_tokens=4), block_hasher=make_block_hasher(BLOCK))


def _reference_cache(pool: BlockPool, request: Request, blocks, num_cached: int, num_full: int, gid: int) -> None:
    """cache_full_blocks one block at a time (no events, not private)."""
    for i in range(num_cached, num_full):
        blk = blocks[i]
        if blk.is_null:
            continue
        key = make_block_hash_with_group_id(request.block_hashes[i], gid)
        blk.block_hash = key
        pool.cached_block_hash_to_block.insert(key, blk)


def _reference_get(pool: BlockPool, n: int):
    """get_new_blocks one block at a time."""
    ret = pool.free_block_queue.popleft_n(n)
    for block in ret:
        pool._maybe_evict_cached_block(block)
        block.ref_cnt += 1
    return ret


def _state(pool: BlockPool):
    return ([(k, b.block_id) for k, b in pool.cached_block_hash_to_block.items()],
            [(b.block_id, b.block_hash, b.private_hash, b.ref_cnt) for b in pool.blocks],
            [b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
            pool.num_private_cached, [repr(e) for e in pool.kv_event_queue])


def _drive(pool: BlockPool, bulk: bool, seed: int, gid: int) -> list:
    """Random requests (few distinct prompts, so content repeats) allocate, cache and free."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(50) for _ in range(BLOCK * 6)] for _ in range(3)]
    held: dict[str, list] = {}
    states = []
    for step in range(60):
        if held and (rng.random() < 0.4 or pool.get_num_free_blocks() < 8):
            rid = rng.choice(sorted(held))
            pool.private_ids.discard(rid)
            pool.free_blocks(reversed(held.pop(rid)))
        else:
            rid = f"r{step}"
            request = _request(rid, rng.choice(prompts)[: BLOCK * rng.randint(1, 6)])
            if rng.random() < 0.3:
                pool.private_ids.add(rid)  # caches privately (block_pool.py, "Private blocks")
            n = len(request.block_hashes)
            blocks = pool.get_new_blocks(n) if bulk else _reference_get(pool, n)
            if rng.random() < 0.2:
                blocks[0] = pool.null_block  # a skipped (sliding-window) position
            cut = rng.randint(0, n)
            for lo, hi in ((0, cut), (cut, n)):  # two chunks
                if bulk or rid in pool.private_ids or pool.enable_kv_cache_events:
                    pool.cache_full_blocks(request, blocks, lo, hi, BLOCK, gid)
                else:
                    _reference_cache(pool, request, blocks, lo, hi, gid)
            held[rid] = [b for b in blocks if not b.is_null]
        states.append(_state(pool))
    return states


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("gid", [0, 20])  # a group id past the precomputed suffixes too
def test_bulk_loops_leave_the_pool_as_one_block_at_a_time(seed, gid):
    bulk = _drive(BlockPool(40, True), True, seed, gid)
    ref = _drive(BlockPool(40, True), False, seed, gid)
    assert bulk == ref
    assert any(len(s[0]) > 3 for s in bulk)  # the map was exercised


@pytest.mark.parametrize("seed", range(3))
def test_bulk_evictions_emit_the_same_events(seed):
    bulk = _drive(BlockPool(40, True, enable_kv_cache_events=True), True, seed, 0)
    ref = _drive(BlockPool(40, True, enable_kv_cache_events=True), False, seed, 0)
    assert bulk == ref
    assert any("BlockRemoved" in e for s in bulk for e in s[4])


def test_duplicate_key_eviction_keeps_the_other_block():
    pool = BlockPool(10, True)
    a, b = _request("a", list(range(BLOCK))), _request("b", list(range(BLOCK)))
    (x,) = pool.get_new_blocks(1)
    (y,) = pool.get_new_blocks(1)
    pool.cache_full_blocks(a, [x], 0, 1, BLOCK, 0)
    pool.cache_full_blocks(b, [y], 0, 1, BLOCK, 0)  # the same content: a duplicate under one key
    key = x.block_hash
    assert key == y.block_hash and pool.cached_block_hash_to_block.get_one_block(key) is x
    pool.free_blocks([x, y])  # x is evicted first (freed first)
    pool.get_new_blocks(7)  # pops the other 7 free blocks (block 0 is the null block)
    (popped,) = pool.get_new_blocks(1)
    assert popped is x and x.block_hash is None
    assert pool.cached_block_hash_to_block.get_one_block(key) is y
    assert [k for k, _ in pool.cached_block_hash_to_block.items()] == [key]


def test_caching_a_hashed_block_again_is_refused():
    pool = BlockPool(4, True)
    a = _request("a", list(range(BLOCK)))
    (x,) = pool.get_new_blocks(1)
    pool.cache_full_blocks(a, [x], 0, 1, BLOCK, 0)
    with pytest.raises(AssertionError, match="already has a hash"):
        pool.cache_full_blocks(a, [x], 0, 1, BLOCK, 0)
