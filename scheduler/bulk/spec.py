"""The vLLM scheduler's bulk path for runs of speculative-decoding verify steps.

A verify step of a steady decode batch schedules, for every running request in `running` order,
1 + num_spec_tokens tokens (the next token and its drafts), admits, preempts and finishes nobody.
Its update claws back the rejected drafts (Scheduler._clawback_rejected), appends the 1 + accepted
tokens and, async, caches blocks up to the verified tokens. How many drafts each step accepts is a
pure function of the request and its output position (scheduler/worker.py: TokenSource), so the
fast path draws a whole run's acceptances in advance and hands them here as each update's gain
(tokens appended) and rollback (drafts rejected); this owner proves how many of the steps stay
plain (`plan`) and applies them (`apply`), leaving the state schedule() and update_from_output()
leave one by one.

Steady state, proven per request before a run (`steady_batch`): RUNNING, not a prefill chunk, no
stop ids, len(spec_token_ids) == num_spec_tokens and, with P output placeholders (async: 1 + the
in-flight step's drafts of it, none where that step ran its prefill's last chunk; sync: 0),
num_computed_tokens == num_tokens + P - 1. Then every schedule
gives it num_new = num_tokens_with_spec + P - num_computed_tokens = 1 + num_spec_tokens and the
invariant holds again after each update (the clawback lowers num_computed_tokens and P alike, the
appended tokens raise num_tokens and lower P alike).

Joins (async; bulk/spec_join.py). Where the next schedule surely completes a prompt behind the
batch's verifies (one new request waiting, admitted whole, or the last running request's last
chunk), a run starts there anyway: its schedule 0 applies the verifies in bulk and the
scheduler's own phases the prompt (schedule_behind); from schedule 1 on it is one more request
of the batch, one step behind (its first token at update 1).

A friend of Scheduler / AsyncScheduler and KVCacheManager (scheduler/bulk/__init__.py lists what
the vLLM owners may touch; this one touches the same members).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

from servesim.scheduler.bulk.kv import KVDecodeRuns
from servesim.scheduler.bulk.spec_join import (
    SpecJoin, admit_joiner, completing_joiner, hit_survives_verifies, spec_joiner,
)
from servesim.scheduler.bulk.spec_plan import NONE, SKIP, STOP, SpecRunPlan, first_event
from servesim.scheduler.lazy_ids import OutputIdSource
from servesim.scheduler.output import CachedRequestData, SchedulerOutput
from servesim.scheduler.request import RequestStatus, check_stop

if TYPE_CHECKING:
    from servesim.scheduler.async_scheduler import AsyncScheduler
    from servesim.scheduler.request import Request
    from servesim.scheduler.scheduler import Scheduler


def _add_allocs(cs: list[int], num_scheduled: int, start: int, held: int, slots: int, bs: int,
                allocs: list[int]) -> None:
    """Add to allocs[j] the blocks one request's schedule j allocates, for its schedules start ..
    num_scheduled - 1 (contexts cs, ascending; held blocks before them; slots a schedule needs
    past its context): block b is first needed at the first schedule whose context passes it."""
    if num_scheduled <= start:
        return
    need = -(-(cs[num_scheduled - 1] + slots) // bs)
    j = start
    for b in range(held + 1, need + 1):
        while cs[j] <= (b - 1) * bs - slots:
            j += 1
        allocs[j] = allocs[j] + 1


class VllmSpecRuns:
    """Bulk verify steps of one vLLM Scheduler or AsyncScheduler (fastpath/spec_runs.py drives it)."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.kv = KVDecodeRuns(scheduler.kv_cache_manager)  # (its admission check: spec_joiner)

    def spec_run_blocker(self) -> str | None:
        """Why no spec run can ever apply as configured; None: each run is proven by plan()."""
        sched = self.scheduler
        kvm = sched.kv_cache_manager
        if kvm._single_full is None or kvm.block_pool.enable_kv_cache_events:
            return ("speculative decoding with a KV layout other than one full-attention group, or KV cache "
                    "events on: verify steps are replayed in bulk only for that layout")
        threshold = sched.scheduler_config.long_prefill_token_threshold
        if 0 < threshold < 1 + sched.num_spec_tokens:
            return "speculative decoding with long_prefill_token_threshold below a verify step's tokens"
        return None

    def steady_batch(self, in_flight: SchedulerOutput | None) -> list[Request] | None:
        """The batch of the next verify steps (all of `running`, in order) when every request is in
        the steady state (module docstring) and nothing else can enter a schedule: nothing waits
        and no prompt is chunked (async: but for one prompt the run's first schedule completes,
        `joiner`: the last running request's chunk is left out of the batch), no connector, no
        tracer, no timed policy. `in_flight`: the step in flight (async), which
        must schedule every running request: with its drafts (a verify) or none (its prefill's
        last chunk: 1 placeholder, as a verify of no drafts). None when not proven."""
        sched = self.scheduler
        if (sched.connector is not None or sched.tracer is not None or sched.policy.next_event_s() is not None
                or (sched.waiting and in_flight is None) or sched.skipped_waiting or not sched.running or not sched.policy.fast_forward_safe
                or sched._ignored):  # an ignored request's output goes out with the next update
            return None
        ns = sched.num_spec_tokens
        batch = sched.running
        if in_flight is not None and batch[-1].is_prefill_chunk:
            batch = batch[:-1]  # a prompt's chunk: it joins (the run's schedule 0 completes it), or no run
        if len(batch) * (1 + ns) > sched.max_num_scheduled_tokens:
            return None
        for r in batch:
            if in_flight is None:
                placeholders = 0
            elif r.request_id in in_flight.num_scheduled_tokens:
                placeholders = 1 + len(in_flight.scheduled_spec_decode_tokens.get(r.request_id, ()))
            else:
                return None
            sp = r.sampling_params
            if (r.status != RequestStatus.RUNNING or r.is_prefill_chunk or len(r.spec_token_ids) != ns
                    or r.num_output_placeholders != placeholders or r.discard_latest_async_tokens
                    or r.num_computed_tokens != r.num_tokens + placeholders - 1 or r.mm_features
                    or r.structured_output_request is not None or r.resumable
                    or sp.stop_token_ids or (sp.eos_token_id is not None and not sp.ignore_eos)
                    or sp.min_tokens > r.max_tokens):  # max_tokens would not stop it (check_stop)
                return None
        return list(batch)

    def anyone_joins(self) -> bool:
        """Whether the next schedule takes a prompt besides the batch (async, as steady_batch lets
        it: a waiting request, or the last running one's next chunk): a run starts only with it joining."""
        sched = self.scheduler
        return bool(sched.waiting) or sched.running[-1].is_prefill_chunk

    def joiner(self, num_batch: int) -> SpecJoin | None:
        """The prompt a run's schedule 0 completes behind num_batch verifies (module docstring,
        "Joins"; bulk/spec_join.py): the waiting one admitted whole, or the last running one's
        last chunk; None where not proven."""
        sched = self.scheduler
        if sched.running[-1].is_prefill_chunk:  # (none where a request waits too)
            return completing_joiner(sched, num_batch)
        return spec_joiner(sched, self.kv, num_batch)

    def plan(self, batch: list[Request], num_steps: int, gains: list[list[int]], bumps: list[int],
             num_in_flight: int, through_finishes: bool = True, join: SpecJoin | None = None) -> SpecRunPlan:
        """The longest prefix of num_steps steps that stays plain: no schedule is cut by
        max_model_len, no update stops a request by max_model_len, every schedule's blocks fit in
        the blocks free now (so no preemption, and no allocation reaches a block a finish frees:
        frees go to the free queue's tail) and every step schedules someone. Update j's gains are
        gains[i][j] (bumps: SpecRunPlan's); a request's list may end early only past the update that stops it (its
        max_tokens: the fast path draws no further), else the run ends where it does.

        max_tokens: sync, or async without `through_finishes` (a cluster replica, whose router
        reads its load), the run ends before an update that would stop a request. Async
        otherwise (nothing waits: steady_batch), the run goes through: a request whose in-flight steps reach
        max_tokens is passed over by the schedule (vLLM's skip-ahead) and the update stops it
        (its tokens cut at max_tokens), or an update stops it with its next step already
        scheduled (that step's tokens are then dropped); either way its seat and blocks admit
        nobody. `SpecRunPlan.finish_at` says at which update, `steps_each` how many schedules
        took it.

        `join` (async): batch's last request is that prompt, completed by schedule 0 (its gains:
        0 at update 0, its prefill's one token at update 1, bumps: num_spec_tokens, at update 1);
        its blocks there count as taken whole, and a new one's hit must survive the verifies
        before it (hit_survives_verifies), else no step is proven."""
        sched = self.scheduler
        kvm = sched.kv_cache_manager
        ns, la = sched.num_spec_tokens, sched.num_lookahead_tokens
        max_len, bs = sched.max_model_len, kvm.block_size
        mgr = kvm._single_full
        assert mgr is not None
        through = num_in_flight == 1 and through_finishes
        k = num_steps
        lim = min(max_len - 1, max_len - la) - 1 - ns  # a schedule's context at most this (no cut)
        ctx: list[list[int]] = []
        finish_at: list[int | None] = []
        allocs = [0] * k  # blocks the schedules of step j allocate (over the batch)
        num_running = len(batch) - (join is not None)
        for i, r in enumerate(batch):
            c0, t0, o0, max_tokens = r.num_computed_tokens, r.num_tokens, r.num_output_tokens, r.max_tokens
            # The first step where something happens (first_event) and each schedule's context before it
            drawn = len(gains[i])
            if i < num_running:
                first, kind, cs = first_event(c0, gains[i], bumps[i], k if k <= drawn else drawn, lim,
                                               max_tokens - o0, max_len - t0, num_in_flight > 0)
                held = len(mgr.req_to_blocks[r.request_id])
            else:  # the joiner: its prefill at schedule 0, then as from a loop top with it in flight
                assert join is not None
                if not hit_survives_verifies(sched, [b for b, cs in zip(batch, ctx) if cs], [cs[0] for cs in ctx if cs],
                                             join, allocs[0] if k else 0):
                    return SpecRunPlan(batch, 0, gains, bumps, [[] for _ in batch], [0] * len(batch),
                                       [None] * len(batch))
                first, kind, cs = first_event(t0, gains[i][1:], bumps[i], (k if k <= drawn else drawn) - 1, lim,
                                              max_tokens, max_len - t0, True)
                first += 1
                cs.insert(0, join.num_hit_tokens)
                held = join.num_blocks
                allocs[0] = allocs[0] + join.num_blocks_taken  # (at most: a hit on blocks others hold takes none)
            fin: int | None = None
            num_scheduled = len(cs)
            if kind == NONE:
                k = first  # its updates drawn end here (k unless it stops past them)
            elif kind == SKIP and through and t0 + max_tokens - o0 < max_len:
                fin = first  # its update stops it, its tokens cut at max_tokens
            elif kind == STOP and through and t0 + max_tokens - o0 < max_len:
                fin = first
            else:
                k = first
            # (the joiner's schedule 0 is its admission)
            _add_allocs(cs, num_scheduled, 1 if i >= num_running else 0, held, 1 + ns + la, bs, allocs)
            ctx.append(cs)
            finish_at.append(fin)
        room = kvm.block_pool.free_block_queue.num_free_blocks
        for j in range(k):
            room -= allocs[j]
            if room < 0:
                k = j
                break
        k = min(k, max([min(len(cs), k) for cs in ctx]))  # the last step schedules someone
        return SpecRunPlan(batch, k, gains, bumps, [cs if len(cs) <= k else cs[:k] for cs in ctx],
                           [min(len(cs), k) for cs in ctx],
                           [None if f is None or f >= k else f for f in finish_at], join)

    def apply(self, plan: SpecRunPlan, source: OutputIdSource, num_in_flight: int, upd_t: Sequence[float],
              final_drafts: list[list[int]], tail: Sequence[int] = (), now_s: float = 0.0) -> list[int]:
        """Apply the plan's schedules and updates (plan.num_steps of each, update j at upd_t[j]); the
        async run's last step stays scheduled, its update to come. `source`: the output id stream
        the updates append from (each request's next outputs, in order); final_drafts[i]:
        batch[i]'s spec_token_ids after the run's last update (unfinished requests). `tail`
        (async): the loop's next schedule, at the last update's time, is applied too (the batch
        indices it schedules: plan.batch_at(num_steps) of the plan before its cut), its update
        left to the loop with the last step's. `now_s`: schedule 0's time, where a prompt joins
        (plan.join: admitted by that schedule's waiting phase, after the verifies' blocks).
        Returns the free-block count after each schedule (the step rows' kv usage)."""
        sched = self.scheduler
        pool = sched.kv_cache_manager.block_pool
        k = plan.num_steps
        # Tokens first (their block hashes: caching only reads blocks already full), then the KV
        # events in stepping's order: by phase (schedule j is phase 2j: allocation, then caching;
        # update j phase 2j + 1: async caching, then a finish), then request, then kind. Each
        # phase's list is filled request by request, each request's events in kind order: sorted.
        events: list[list[tuple[int, int, int]]] = [[] for _ in range(2 * k + 2)]
        allocs = [0] * (k + 1 if tail else k)
        in_tail = set(tail)
        n = len(plan.batch) - (plan.join is not None)
        for i in range(n):
            self._request_events(plan, i, source, num_in_flight, final_drafts[i], i in in_tail, events, allocs)
        if plan.join is not None:  # schedule 0: the verifies' blocks, then its waiting phase admits the joiner
            self._apply_events(plan.batch, events[:1], k, upd_t)
            events[0] = []
            allocs[0] = allocs[0] + admit_joiner(self.scheduler, plan.join, plan.steps_each[:n], now_s)
            self._request_events(plan, n, source, num_in_flight, final_drafts[n], n in in_tail, events, allocs, 1)
        freed = self._apply_events(plan.batch, events, k, upd_t) + [0]
        free = pool.free_block_queue.num_free_blocks + sum(allocs) - sum(freed)
        free_after: list[int] = []
        for n, f in zip(allocs, freed):
            free -= n
            free_after.append(free)
            free += f  # schedule j + 1 follows update j
        self._after(plan, [plan.batch[i] for i in tail] if tail else None)
        sched.now_s = upd_t[k - 1]
        return free_after

    def _request_events(self, plan: SpecRunPlan, i: int, source: OutputIdSource, num_in_flight: int,
                        final_drafts: list[int], in_tail: bool, events: list[list[tuple[int, int, int]]],
                        allocs: list[int], start: int = 0) -> None:
        """batch[i]'s part of apply(): its tokens appended, its KV events (and blocks per schedule
        into allocs), its counters after the run (a finished request's are left as its stop leaves
        them: nothing reads them). `start`: its first schedule in the run (1: the joiner, whose
        schedule 0 admitted it; its bump is then update 1's)."""
        sched = self.scheduler
        kvm = sched.kv_cache_manager
        mgr = kvm._single_full
        assert mgr is not None
        ns, la, bs = sched.num_spec_tokens, sched.num_lookahead_tokens, kvm.block_size
        caching = kvm.enable_caching
        k, r = plan.num_steps, plan.batch[i]
        g, cs = plan.gains[i], plan.ctx[i]
        m, fin = plan.steps_each[i], plan.finish_at[i]
        num_updates = k if fin is None else fin + 1
        o = r.num_output_tokens
        gained = g[:num_updates]
        total = 0  # the tokens its updates bring (a local sum: the builtin is a generic call)
        for x in range(num_updates - 1 if fin is not None else num_updates):
            total += gained[x]
        if fin is not None:
            gained[fin] = r.max_tokens - o - total  # cut at max_tokens
            total = r.max_tokens - o
        r.append_output_tokens_from(source, o, total)
        t = r.num_tokens - total
        rid = r.request_id
        held = len(mgr.req_to_blocks[rid])
        cached = mgr.num_cached_block.get(rid, 0)
        # No division a step: schedule j allocates when its context passes alloc_above (its
        # slots c + 1 + ns + la need more than held blocks), a caching happens when the tokens
        # it caches reach cache_at (a block past the cached ones is full)
        alloc_above = held * bs - 1 - ns - la
        cache_at = (cached + 1) * bs
        update_caching = caching and num_in_flight > 0
        for j in range(num_updates + in_tail):
            if start <= j and (j < m or j == k):  # schedule j takes it (j == k: the tail)
                c = cs[j]
                if c > alloc_above:
                    need = -(-(c + 1 + ns + la) // bs)
                    events[2 * j].append((i, 0, need - held))
                    allocs[j] = allocs[j] + need - held
                    held = need
                    alloc_above = held * bs - 1 - ns - la
                if caching:
                    upto = c + 1 + ns if c + 1 + ns < t else t
                    if upto >= cache_at:
                        events[2 * j].append((i, 1, upto))
                        cached = upto // bs
                        cache_at = (cached + 1) * bs
            if j == k:
                break
            t += gained[j]
            if update_caching and t - 1 >= cache_at:
                events[2 * j + 1].append((i, 1, t - 1))
                cached = (t - 1) // bs
                cache_at = (cached + 1) * bs
        if fin is not None:
            events[2 * fin + 1].append((i, 2, 0))
        elif in_tail:  # after the tail's schedule: two steps in flight
            r.num_computed_tokens = cs[k] + 1 + ns
            r.num_output_placeholders = 2 * (1 + ns)
            r.spec_token_ids = cast("AsyncScheduler", sched)._spec_placeholders  # the tail: async only
        else:
            # after schedule k - 1 and update k - 1 (sync: step k - 1's clawback; async: step k - 2's)
            r.num_computed_tokens = cs[k - 1] + g[k - 1] + (plan.bumps[i] if k - 1 == start else 0)
            if num_in_flight:
                r.num_output_placeholders = 1 + ns  # step k - 1's, in flight
            r.spec_token_ids = final_drafts

    def _apply_events(self, batch: list[Request], events: list[list[tuple[int, int, int]]], k: int,
                      upd_t: Sequence[float]) -> list[int]:
        """Allocations, cachings and finishes in stepping's order; returns the blocks each update frees."""
        sched = self.scheduler
        kvm = sched.kv_cache_manager
        mgr = kvm._single_full
        assert mgr is not None
        pool = kvm.block_pool
        queue = pool.free_block_queue
        freed = [0] * k
        reqs_to_blocks = mgr.req_to_blocks
        for phase, bucket in enumerate(events):
            for i, kind, arg in bucket:
                r = batch[i]
                if kind == 0:
                    reqs_to_blocks[r.request_id].extend(pool.get_new_blocks(arg))
                elif kind == 1:
                    mgr.cache_blocks(r, arg)
                else:  # update_from_output's stop: the stop rule sets the status, then _free_request
                    sched.now_s = upd_t[phase // 2]
                    if not check_stop(r, sched.max_model_len):
                        raise AssertionError(f"{r.request_id}: a spec run's update did not finish it")
                    before = queue.num_free_blocks
                    sched._free_request(r)
                    freed[phase // 2] += queue.num_free_blocks - before
        return freed

    def _after(self, plan: SpecRunPlan, tail: list[Request] | None) -> None:
        """The scheduler's queues and sets after the run: finished requests out of `running`, the
        ids finished by the last update still to hand over (the tail's schedule hands them over),
        the last schedule's batch."""
        sched = self.scheduler
        k = plan.num_steps
        done = {r for r, f in zip(plan.batch, plan.finish_at) if f is not None}
        if done:
            sched.running = [r for r in sched.running if r not in done]
        if tail is not None:
            sched.finished_req_ids = set()
            sched.prev_step_scheduled_req_ids = {r.request_id for r in tail}
            return
        sched.finished_req_ids = {r.request_id for r, f in zip(plan.batch, plan.finish_at) if f == k - 1}
        sched.prev_step_scheduled_req_ids = {r.request_id for r, m in zip(plan.batch, plan.steps_each) if m == k}

    def finished_req_ids(self) -> set[str]:
        """The requests finished since the previous schedule(): the run's first schedule hands them
        to the worker (the scheduler's own set, replaced by apply())."""
        return self.scheduler.finished_req_ids

    def verify_step_output(self, req_ids: list[str], drafts: list[list[int]]) -> SchedulerOutput:
        """The SchedulerOutput of a run's last verify step (async: left in flight), as
        update_from_output reads it: 1 + num_spec_tokens tokens per request, drafts[i] verified
        for req_ids[i]. Block ids are not repeated: no executor reads an output after its step ran."""
        sched = self.scheduler
        n = 1 + sched.num_spec_tokens
        return SchedulerOutput([], CachedRequestData(req_ids=list(req_ids)), {rid: n for rid in req_ids},
                               n * len(req_ids), dict(zip(req_ids, drafts)),
                               [0] * sched.kv_cache_manager.num_kv_cache_groups, set(), set())

    def prefix_stats_taken(self) -> tuple[int, int]:
        """(hits, queries) the run's first update takes (make_stats: what was pending); the later
        ones take none (no lookup inside a run: nothing waits)."""
        stats = self.scheduler.kv_cache_manager.make_prefix_cache_stats()
        return stats.hits, stats.queries

    def usages_at(self, num_free_blocks: Sequence[int]) -> list[float]:
        """BlockPool.get_usage's float at each free-block count."""
        total = self.scheduler.kv_cache_manager.block_pool.num_gpu_blocks - 1
        return [1.0 - n / total if total else 0.0 for n in num_free_blocks]
