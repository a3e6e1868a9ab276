"""check_invariants(): structural checks of the KV cache and queues, for tests after every step."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servesim.scheduler.scheduler import Scheduler


class InvariantError(AssertionError):
    pass


def _fail(msg: str) -> None:
    raise InvariantError(msg)


def check_invariants(sched: Scheduler) -> None:
    kvm = sched.kv_cache_manager
    pool = kvm.block_pool
    free_list = pool.free_block_queue.get_all_free_blocks()
    problem = pool.free_block_queue.check()
    if problem is not None:
        _fail(problem)
    free_ids = {b.block_id for b in free_list}
    if len(free_ids) != len(free_list):
        _fail("a block appears twice in the free queue")
    if len(free_list) != pool.get_num_free_blocks():
        _fail(f"free counter {pool.get_num_free_blocks()} != free list length {len(free_list)}")
    if 0 in free_ids:
        _fail("the null block is in the free queue")
    # Reference counts must equal the number of block-table entries pointing at each block.
    held = Counter()
    for m in kvm.coordinator.managers:
        for rid, blocks in m.req_to_blocks.items():
            real = [b.block_id for b in blocks if not b.is_null]
            if len(real) != len(set(real)):
                _fail(f"request {rid} holds a block twice in group {m.group_id}")
            held.update(real)
    for block in pool.blocks[1:]:
        if block.ref_cnt < 0:
            _fail(f"block {block.block_id} has ref_cnt {block.ref_cnt}")
        if (block.ref_cnt == 0) != (block.block_id in free_ids):
            _fail(f"block {block.block_id}: ref_cnt {block.ref_cnt} but in free queue={block.block_id in free_ids}")
        if block.ref_cnt != held[block.block_id]:
            _fail(f"block {block.block_id}: ref_cnt {block.ref_cnt} != {held[block.block_id]} holders")
    used = sum(1 for b in pool.blocks[1:] if b.ref_cnt > 0)
    if used + len(free_list) != pool.num_gpu_blocks - 1:
        _fail(f"free ({len(free_list)}) + used ({used}) != usable blocks ({pool.num_gpu_blocks - 1})")
    for key, block in pool.cached_block_hash_to_block.items():
        if block.block_hash != key:
            _fail(f"hash map entry points at block {block.block_id} that carries another hash")
    _check_private_blocks(sched)
    _check_queues(sched)
    _check_encoder_cache(sched)


def _check_encoder_cache(sched: Scheduler) -> None:
    """The encoder cache's own invariants (EncoderCache.check)."""
    problem = sched.encoder_cache_manager.check(set(sched.requests))
    if problem is not None:
        _fail(problem)


def _check_private_blocks(sched: Scheduler) -> None:
    """Private caching (block_pool.py): a block is cached privately or in the map, never both; the
    pool counts its private blocks; a private request is unfinished, or its KV is still held (a
    policy's pin, a KV transfer's delayed free: freeing it ends its private caching)."""
    pool = sched.kv_cache_manager.block_pool
    private = [b for b in pool.blocks if b.private_hash is not None]
    if len(private) != pool.num_private_cached:
        _fail(f"{len(private)} blocks carry a private hash, the pool counts {pool.num_private_cached}")
    for block in private:
        if block.block_hash is not None:
            _fail(f"block {block.block_id} is cached both privately and in the hash map")
    held = sched.policy.held_request_ids()
    for rid in pool.private_ids:
        if rid not in sched.requests and rid not in held:
            _fail(f"{rid} still caches privately but the scheduler neither runs it nor holds its KV")


def _check_queues(sched: Scheduler) -> None:
    from servesim.scheduler.request import RequestStatus

    running_ids = [r.request_id for r in sched.running]
    if len(running_ids) != len(set(running_ids)):
        _fail("a request is in running twice")
    if len(sched.running) > sched.max_num_running_reqs:
        _fail("more running requests than max_num_seqs")
    for r in sched.running:
        if r.status != RequestStatus.RUNNING:
            _fail(f"{r.request_id} is in running with status {r.status.name}")
    waiting = list(sched.waiting) + list(sched.skipped_waiting)
    for r in waiting:
        if r.status == RequestStatus.RUNNING or r.is_finished():
            _fail(f"{r.request_id} is waiting with status {r.status.name}")
    if set(running_ids) & {r.request_id for r in waiting}:
        _fail("a request is both running and waiting")
    held = sched.policy.held_request_ids()  # finished, but the policy keeps their KV (pins)
    holders = set()
    for m in sched.kv_cache_manager.coordinator.managers:
        holders.update(rid for rid, blocks in m.req_to_blocks.items() if blocks)
    # Finished requests whose blocks a KV transfer still uses (vLLM's delayed free) stay in requests.
    delayed = {rid for rid, r in sched.requests.items() if r.is_finished()}
    stray = holders - set(running_ids) - held - delayed - {r.request_id for r in waiting}
    if stray:
        _fail(f"requests hold KV blocks but are neither running, waiting nor held by the policy: {sorted(stray)[:5]}")
