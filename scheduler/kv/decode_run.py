"""Bulk KV operations for runs of plain decode steps (macro-steps); mixed into KVCacheManager."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servesim.scheduler.kv.manager import KVCacheManager
    from servesim.scheduler.request import Request


class DecodeRunMixin:
    """Bulk KV operations for a run of plain decode steps (macro-steps, simulator/macro_step.py).

    Mixed into KVCacheManager. Every operation is the one allocate_slots would perform step by
    step, in the same global order (step, then position in `running`; within a request the
    allocation before the caching), so block ids, the free queue and the prefix-cache map end up
    identical to stepping.
    """

    def supports_decode_runs(self: KVCacheManager) -> bool:
        """One full-attention group and no KV events: the only layout the bulk path replays."""
        return self._single_full is not None and not self.block_pool.enable_kv_cache_events

    def decode_run_fit(self: KVCacheManager, requests: Sequence[Request], num_steps: int) -> int:
        """The largest k <= num_steps whose decode allocations all fit in the free blocks (no
        eviction of a running request's KV, so no preemption): free blocks only ever shrink."""
        mgr = self._single_full
        assert mgr is not None
        bs = self.block_size
        free = self.block_pool.free_block_queue.num_free_blocks
        starts = [(r.num_computed_tokens, len(mgr.req_to_blocks.get(r.request_id, ()))) for r in requests]

        def need(k: int) -> int:
            return sum(max(0, -(-(c + k) // bs) - held) for c, held in starts)

        if need(num_steps) <= free:
            return num_steps
        lo, hi = 0, num_steps  # need(lo) fits, need(hi) does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if need(mid) <= free:
                lo = mid
            else:
                hi = mid
        return lo

    def apply_decode_run(self: KVCacheManager, requests: Sequence[Request], num_steps: int,
                         num_tokens_before: Sequence[int]) -> list[int]:
        """Perform num_steps decode schedules' allocations and prefix-cache insertions.

        Step j (0-based) schedules one token per request: allocate_slots makes the request hold
        cdiv(c0 + j + 1, block_size) blocks and caches its full blocks up to
        min(c0 + j + 1, t0 + j) tokens, where c0 is its num_computed_tokens now and t0 =
        num_tokens_before[i] its token count when step 0 is scheduled. The caller has already
        appended the tokens (block hashes only grow). Returns the free-block count after each
        step's allocations (what kv usage reads)."""
        mgr = self._single_full
        assert mgr is not None
        bs = self.block_size
        caching = self.enable_caching
        pool = self.block_pool
        events: list[tuple[int, int, int, int]] = []  # (step, request index, 0 alloc | 1 cache, arg)
        allocs_per_step = [0] * num_steps
        for i, r in enumerate(requests):
            c0 = r.num_computed_tokens
            held = len(mgr.req_to_blocks.get(r.request_id, ()))
            last_blocks = -(-(c0 + num_steps) // bs)
            for b in range(held + 1, last_blocks + 1):  # block b is first needed at step j
                j = max(0, (b - 1) * bs - c0)
                events.append((j, i, 0, 1))
                allocs_per_step[j] += 1
            if caching:
                e = min(1, num_tokens_before[i] - c0)  # 1: sync (c0 = t0 - 1); 0: async (c0 = t0)
                cached = mgr.num_cached_block.get(r.request_id, 0)
                last_full = (c0 + num_steps - 1 + e) // bs
                for f in range(cached + 1, last_full + 1):
                    events.append((max(0, f * bs - c0 - e), i, 1, f * bs))
        events.sort()
        for _j, i, kind, arg in events:
            r = requests[i]
            if kind == 0:
                mgr.req_to_blocks[r.request_id].extend(pool.get_new_blocks(arg))
            else:
                mgr.cache_blocks(r, arg)
        free = pool.free_block_queue.num_free_blocks + sum(allocs_per_step)
        out: list[int] = []
        for n in allocs_per_step:
            free -= n
            out.append(free)
        return out

    def usage_at(self: KVCacheManager, num_free_blocks: int) -> float:
        """`usage` when num_free_blocks blocks are free (BlockPool.get_usage's arithmetic)."""
        total = self.block_pool.num_gpu_blocks - 1
        return 1.0 - num_free_blocks / total if total else 0.0
