"""The vLLM scheduler's bulk decode path: runs of plain decode steps proven and applied at once.

A plain decode step schedules exactly one token for every running request, in `running` order,
admits nobody, preempts nobody and finishes nobody. When the scheduler's state proves the next k
steps are all plain, their effect is fixed: each request's num_computed_tokens grows by k, the KV
manager allocates and caches blocks at the block boundaries (scheduler/bulk/kv.py, in vLLM's
order), and each update appends the sampled token. A waiting request may be there: each schedule
then looks it up in the prefix cache and stops at it, which a run repeats as long as its
admission provably fails alike (bulk/heads.py).

Joins (DecodeRuns.decode_run_joining; who joins: bulk/joins.py). A request whose prompt the next
schedule completes (a new one admitted whole, or the last running one's prefill chunk) joins an
async run there: the batch's decodes in bulk, the rest by the scheduler's own phases
(Scheduler.schedule_behind); it samples at that step and decodes from the next on.

`VllmDecodeRuns` is the owner of these operations for one Scheduler or AsyncScheduler (a friend
of theirs: scheduler/bulk/__init__.py); it owns the KV manager's bulk path (`KVDecodeRuns`) and
holds no state of its own besides the two references.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from servesim.scheduler.bulk.heads import refused_head_hit
from servesim.scheduler.bulk.interface import DecodeRunEffects, Joins, SampledStepUpdate
from servesim.scheduler.bulk.joins import completing_chunk, join_plan, joining_bound, joining_prompt, num_running
from servesim.scheduler.bulk.kv import KVDecodeRuns
from servesim.scheduler.bulk.sampled_update import update_sampled_step
from servesim.scheduler.lazy_ids import RunTokens
from servesim.scheduler.output import CachedRequestData, ModelRunnerOutput, SchedulerOutput
from servesim.scheduler.request import RequestStatus, check_stop

if TYPE_CHECKING:
    from servesim.scheduler.kv.manager import KVCacheBlocks
    from servesim.scheduler.request import Request
    from servesim.scheduler.scheduler import Scheduler


# No joins (DecodeRuns.decode_run_joining), shared: read at every planning attempt, never written.
_NOBODY: list[Request] = []
_NO_JOINS = Joins(_NOBODY, [], [])


class VllmDecodeRuns:
    """Implements scheduler.bulk.interface.DecodeRuns for the vLLM schedulers."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.kv = KVDecodeRuns(scheduler.kv_cache_manager)

    def decode_run_blocker(self) -> str | None:
        """Why no run can ever apply to this scheduler as configured; None: runs may apply."""
        sched = self.scheduler
        if not sched.policy.fast_forward_safe:
            return f"policy {sched.scheduler_config.policy!r} changes state every step (e.g. continuum's pins)"
        if sched.tracer is not None:
            return "the scheduler tracer records every step"
        if not self.kv.supports_decode_runs():
            return ("KV layout other than one full-attention group (sliding-window, chunked-local, sink or Mamba "
                    "groups: their block tables are not replayed in bulk), or KV cache events on")
        return None

    def decode_run_extra_steps(self) -> int:
        """Steps a request is still scheduled after the step of its last token: none (skip-ahead)."""
        return 0

    def arrivals_commute_with_decode_updates(self) -> bool:
        """True: add_request queues the request (its key root may publish private blocks, which
        an update only adds to) and calls the policy's on_arrival; an update that finishes nobody
        appends tokens and caches blocks, calling no policy hook and reading no waiting request.
        Neither reads what the other writes (the now_s each sets is overwritten by the next
        schedule, which follows both)."""
        return True

    def finished_req_ids(self) -> set[str]:
        return self.scheduler.finished_req_ids

    def anyone_admissible_waits(self) -> bool:
        """Whether a waiting request could take a seat or blocks a finish frees: any waiting one
        here (P/D's decode side passes over those parked for a transfer: bulk/pd.py)."""
        sched = self.scheduler
        return bool(sched.waiting or sched.skipped_waiting)

    def usage_at(self, num_free_blocks: int) -> float:
        return self.kv.usage_at(num_free_blocks)

    def usages_at(self, num_free_blocks: list[int]) -> list[float]:
        return self.kv.usages_at(num_free_blocks)

    def decode_run_horizon(self, max_steps: int, num_in_flight: int, through_finishes: bool = False) -> int:
        """How many of the next schedule() calls (at most max_steps) are provably plain decode steps
        of one fixed batch (decode_run_requests()), none of whose updates finishes a request of
        that batch; 0 if not even one.

        `through_finishes` (async, one in flight, nothing waiting): the batch may shrink instead;
        a request stops being scheduled after its last step (decode_run_steps) and that step's
        update, inside the run, finishes it (schedule_decode_steps' steps_each). Nothing waits,
        so the freed seat and blocks admit nobody, and later schedules are plain decodes of the
        rest, in `running` order.

        `num_in_flight` is the number of steps scheduled but not yet updated (0: sync loop; 1: the
        async loop between steps, when every running request holds one output placeholder). With
        one in flight, a request whose in-flight step brings it to max_tokens is skipped by the
        next schedule (vLLM's async skip-ahead) and finished by that step's update: it leaves the
        batch, the rest stays fixed (not while a request waits: the freed seat and blocks may
        admit it). A waiting request schedule() reaches must stay refused through the run
        (bulk/heads.py). Conservative: any state not recognised answers 0."""
        sched = self.scheduler
        joining = self._joining()  # (joins: the async loop's first schedule only; no waiting head then)
        if (joining is None or (joining and num_in_flight != 1) or sched.num_spec_tokens
                or sched.num_lookahead_tokens or sched.tracer is not None or sched.policy.next_event_s() is not None):
            return 0
        running = sched.running
        if joining and joining[0].status == RequestStatus.RUNNING:
            running = running[:-1]  # the prefill chunk that joins (_joining)
        n = len(running)
        threshold = sched.scheduler_config.long_prefill_token_threshold
        if n == 0 or 0 < threshold < 1:
            return 0
        # First (cheap, and most often the answer when a request waits): does the head get in?
        # With a request waiting the batch must be all of `running` (checked below).
        head = None if joining else self._waiting_head(n)
        head_hit = None if head is None else refused_head_hit(sched, self.kv, head, n)
        if head is not None and head_hit is None:
            return 0
        k = max_steps
        max_len = sched.max_model_len
        ph = num_in_flight
        num_batch = 0
        anyone_waits = not joining and self.anyone_admissible_waits()
        through = through_finishes and ph == 1 and not anyone_waits
        caps: list[int] = []  # through: each request's steps before its last (decode_run_steps)
        for r in running:
            ntok = r.num_tokens
            if (r.status != RequestStatus.RUNNING or r.is_prefill_chunk or r.spec_token_ids
                    or r.num_output_placeholders != ph or r.num_computed_tokens != ntok + ph - 1
                    or r.discard_latest_async_tokens):
                return 0
            sp = r.sampling_params
            if sp.stop_token_ids or (sp.eos_token_id is not None and not sp.ignore_eos):
                return 0
            if ph and r.num_output_tokens + 1 >= r.max_tokens:
                continue  # skipped, then finished by the in-flight step's update
            num_batch += 1
            # Update i (0-based) of the run brings the request to o + i + 1 outputs, which must
            # stay below max_tokens (also the async skip-ahead rule) and below max_model_len.
            # Through finishes only max_model_len bounds the run (conservatively, for everyone).
            if through:
                if sp.min_tokens > r.max_tokens:
                    return 0  # its last step would not stop it (check_stop: min_tokens first)
                caps.append(r.max_tokens - r.num_output_tokens - 1)
                k = min(k, max_len - ntok - 2)
            else:
                # (two-argument mins: mypyc compiles those inline, a three-argument one is a call)
                k = min(min(k, r.max_tokens - r.num_output_tokens - 1), max_len - ntok - 2)
            if k < 1:
                return 0
        if num_batch < n and anyone_waits:
            return 0  # the finish frees a seat (and blocks): the next schedule may admit a waiting request
        if joining:
            k = joining_bound(sched, joining, k, through, caps)
            num_batch += len(joining)
        if k < 1 or num_batch == 0 or num_batch > sched.max_num_scheduled_tokens:
            return 0
        return self._fit(k, head, head_hit, caps if through else None, joining)

    def _fit(self, k: int, head: Request | None, head_hit: KVCacheBlocks | None, caps: list[int] | None,
             joining: list[Request]) -> int:
        """decode_run_horizon's last bounds, k at most: through finishes (`caps`), the run's last
        step keeps a batch (someone's last step, at least); the run's blocks
        (KVDecodeRuns.decode_run_fit); and what the joining requests compute at its first
        schedule proven (_join_plan)."""
        if caps is not None:
            longest = 0  # max(caps), as a compiled loop (max of a list is a call to the builtin)
            for cap in caps:
                longest = max(longest, cap)
            k = min(k, longest)
        batch = self.decode_run_requests()
        k = self.kv.decode_run_fit(batch, k, head, head_hit, caps, joining)
        if k and joining and self._join_plan(batch, joining) is None:
            return 0
        return k

    def _joining(self) -> list[Request] | None:
        """The requests the next schedule's waiting phase admits behind the plain decodes with
        their whole prompt (module docstring, "Joins"; DecodeRuns.decode_run_joining); [] for
        none (a waiting request is then a head the run must keep refused); None when that
        schedule does anything a run does not replay (here: a KV connector's, which loads and
        saves at steps; P/D's decode side answers otherwise: bulk/pd.py)."""
        sched = self.scheduler
        if sched.connector is not None:
            return None
        running = sched.running
        if running and running[-1].is_prefill_chunk:  # it joins, alone, or the run proof fails
            chunk = completing_chunk(sched)
            return [chunk] if chunk is not None and not (sched.waiting or sched.skipped_waiting) else _NOBODY
        if not sched.waiting:
            return _NOBODY
        head = joining_prompt(sched, self.kv)
        return _NOBODY if head is None else [head]

    def _join_plan(self, batch: list[Request], joining: list[Request]) -> Joins | None:
        """What the joining requests compute at the run's first schedule behind `batch`'s decodes
        (bulk/joins.py); None where not proven."""
        return join_plan(self.scheduler, self.kv, batch, joining)

    def decode_run_joining(self) -> Joins:
        """The request that joins the next schedule, if any (module docstring, "Joins")."""
        joining = self._joining()
        if not joining:
            return _NO_JOINS
        plan = self._join_plan(self.decode_run_requests(), joining)
        assert plan is not None, "decode_run_joining read where decode_run_horizon refused the joins"
        return plan

    def decode_run_steps(self, batch: Sequence[Request], num_steps: int) -> list[int]:
        """How many of a run's num_steps schedules (one step in flight when it starts) take each
        request of `batch`: all of them, or fewer when its last step (the one that reaches
        max_tokens) comes earlier; skip-ahead passes it over after that. A joining request (not
        yet running: a run's batch ends with them) has no step in flight: one schedule more than
        a running one with as many outputs."""
        each = [min(r.max_tokens - r.num_output_tokens - 1, num_steps) for r in batch]
        for i in range(num_running(batch), len(batch)):
            r = batch[i]
            each[i] = min(r.max_tokens - r.num_output_tokens, num_steps)
        return each

    def _waiting_head(self, num_batch: int) -> Request | None:
        """The waiting request each schedule() of a plain run of num_batch decodes looks at, or
        None when none does: nothing waits, the batch is at max_num_seqs, or the decodes spend
        the whole token budget (_schedule_waiting's loop conditions)."""
        sched = self.scheduler
        if (not (sched.waiting or sched.skipped_waiting) or len(sched.running) >= sched.max_num_running_reqs
                or sched.max_num_scheduled_tokens <= num_batch):
            return None
        return sched._select_waiting_queue(sched.waiting, sched.skipped_waiting).peek_request()

    def decode_run_requests(self) -> list[Request]:
        """The batch of the next plain decode step, in scheduling order: the running requests but
        those the async skip-ahead rule passes over (their in-flight step reaches max_tokens)."""
        return [r for r in self.scheduler.running if not r.is_prefill_chunk
                and not (r.num_output_placeholders > 0 and r.num_output_tokens + 1 >= r.max_tokens)]

    def schedule_decode_steps(self, batch: Sequence[Request], num_steps: int, tokens: RunTokens | None,
                              now_s: float, steps_each: list[int] | None = None,
                              update_times_s: Sequence[float] = ()) -> DecodeRunEffects:
        """Apply num_steps plain decode schedules of `batch` (decode_run_requests() when the run was
        planned) and, after each, the update of one step (its tokens: the first num_steps that
        `tokens` holds for batch[i], appended unbuilt: lazy_ids.py; None for no updates).

        Sync loop: step j's own update follows its schedule. Async loop: the update that follows
        schedule j is the previous step's (already in flight), so placeholders stay constant.
        Each schedule looks the waiting head up in the prefix cache when decode_run_horizon let
        the run pass it (the same hit every time). Returns DecodeRunEffects.
        `now_s` is the time of the last schedule or update applied.

        `steps_each` (async, with updates, through finishes: decode_run_horizon): batch[i] is
        scheduled steps_each[i] times; when that is fewer than num_steps, update steps_each[i]
        (at update_times_s[steps_each[i]]) applies its last token and finishes it, as
        update_from_output does (stop rule, _free_request, `running`); the schedule after it
        hands the id over (in the returned `finished`), or the next one after the run does.

        A batch that ends with requests not yet running (decode_run_joining's) is a run's first
        schedule, which admits them (module docstring, "Joins")."""
        m = num_running(batch)
        if m < len(batch):
            return self._schedule_joins(batch, m, num_steps, tokens, now_s)
        return self._decode_steps(batch, num_steps, tokens, now_s, steps_each, update_times_s,
                                  self._waiting_head(len(batch)))

    def _schedule_joins(self, batch: Sequence[Request], m: int, num_steps: int, tokens: RunTokens | None,
                        now_s: float) -> DecodeRunEffects:
        """A run's first schedule with joins: batch[:m]'s decodes in bulk (no lookup: the waiting
        phase looks the joining ones up itself), then the rest of the schedule behind them (a
        prefill chunk, last in `running`; the waiting phase), which must schedule exactly
        batch[m:], each completing its prompt."""
        if num_steps != 1 or tokens is not None:
            raise ValueError("requests join a run at its first schedule only (one step, no update)")
        joining = batch[m:]
        eff = self._decode_steps(batch[:m], 1, None, now_s, None, (), None)
        sched = self.scheduler
        start = len(sched.running)
        if joining[0].status == RequestStatus.RUNNING:
            start -= 1  # the prefill chunk joining (bulk/joins.py completing_chunk)
        joined, joined_tokens = sched.schedule_behind(m, start)
        if (len(joined) != len(joining) or any(a is not b for a, b in zip(joined, joining))
                or any(r.num_computed_tokens != r.num_tokens for r in joined)):
            raise AssertionError(f"a run's first schedule admitted {[r.request_id for r in joined]}, not the "
                                 f"joining {[r.request_id for r in joining]} with their whole prompts")
        eff.joined, eff.joined_tokens = joined, joined_tokens
        eff.free_after[0] = self.scheduler.kv_cache_manager.block_pool.free_block_queue.num_free_blocks  # theirs too
        return eff

    def _decode_steps(self, batch: Sequence[Request], num_steps: int, tokens: RunTokens | None, now_s: float,
                      steps_each: list[int] | None, update_times_s: Sequence[float],
                      head: Request | None) -> DecodeRunEffects:
        """schedule_decode_steps of a batch of running requests; `head`: the waiting request each
        schedule looks up (_waiting_head)."""
        sched = self.scheduler
        sched.now_s = now_s
        t0 = [r.num_tokens for r in batch]
        with_updates = tokens is not None
        if tokens is not None:
            source, first, counts = tokens.source, tokens.first, tokens.counts
            for i, r in enumerate(batch):  # hashes the blocks they complete
                m = num_steps if steps_each is None or steps_each[i] >= num_steps else steps_each[i] + 1
                if counts[i] < m:
                    raise ValueError(f"{r.request_id}: a run of {m} updates given {counts[i]} of its tokens")
                r.append_output_tokens_from(source, first[i], m)
        finished = sched.finished_req_ids  # handed over by the first schedule
        none_finished: set[str] = set()
        sched.finished_req_ids = none_finished
        stopped: list[Request] = []

        def finish(i: int) -> None:  # the update of batch[i]'s last step: after its cache_blocks
            r = batch[i]
            sched.now_s = update_times_s[steps_each[i]] if steps_each is not None else now_s
            if not check_stop(r, sched.max_model_len):  # sets the status: max_tokens reached
                raise AssertionError(f"{r.request_id}: a run's last step did not finish it")
            sched._free_request(r)
            stopped.append(r)

        free_after = self.kv.apply_decode_run(batch, num_steps, t0, steps_each,
                                              finish if steps_each is not None else None)
        sched.now_s = now_s
        hits, queries = self.kv.decode_run_lookups(head, num_steps, with_updates)
        if steps_each is None:
            for r in batch:  # spec_token_ids stay empty (no drafts: decode_run_horizon checked)
                r.num_computed_tokens += num_steps
                r.is_prefill_chunk = False
                if not with_updates:
                    r.num_output_placeholders += num_steps
            sched.prev_step_scheduled_req_ids = {r.request_id for r in batch}
            return DecodeRunEffects(free_after, finished, hits, queries)
        finished = self._advance_through(batch, num_steps, steps_each, stopped, finished)
        return DecodeRunEffects(free_after, finished, hits, queries)

    def _advance_through(self, batch: Sequence[Request], num_steps: int, steps_each: list[int],
                         stopped: list[Request], finished: set[str]) -> set[str]:
        """The counters and queues after a run through finishes (schedule_decode_steps'
        steps_each; `stopped`: the requests its updates finished). Returns the finished ids the
        run's first schedule hands over: `finished`, plus those finished before the run's last
        update (a later schedule of the run hands them over)."""
        sched = self.scheduler
        last: set[str] = set()  # the run's last schedule: those still scheduled at every step
        for r, m in zip(batch, steps_each):
            r.num_computed_tokens += m
            r.is_prefill_chunk = False
            if m < num_steps:
                r.num_output_placeholders -= 1  # m schedules, m + 1 updates
            else:
                last.add(r.request_id)
        sched.prev_step_scheduled_req_ids = last
        if stopped:
            gone = set(stopped)
            sched.running = [r for r in sched.running if r not in gone]
            handed = {r.request_id for r, m in zip(batch, steps_each) if m < num_steps - 1}
            if handed:
                finished = finished | handed
                sched.finished_req_ids = {rid for rid in sched.finished_req_ids if rid not in handed}
        return finished

    def decode_step_output(self, batch: Sequence[Request], joined_tokens: Sequence[int] = ()) -> SchedulerOutput:
        """The SchedulerOutput of the last plain decode step of `batch` scheduled by
        schedule_decode_steps, as update_from_output reads it (one token per request, in order; no
        drafts; `joined_tokens`: the last ones joined at it, computing these). Block ids are not
        repeated: no executor reads an output after its step ran."""
        m = len(batch) - len(joined_tokens)
        cached = CachedRequestData(req_ids=[r.request_id for r in batch[:m]])
        num = {r.request_id: 1 for r in batch}
        for r, n in zip(batch[m:], joined_tokens):
            num[r.request_id] = n
        return SchedulerOutput([], cached, num, sum(n for n in num.values()), {},
                               [0] * self.scheduler.kv_cache_manager.num_kv_cache_groups, set(), set())

    def update_sampled_step(self, so: SchedulerOutput, mro: ModelRunnerOutput,
                            now_s: float) -> SampledStepUpdate | None:
        """update_from_output of a step none of whose requests stops (DecodeRuns.update_sampled_step;
        bulk/sampled_update.py)."""
        return update_sampled_step(self.scheduler, so, mro, now_s)
