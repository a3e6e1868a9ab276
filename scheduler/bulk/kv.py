"""The KV cache manager's bulk operations for runs of plain decode steps (macro-steps).

`KVDecodeRuns` owns no state of its own: it reads and writes its KVCacheManager's (a friend:
scheduler/bulk/__init__.py). Every operation is the one allocate_slots would perform step by
step, in the same global order (step, then position in `running`; within a request the
allocation before the caching), so block ids, the free queue and the prefix-cache map end up
identical to stepping. Owned by the vLLM scheduler's bulk path (scheduler/bulk/vllm.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servesim.scheduler.kv.manager import KVCacheBlocks, KVCacheManager
    from servesim.scheduler.request import Request


@dataclass(slots=True)
class RunEvents:
    """A run's KV events as parallel columns: at step step[e], request req[e] gets a block (kind 0),
    caches its full blocks up to arg[e] tokens (kind 1; arg is 0 for the others) or finishes (2).
    They are appended in (request, kind, arg) order, so sorting the codes (step << shift) | e as
    plain ints gives vLLM's order (step, request, kind, arg): no key function, no tuples (and
    below 2**30, one-digit ints: CPython's fastest comparison)."""

    step: list[int]
    req: list[int]
    kind: list[int]
    arg: list[int]
    allocs_per_step: list[int]  # kind-0 events at each step

    def sorted_codes(self) -> tuple[list[int], int]:
        """(the codes in vLLM's order, the mask that takes an event index out of a code): see
        the class docstring. Codes, not indices: one list less on the hot path."""
        steps = self.step
        shift = len(steps).bit_length()
        codes = [(steps[e] << shift) | e for e in range(len(steps))]
        codes.sort()
        return codes, (1 << shift) - 1


class KVDecodeRuns:
    """Bulk KV operations of a run of plain decode steps on one KVCacheManager."""

    def __init__(self, kv_cache_manager: KVCacheManager) -> None:
        self.kvm = kv_cache_manager

    def supports_decode_runs(self) -> bool:
        """One full-attention group and no KV events: the only layout the bulk path replays."""
        kvm = self.kvm
        return kvm._single_full is not None and not kvm.block_pool.enable_kv_cache_events

    def decode_run_fit(self, requests: Sequence[Request], num_steps: int, head: Request | None = None,
                       head_hit: KVCacheBlocks | None = None, caps: list[int] | None = None,
                       joining: Sequence[Request] = ()) -> int:
        """The largest k <= num_steps whose decode allocations all fit in the free blocks (no
        eviction of a running request's KV, so no preemption): free blocks only ever shrink.
        `caps`: request i is scheduled at most caps[i] of the k steps (a run through finishes,
        apply_decode_run's steps_each); the blocks its finish frees are not counted, so every
        allocation pops a block that was free when the run began.

        `joining` (after `requests`, caps appended): requests the run's first schedule admits
        with their whole prompt (DecodeRuns.decode_run_joining), counted as decodes from the
        prompt less one token, in the blocks they hold now: every block a prompt's admission
        takes (a hit on a block others hold takes none) counts as one the run pops.

        `head`: the waiting request every schedule() of the run looks up (its hit now:
        `head_hit`, from peek_computed_blocks). The run then also keeps that lookup constant:
        its allocations stop short of the first free (evictable) hit block in the free queue,
        and it ends before a request caches a block the head's first missing hash could match
        (_first_miss_bound). Insertions never change which block a hash lookup returns (the
        first inserted) and no block is freed during a run, so the hit blocks, their ref_cnt
        and the hit length all stay as they are now."""
        kvm = self.kvm
        mgr = kvm._single_full
        assert mgr is not None
        bs = kvm.block_size
        queue = kvm.block_pool.free_block_queue
        room = queue.num_free_blocks
        limits = caps if caps is not None else [num_steps] * (len(requests) + len(joining))
        held = mgr.req_to_blocks
        starts = [(r.num_computed_tokens, len(held.get(r.request_id, ())), cap) for r, cap in zip(requests, limits)]
        if joining:
            starts += [(r.num_tokens - 1, len(held.get(r.request_id, ())), cap)
                       for r, cap in zip(joining, limits[len(requests):])]

        def need(k: int) -> int:
            return sum(max(0, -(-(c + min(k, cap)) // bs) - h) for c, h, cap in starts)

        if head is not None and head_hit is not None and kvm.enable_caching and not head.skip_reading_prefix_cache:
            num_steps = self._first_miss_bound(requests, num_steps, head, len(head_hit.blocks[0]))
            protected = {b.block_id for b in head_hit.blocks[0] if b.ref_cnt == 0}
            if protected:  # the run pops need(k) blocks from the front of the free queue
                room = min(room, queue.index_of_first(protected, need(num_steps)))
        if need(num_steps) <= room:
            return num_steps
        lo, hi = 0, num_steps  # need(lo) fits, need(hi) does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if need(mid) <= room:
                lo = mid
            else:
                hi = mid
        return lo

    def _first_miss_bound(self, requests: Sequence[Request], num_steps: int, head: Request,
                          num_hit_blocks: int) -> int:
        """Steps before any request of the run caches block index m = num_hit_blocks (0-based)
        under a hash that may equal the head's hash m (its first miss): the lookup of a later
        schedule would then hit one block more. A hash not yet computed (tokens still to come)
        may match; one already computed is compared. apply_decode_run caches block m of a
        request at step max(0, (m + 1) * block_size - c0 - e)."""
        m = num_hit_blocks
        if m >= (head.num_tokens - 1) // self.kvm.block_size:
            return num_steps  # the lookup never looks past block m - 1 (the last token is recomputed)
        return self.steps_before_caching(requests, num_steps, m, head.block_hashes[m])

    def steps_before_caching(self, requests: Sequence[Request], num_steps: int, m: int, miss: bytes) -> int:
        """Steps (of at most num_steps) before any of the run's `requests` caches its block m
        (0-based) under a hash that may equal `miss`: a hash not yet computed (tokens still to
        come) may; one already computed is compared. apply_decode_run caches block m of a request
        at step max(0, (m + 1) * block_size - c0 - e)."""
        kvm = self.kvm
        bs = kvm.block_size
        mgr = kvm._single_full
        assert mgr is not None
        for r in requests:
            if mgr.num_cached_block.get(r.request_id, 0) > m:
                continue  # its block m is cached already (and was missed)
            hashes = r.block_hashes
            if len(hashes) > m and hashes[m] != miss:
                continue
            c0 = r.num_computed_tokens
            num_steps = min(num_steps, max(0, (m + 1) * bs - c0 - min(1, r.num_tokens - c0)))
        return num_steps

    def hit_survives_decodes(self, batch: Sequence[Request], request: Request, hit: KVCacheBlocks) -> bool:
        """Whether `request` finds the prefix-cache hit it finds now (`hit`: peek_computed_blocks)
        after one decode schedule of `batch`, whose waiting phase then looks it up (a run's first
        schedule, a prompt joining it: DecodeRuns.decode_run_joining): those decodes' allocations
        pop no free block of the hit off the queue's front, and cache no block under its first
        missing hash. Only blocks of the hit with no holder are in the free queue."""
        kvm = self.kvm
        if not kvm.enable_caching or request.skip_reading_prefix_cache:
            return True
        blocks = hit.blocks[0]
        protected = {b.block_id for b in blocks if b.ref_cnt == 0}
        if protected:
            mgr = kvm._single_full
            assert mgr is not None
            bs = kvm.block_size
            held = mgr.req_to_blocks
            pops = sum([1 for r in batch if -(-(r.num_computed_tokens + 1) // bs) > len(held.get(r.request_id, ()))])
            if pops and kvm.block_pool.free_block_queue.index_of_first(protected, pops) < pops:
                return False
        return self._first_miss_bound(batch, 1, request, len(blocks)) >= 1

    def admission_surely_fits(self, request: Request) -> bool:
        """Whether the blocks of request's whole prompt (no hit) are free now: then neither
        admission_fails' allocation nor can_fit_full_sequence can refuse it, whatever its prefix
        hit (one full-attention group, supports_decode_runs: a hit of h blocks takes at most h
        blocks off the free queue and spares h new ones). Checks no hit: a waiting request's
        lookup is the costly part of a failed run proof (one per arrival, the Azure hour)."""
        kvm = self.kvm
        full = min(request.num_tokens, kvm.max_model_len)
        return -(-full // kvm.block_size) <= kvm.block_pool.get_num_free_blocks()

    def admission_fails(self, request: Request, num_new_tokens: int, hit: KVCacheBlocks,
                        num_hit_tokens: int, reserve_full_isl: bool) -> bool:
        """Whether schedule() now stops at this waiting request for lack of blocks: can_fit_full_sequence
        refuses it (with reserve_full_isl) or allocate_slots (no external tokens, no lookahead:
        a first admission) returns None. No side effect: allocate_slots checks before it
        changes anything. False (not proven) if the request holds blocks."""
        kvm = self.kvm
        rid = request.request_id
        if kvm.num_blocks_held(rid):
            return False
        if reserve_full_isl and not kvm.can_fit_full_sequence(request, num_hit_tokens, hit):
            return True
        local = request.num_computed_tokens + num_hit_tokens
        need_slot = min(min(local, kvm.max_model_len) + num_new_tokens, kvm.max_model_len)
        need = kvm.coordinator.get_num_blocks_to_allocate(rid, need_slot, hit.blocks, local, need_slot)
        return need > kvm.block_pool.get_num_free_blocks()

    def decode_run_lookups(self, head: Request | None, num_steps: int, with_updates: bool) -> tuple[list[int], list[int]]:
        """The prefix-cache lookups of num_steps schedules whose waiting head (None: no schedule
        reaches the waiting queue) finds the same hit each time (decode_run_fit kept it), recorded
        as get_computed_blocks records them. With updates, each schedule is followed by an update,
        which takes the stats and resets them (make_prefix_cache_stats): returns what each update
        takes, (hits, queries) of never-preempted requests; ([], []) without updates."""
        kvm = self.kvm
        if not with_updates:
            if head is not None:
                for _step in range(num_steps):
                    kvm.get_computed_blocks(head)
            return [], []
        if head is not None:
            kvm.get_computed_blocks(head)
        first = kvm.make_prefix_cache_stats()  # with whatever was pending before the run
        hits, queries = [first.hits], [first.queries]
        if num_steps > 1:
            if head is not None:
                kvm.get_computed_blocks(head)
            each = kvm.make_prefix_cache_stats()
            hits += [each.hits] * (num_steps - 1)
            queries += [each.queries] * (num_steps - 1)
        return hits, queries

    def _run_events(self, reqs: list[Request], num_steps: int, num_tokens_before: Sequence[int],
                    steps_each: list[int] | None) -> RunEvents:
        """The run's allocations, cachings and finishes (apply_decode_run), per request."""
        kvm = self.kvm
        mgr = kvm._single_full
        assert mgr is not None
        bs = kvm.block_size
        caching = kvm.enable_caching
        ev = RunEvents([], [], [], [], [0] * num_steps)
        # appended in place (no method call per event: a run of a large batch has thousands)
        ev_step, ev_req, ev_kind, ev_arg, allocs_per_step = ev.step, ev.req, ev.kind, ev.arg, ev.allocs_per_step
        for i in range(len(reqs)):
            r = reqs[i]
            c0 = r.num_computed_tokens
            n = num_steps if steps_each is None else steps_each[i]
            num_updates = n if n >= num_steps else n + 1  # a finishing request's last update
            held = len(mgr.req_to_blocks.get(r.request_id, ()))
            last_blocks = -(-(c0 + n) // bs)
            for b in range(held + 1, last_blocks + 1):  # block b is first needed at step j
                j = max(0, (b - 1) * bs - c0)
                ev_step.append(j)
                ev_req.append(i)
                ev_kind.append(0)
                ev_arg.append(0)
                allocs_per_step[j] += 1
            if caching:
                e = min(1, num_tokens_before[i] - c0)  # 1: sync (c0 = t0 - 1); 0: async (c0 = t0)
                cached = mgr.num_cached_block.get(r.request_id, 0)
                last_full = (c0 + num_updates - 1 + e) // bs
                for f in range(cached + 1, last_full + 1):
                    ev_step.append(max(0, f * bs - c0 - e))
                    ev_req.append(i)
                    ev_kind.append(1)
                    ev_arg.append(f * bs)
            if n < num_steps:
                ev_step.append(n)
                ev_req.append(i)
                ev_kind.append(2)
                ev_arg.append(0)
        return ev

    def apply_decode_run(self, requests: Sequence[Request], num_steps: int, num_tokens_before: Sequence[int],
                         steps_each: list[int] | None = None,
                         on_finish: Callable[[int], None] | None = None) -> list[int]:
        """Perform num_steps decode schedules' allocations and prefix-cache insertions.

        Step j (0-based) schedules one token per request: allocate_slots makes the request hold
        cdiv(c0 + j + 1, block_size) blocks and caches its full blocks up to
        min(c0 + j + 1, t0 + j) tokens, where c0 is its num_computed_tokens now and t0 =
        num_tokens_before[i] its token count when step 0 is scheduled. The caller has already
        appended the tokens (block hashes only grow). Returns the free-block count after each
        step's allocations (what kv usage reads; with finishes, after the earlier updates' frees).

        `steps_each` (async, through finishes): request i is scheduled steps_each[i] < num_steps
        times, and the update after schedule steps_each[i] caches its last block and calls
        on_finish(i) (the scheduler frees it: Scheduler._free_request). Its frees come after its
        own caching at that step, as in update_from_output; they only append blocks at the free
        queue's tail, which no allocation of the run reaches (decode_run_fit counts none of them),
        and caching touches no queue, so ordering them among the other requests' allocations and
        caching of that step changes nothing."""
        kvm = self.kvm
        mgr = kvm._single_full
        assert mgr is not None
        pool = kvm.block_pool
        reqs = list(requests)  # indexed per event: a list's, not a Sequence's generic lookup
        ev = self._run_events(reqs, num_steps, num_tokens_before, steps_each)
        ev_step, ev_req, ev_kind, ev_arg = ev.step, ev.req, ev.kind, ev.arg
        queue = pool.free_block_queue
        free = queue.num_free_blocks
        freed_per_step = [0] * num_steps  # blocks freed by the finishes of step j's update
        codes, mask = ev.sorted_codes()
        for code in codes:
            e = code & mask
            r = reqs[ev_req[e]]
            kind = ev_kind[e]
            if kind == 0:
                mgr.req_to_blocks[r.request_id].extend(pool.get_new_blocks(1))
            elif kind == 1:
                mgr.cache_blocks(r, ev_arg[e])
            elif on_finish is not None:
                before = queue.num_free_blocks
                on_finish(ev_req[e])
                freed_per_step[ev_step[e]] += queue.num_free_blocks - before
        out: list[int] = []
        freed = 0  # schedule j follows the updates before it, not its own
        for n_alloc, n_freed in zip(ev.allocs_per_step, freed_per_step):
            free -= n_alloc
            out.append(free + freed)
            freed += n_freed
        return out

    def usage_at(self, num_free_blocks: int) -> float:
        """`usage` when num_free_blocks blocks are free (BlockPool.get_usage's arithmetic)."""
        total = self.kvm.block_pool.num_gpu_blocks - 1
        return 1.0 - num_free_blocks / total if total else 0.0

    def usages_at(self, num_free_blocks: list[int]) -> list[float]:
        """usage_at of each count (the same floats), in one call."""
        total = self.kvm.block_pool.num_gpu_blocks - 1
        if not total:
            return [0.0] * len(num_free_blocks)
        return [1.0 - n / total for n in num_free_blocks]
