"""Planned reads: what a router that reads KV usage or the prefix cache sees of a replica whose run
is deferred, exactly as stepping would show it.

least_kv reads every replica's KV usage and prefix_aware every replica's prefix cache (both the
load too) at every decision. A deferred run (fastpath/deferred.py) is planned, not applied, so the
scheduler's own state is the run's start; these reads answer from the plan instead, and only the
replica the request goes to applies its run (Engine.submit). Everything below is about one
pending run, planned at a loop top at now_s with one step in flight, read at a dispatch time t:
no update of a plan lands on a dispatch time, so j = bisect_left(upd_t, t) updates (0..j-1) and
j + 1 schedules (0..j; schedule 0 at now_s, schedule i at update i - 1's time) precede the read,
as in stepping, whatever the same-instant order of the dispatch and the loop top at now_s.

KV usage (BlockPool.get_usage) is 1 - free / (num_gpu_blocks - 1), and during a plain decode run
the free count moves only by the run's own operations (scheduler/bulk/kv.py, apply_decode_run):
schedule i gives request r its block b when step i first needs it (c0 + i + 1 > (b - 1) x
block_size: it holds cdiv(c0 + min(i + 1, n), block_size) blocks after schedule i, n the steps it
is scheduled), and a request finishing at update u (the async skip-ahead's at update 0, a run
through finishes' at update each[i]) drops one reference from each of its blocks; a block whose
count reaches 0 is free again (the run's new blocks are its alone; prompt blocks it shares with
another request are freed only by the last holder). So the free count after j updates and j + 1
schedules is free0 - allocations(0..j) + freed(updates < j): KVDecodeRuns.decode_run_fit
already proved no allocation of the run needs a block that was not free when it began. A request
joining at the run's first schedule with one token (scheduler/bulk/pd.py, "Joins") is one of them,
its context starting at its prompt's last token in the blocks it reserved (that schedule allocates
none); where a prompt joins (bulk/joins.py: its blocks, hit or new, taken at that schedule), the
replica applies its run up to the read first (DeferredRuns.apply_at, exact) and is read then.

Prefix cache: the router's lookup (scheduler/prefix_lookup.py, gpu_prefix_hit) finds the
longest run of leading prompt blocks whose hashes are in the map, stopping at the first miss m.
The run's steps before t change that answer only by
  - evicting a hit block: schedule i's allocations pop blocks from the front of the free queue
    (the first allocations(0..j) of today's queue: decode_run_fit), and a popped block leaves the
    map; a hit block that is free now and among them may shorten the hit;
  - caching block m of a request under the miss's hash: an update caches the blocks its tokens
    fill (AsyncScheduler), so block m of request r enters the map at update (m + 1) x block_size
    - c0 - 1 (KVDecodeRuns.steps_before_caching: step s = that update + 1, before the read iff
    s <= j); a hash not computed yet may match, one already computed is compared; the requests
    the in-flight step's update finishes (skip-ahead) cache their last block there too;
  - a request joining the run at its first schedule (bulk/joins.py: a new prompt admitted whole,
    a prefill's last chunk; P/D's one-token joins) caching its block m there or later: a prompt's
    full blocks are hashed on arrival, so its block m hash is compared, and a block m past them
    (filled by its outputs) may match. Its blocks, hits it takes and new ones, move the free
    queue in ways allocations(0..j) does not count: with a joiner, a free hit block may be evicted.
Frees keep a block's hash (it stays hit until evicted) and no decode touches a block. Where none
of these can happen before t, the lookup on the unapplied state is stepping's answer; otherwise
the replica applies its run up to t first (DeferredRuns.apply_at, as a routed arrival would:
exact) and is looked up then. A lookup may publish private blocks (KVCacheManager.note_lookup);
the run's blocks cached after it (a joiner's too, whose own lookup then follows the read) enter
the map directly or stay private: the read's answer is the same either way, since a private
key is no other root's (block_pool.py, "Private blocks").

Only the vLLM scheduler's bulk path (scheduler/bulk/vllm.py: one full-attention group) is read so;
the planner defers no run under a state-reading router otherwise (MacroPlanner.defer_runs).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from servesim.scheduler.bulk.interface import DecodeRuns
from servesim.scheduler.bulk.kv import KVDecodeRuns
from servesim.scheduler.bulk.vllm import VllmDecodeRuns
from servesim.scheduler.prefix_lookup import gpu_prefix_hit

if TYPE_CHECKING:
    from servesim.scheduler.hashing import TokenProvenance
    from servesim.scheduler.kv.block import KVCacheBlock
    from servesim.scheduler.request import Request
    from servesim.scheduler.scheduler import Scheduler
    from servesim.simulator.engine import Engine
    from servesim.simulator.fastpath.deferred import DeferredRun, DeferredRuns


def _first_at_or_after(times: list[float], t: float) -> int:
    """bisect_left(times, t) for ascending floats, on machine floats in the compiled build (a
    generic call to bisect costs several times more, and a prefix-aware router reads every
    replica at every decision)."""
    lo, hi = 0, len(times)
    while lo < hi:
        mid = (lo + hi) // 2
        if times[mid] < t:
            lo = mid + 1
        else:
            hi = mid
    return lo


class _RunBlocks:
    """One pending run's KV block arithmetic, derived when first read (nothing of the replica
    changes between the plan and its application but what a read publishes, which moves no
    block): the free count before it and the blocks each request holds (its num_computed_tokens
    is the plan's ctx0, the steps it is scheduled the plan's each, or every step); the updates
    that finish requests and the requests the in-flight step's update finishes (skip-ahead), and
    the blocks each finish frees, when a read first gets past it. Nothing per request is built
    but the held counts: behind least_kv a plan is read about twice (P/D hand-offs), so building
    and freeing a tuple per request cost more than the reads."""

    def __init__(self, plan: DeferredRun, sched: Scheduler, block_size: int) -> None:
        kvm = sched.kv_cache_manager
        mgr = kvm._single_full
        assert mgr is not None
        held_of = mgr.req_to_blocks
        self.plan, self.sched, self.block_size = plan, sched, block_size
        self.free0 = kvm.block_pool.free_block_queue.num_free_blocks
        self.held = [len(held_of.get(r.request_id, ())) for r in plan.reqs]
        self._skipped: list[Request] | None = None
        self._cached_floor: int | None = None
        self._freed_upto = 0  # the finishes at updates before it are counted ...
        self._freed = 0  # ... and free this many blocks
        self._refs: dict[int, int] = {}  # block id -> references the counted finishes left on it

    def skipped(self) -> list[Request]:
        """The requests the in-flight step's update finishes (skip-ahead: in no step of the run)."""
        if self._skipped is None:
            if self.plan.load_drop:
                in_run = {id(r) for r in self.plan.reqs}
                self._skipped = [r for r in self.sched.running if id(r) not in in_run]
            else:
                self._skipped = []
        return self._skipped

    def cached_floor(self) -> int:
        """The fewest blocks any request of the run (skip-ahead ones included) has cached: none
        of them caches a block below it again."""
        if self._cached_floor is None:
            mgr = self.sched.kv_cache_manager._single_full
            assert mgr is not None
            cached = mgr.num_cached_block
            self._cached_floor = min([cached.get(r.request_id, 0) for r in self.plan.reqs]
                                     + [cached.get(r.request_id, 0) for r in self.skipped()])
        return self._cached_floor

    def allocations(self, j: int) -> int:
        """Blocks schedules 0..j allocate."""
        bs, out, held, ctx0, each = self.block_size, 0, self.held, self.plan.ctx0, self.plan.each
        if each is None:  # every request scheduled in every step the run can reach (j < max_steps)
            for i, c0 in enumerate(ctx0):
                need = -(-(c0 + j + 1) // bs) - held[i]
                if need > 0:
                    out += need
            return out
        for i, c0 in enumerate(ctx0):
            need = -(-(c0 + min(j + 1, each[i])) // bs) - held[i]
            if need > 0:
                out += need
        return out

    def free_blocks(self, j: int) -> int:
        """Free blocks after schedules 0..j and updates 0..j-1."""
        if j < self._freed_upto:  # an earlier instant than the last read (reads come at growing
            self._freed, self._freed_upto, self._refs = 0, 0, {}  # times): count again from the start
        if j > self._freed_upto:
            self._count_finishes(self._freed_upto, j)
            self._freed_upto = j
        return self.free0 - self.allocations(j) + self._freed

    def _count_finishes(self, lo: int, hi: int) -> None:
        """Add the blocks the finishes at updates lo..hi-1 free: the skip-ahead requests' at update
        0, request i's at update each[i] in a run through finishes. Which blocks a set of finishes
        frees does not depend on the order they are counted in (a block is freed once its last
        holder among them has dropped it), so no finisher list is sorted: reads come at growing
        times, a run is usually applied before most of its finishes, and each read walks only the
        finishers it has just passed."""
        if lo == 0:
            for r in self.skipped():
                self._freed += self._frees(r, 0)
        each = self.plan.each
        if each is None:
            return
        plan, bs, held = self.plan, self.block_size, self.held
        for i, n in enumerate(each):
            if lo <= n < hi and n < plan.max_steps:  # finishes at update n, inside the run
                self._freed += self._frees(plan.reqs[i], max(0, -(-(plan.ctx0[i] + n) // bs) - held[i]))

    def _frees(self, r: Request, new: int) -> int:
        """The blocks finisher r frees: its `new` blocks (the run's, its alone) and each of its
        blocks it held the last reference to among the finishers counted so far."""
        mgr = self.sched.kv_cache_manager._single_full
        assert mgr is not None
        # References left on a shared block (ref_cnt > 1), where finishes dropped some. A block
        # with ref_cnt 1 is this finisher's alone (no other finisher holds it, none dropped a
        # reference to it before: ref_cnt is read, never written here), so it is freed outright
        # and needs no entry.
        refs = self._refs
        freed = new
        for b in mgr.req_to_blocks.get(r.request_id, ()):
            if b.is_null:
                continue
            held = b.ref_cnt
            if held == 1:
                freed += 1
                continue
            left = refs.get(b.block_id, held) - 1
            refs[b.block_id] = left
            freed += left == 0
        return freed


class PlannedReads:
    """A state-reading router's reads of one engine, answered from its pending deferred run."""

    def __init__(self, engine: Engine, deferred: DeferredRuns, kv: KVDecodeRuns, sched: Scheduler) -> None:
        self.engine = engine
        self.sched = sched  # the engine's (vLLM) scheduler
        self.deferred = deferred
        self.kv = kv
        self._blocks: _RunBlocks | None = None  # of the last plan read
        self.num_reads_applied = 0  # prefix reads that applied the pending run first

    @staticmethod
    def for_runs(engine: Engine, runs: DecodeRuns, deferred: DeferredRuns) -> PlannedReads | None:
        """The planned reads of an engine whose runs are deferred behind a state-reading router;
        None where they are not answered (a bulk path other than vLLM's: its runs then step past
        no arrival). Turns off the deferred runs' commuting arrivals (DeferredRuns.apply_at): an
        update applied before its time caches blocks a later prefix read would see early."""
        if not isinstance(runs, VllmDecodeRuns):
            return None
        deferred.commuting_arrivals = False
        return PlannedReads(engine, deferred, runs.kv, runs.scheduler)

    def _run_blocks(self, plan: DeferredRun) -> _RunBlocks:
        blocks = self._blocks
        if blocks is None or blocks.plan is not plan:
            blocks = self._blocks = _RunBlocks(plan, self.sched, self.kv.kvm.block_size)
        return blocks

    def _updates_before_now(self, plan: DeferredRun) -> int:
        if self.deferred.paced:  # the updates the clock has reached (fastpath/deferred.py)
            assert plan.woken < len(plan.upd_t), "a paced run read past its end"
            return plan.woken
        now = self.engine.env.now
        j = _first_at_or_after(plan.upd_t, now)
        assert j < len(plan.upd_t) and plan.upd_t[j] > now, "a deferred run read past its end or at an update"
        return j

    def kv_usage(self) -> float:
        """The KV usage stepping shows now (the module docstring)."""
        plan = self.deferred.pending
        assert plan is not None
        if plan.first is not None:  # a prompt joins at its first schedule: applied first (exact)
            self.num_reads_applied += 1
            self.deferred.apply_at(self.engine.env.now, self.engine.in_flight, routed=False)
            return self.sched.kv_cache_manager.usage
        j = self._updates_before_now(plan)
        return self.kv.usage_at(self._run_blocks(plan).free_blocks(j))

    def cached_prefix_tokens(self, token_ids: Sequence[int], lora_id: int | None,
                             provenance: TokenProvenance | None) -> int:
        """The scheduler's cached_prefix_tokens as stepping shows it now: looked up on the
        unapplied state where the run's steps before now cannot change it, after applying them
        otherwise (the module docstring)."""
        engine, sched = self.engine, self.sched
        plan = self.deferred.pending
        assert plan is not None
        blocks, hit, probe = gpu_prefix_hit(sched, token_ids, lora_id, provenance)
        if probe is None or self._unchanged(plan, self._updates_before_now(plan), blocks[0], hit, probe,
                                            len(token_ids)):
            return hit
        self.num_reads_applied += 1
        self.deferred.apply_at(engine.env.now, engine.in_flight, routed=False)
        return sched.cached_prefix_tokens(token_ids, lora_id, provenance)

    def _unchanged(self, plan: DeferredRun, j: int, hit_blocks: Sequence[KVCacheBlock], hit: int, probe: Request,
                   num_prompt_tokens: int) -> bool:
        """Whether the run's schedules 0..j and updates 0..j-1 leave this lookup's answer alone."""
        kv = self.kv
        bs = kv.kvm.block_size
        run = self._run_blocks(plan)
        joining = plan.num_joining
        free_hits: set[int] | None = None  # (built only when a hit block is free: most reads hit none)
        for b in hit_blocks:
            if not b.ref_cnt:
                if free_hits is None:
                    free_hits = set()
                free_hits.add(b.block_id)
        if free_hits is not None:
            if joining:
                return False  # a joiner's blocks (hits it touches, new ones) move the free queue: not counted
            popped = run.allocations(j)
            if popped and kv.kvm.block_pool.free_block_queue.index_of_first(free_hits, popped) < popped:
                return False  # an allocation evicts a hit block
        m = hit // bs  # the first block missed
        if m >= min(num_prompt_tokens - 1, probe.num_tokens) // bs:
            return True  # the lookup never looks at block m (the last prompt token is recomputed)
        if m < run.cached_floor():
            return True  # every request of the run has cached its block m already
        miss = probe.block_hashes[m]
        decoding = plan.reqs
        if joining:
            decoding = decoding[:len(decoding) - joining]
            if self._joiners_may_cache(plan.reqs[len(decoding):], m, miss):
                return False
        if kv.steps_before_caching(decoding, j + 1, m, miss) <= j:
            return False
        if j == 0 or not plan.load_drop:
            return True
        return kv.steps_before_caching(run.skipped(), 2, m, miss) > 1

    def _joiners_may_cache(self, joiners: Sequence[Request], m: int, miss: bytes) -> bool:
        """Whether a request joining the run at its first schedule may cache its block m under the
        hash `miss` during the run: its prompt's block m hash is known (Request hashes every full
        prompt block on arrival) and compared; a block m past its prompt's full blocks is filled
        by its outputs, whose hashes are not known yet (it may)."""
        mgr = self.kv.kvm._single_full
        assert mgr is not None
        for r in joiners:
            if mgr.num_cached_block.get(r.request_id, 0) > m:
                continue  # its block m is cached already (and was missed)
            hashes = r.block_hashes
            if len(hashes) <= m or hashes[m] == miss:
                return True
        return False
