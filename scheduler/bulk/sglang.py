"""SGLang's bulk decode path: runs of plain SGLang decode steps proven and applied at once (the
vLLM scheduler's counterpart: scheduler/bulk/vllm.py).

A plain SGLang decode step is a schedule() that tries no prefill (nothing waits, or the batch is
full: `batch_is_full` with a request waiting), at most merges the last prefill batch's requests
into the running batch (the first step of a run may; no request is being chunked) and runs
update_running_batch: its decode memory check passes without retracting (where the pool is
short it evicts from the radix tree, replayed at that step), every running request grows by one
token (a page at each page boundary), new_token_ratio decays once.
Its update appends one sampled token per request and finishes nobody. When the state proves the
next k steps are all plain, their effect is fixed and applied at once: the pages in the order the
steps' grow() calls take them (SGLangMemoryRuns.apply_decode_run), the counters, the ratio
(decayed k times, float for float), the tokens.

Through finishes (the overlap loop, nothing waiting): the batch shrinks as requests finish. Unlike
vLLM's async scheduler, SGLang's overlap schedule has no skip-ahead: a request whose in-flight step
brings its last token is scheduled once more (the extra forward: decode_run_extra_steps() is 1)
and finished by the update that follows that schedule; the forward's token is dropped. Nothing
waits, so the freed seat and pages admit nobody, and each later schedule drops the finished
request from the batch (a ghost until then).

`SGLangDecodeRuns` is the owner of these operations for one SGLangScheduler (a friend of it:
scheduler/bulk/__init__.py); it owns its memory's bulk path (`SGLangMemoryRuns`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from servesim.scheduler.bulk.interface import DecodeRunEffects, Joins, SampledStepUpdate
from servesim.scheduler.bulk.sglang_memory import SGLangMemoryRuns
from servesim.scheduler.kv.manager import PrefixCacheStats
from servesim.scheduler.lazy_ids import RunTokens
from servesim.scheduler.output import CachedRequestData, ModelRunnerOutput, SchedulerOutput
from servesim.scheduler.request import RequestStatus, check_stop
from servesim.scheduler.sglang.batching import Batch
from servesim.scheduler.sglang.output import StepInfo

if TYPE_CHECKING:
    from servesim.scheduler.request import Request
    from servesim.scheduler.sglang.scheduler import SGLangScheduler


class SGLangDecodeRuns:
    """Implements scheduler.bulk.interface.DecodeRuns for SGLangScheduler."""

    def __init__(self, scheduler: SGLangScheduler) -> None:
        self.scheduler = scheduler
        self.memory = SGLangMemoryRuns(scheduler.kv_cache_manager)

    def decode_run_blocker(self) -> str | None:
        """Why no run of decode steps can ever apply to this scheduler (None: they may). HiCache:
        host copies end on their own clock (releasing locks and waiting requests between decode
        steps) and the tree evicts to host, which the bulk memory model does not follow."""
        sched = self.scheduler
        if sched.hicache is not None:
            return "SGLang HiCache: host<->device copies change the cache between decode steps"
        if sched.kv_cache_manager.mamba_pool is not None:
            # Not proven: a decode step's KV eviction also frees Mamba states and tombstones,
            # which the bulk memory model (sglang_memory.py) does not replay.
            return "SGLang hybrid (Mamba) cache: evictions free states and tombstones the bulk path does not follow"
        if sched.config.speculative_num_steps:
            return "SGLang speculative decoding: acceptance draws change each step's token counts"
        return None

    def arrivals_commute_with_decode_updates(self) -> bool:
        """False (not proven): an arrival can change what the overlap loop's update of a decode
        batch leaves behind (the batch_is_full flag, the merge of a waiting prefill)."""
        return False

    def decode_run_extra_steps(self) -> int:
        """Steps a request is still scheduled after the step of its last token (the extra forward)."""
        return 1

    def finished_req_ids(self) -> set[str]:
        return self.scheduler.finished_req_ids

    def usage_at(self, num_free_blocks: int) -> float:
        return self.memory.usage_at(num_free_blocks)

    def usages_at(self, num_free_blocks: list[int]) -> list[float]:
        return self.memory.usages_at(num_free_blocks)

    def decode_run_horizon(self, max_steps: int, num_in_flight: int, through_finishes: bool = False) -> int:
        """How many of the next schedule() calls (at most max_steps) are provably plain decode steps
        of decode_run_requests(), none of whose updates (the in-flight step's included) finishes
        a request; 0 if not even one. `num_in_flight`: steps scheduled but not yet updated (0:
        sync; 1: the overlap loop between steps). `through_finishes` (one in flight, nothing
        waiting): updates inside the run may finish requests instead (decode_run_steps says
        which); the in-flight step's update still may not. Conservative: any state not
        recognised answers 0."""
        sched = self.scheduler
        if num_in_flight > 1 or sched.chunked_req is not None or sched._pending:
            return 0  # (_pending: an abort the next update reports)
        merged, dropped = self._to_merge()
        if not (sched.running or merged):
            return 0
        if sched.waiting and (not sched.batch_is_full or sched.ghosts or dropped
                              or sched.config.enable_priority_scheduling):
            # A request waits: only a full batch refuses it alike at every step. A finished
            # request still in a batch (a ghost, or one the merge drops) clears the flag, and
            # priority scheduling clears it to try preemption.
            return 0
        through = through_finishes and num_in_flight == 1 and not sched.waiting
        batch = sched.running + merged
        k = max_steps
        # Output placeholders: one for each request in the step in flight. After a decode batch
        # that is all of `running`; after a prefill batch only the requests it merges (prefill
        # and decode are separate batches: the decoding ones hold none).
        extend = sched.last_batch is not None and sched.last_batch.is_extend
        num_running = len(sched.running)
        max_len = sched.max_model_len
        last = 0  # through: the latest last-token step (the run's last step keeps a live request)
        for i, r in enumerate(batch):
            ph = 0 if extend and i < num_running else num_in_flight
            ntok = r.num_tokens
            if (r.status != RequestStatus.RUNNING or r.is_prefill_chunk or r.spec_token_ids
                    or r.num_output_placeholders != ph or r.num_computed_tokens != ntok + ph - 1):
                return 0
            sp = r.sampling_params
            if sp.stop_token_ids or (sp.eos_token_id is not None and not sp.ignore_eos):
                return 0
            # Update i (0-based; with one in flight the first is that step's) brings the request to
            # at most o + i + 1 outputs, which must stay below max_tokens and max_model_len; through
            # finishes, only max_model_len bounds the run, and the in-flight update finishes nobody.
            room = r.max_tokens - r.num_output_tokens - 1
            if through:
                if sp.min_tokens > r.max_tokens or room < 1:
                    return 0  # (min_tokens: its last step would not stop it, check_stop)
                last = max(last, room + 1 - ph)
                k = min(k, max_len - ntok - 2)
            else:
                k = min(min(k, room), max_len - ntok - 2)  # (two-argument mins compile inline)
            if k < 1:
                return 0
        if through:
            k = min(k, last)
            caps = [min(m + 1, k) for m in self.decode_run_steps(batch, k)]
            return self.memory.decode_run_fit(batch, k, caps)
        return self.memory.decode_run_fit(batch, k)

    def _to_merge(self) -> tuple[list[Request], bool]:
        """(requests the next schedule merges into the running batch from the last prefill or mixed
        batch, whether the merge drops a finished one): _merge_last_batch's choice, read-only.
        The chunked request is never merged; runs require there is none (decode_run_horizon)."""
        sched = self.scheduler
        lb = sched.last_batch
        if lb is None or not lb.is_extend:
            return [], False
        reqs = lb.requests()
        keep = [r for r in reqs if r is not sched.chunked_req and r.status == RequestStatus.RUNNING]
        return keep, len(keep) < len(reqs)

    def decode_run_requests(self) -> list[Request]:
        """The batch of the next plain decode step, in scheduling order: `running`, then what the
        step merges from the last prefill batch (its first schedule does the merge)."""
        return self.scheduler.running + self._to_merge()[0]

    def decode_run_joining(self) -> Joins:
        """None: what a first schedule merges is in decode_run_requests() already."""
        return Joins([], [], [])

    def decode_run_steps(self, batch: Sequence[Request], num_steps: int) -> list[int]:
        """How many of a run's num_steps steps bring each request of `batch` a token (it is
        scheduled once more, the extra forward, when that is fewer): up to its last token. A
        request holding no placeholder (not in the step in flight) takes one step more."""
        return [min(r.max_tokens - r.num_output_tokens - r.num_output_placeholders, num_steps) for r in batch]

    def schedule_decode_steps(self, batch: Sequence[Request], num_steps: int, tokens: RunTokens | None,
                              now_s: float, steps_each: list[int] | None = None,
                              update_times_s: Sequence[float] = ()) -> DecodeRunEffects:
        """Apply num_steps plain decode schedules of `batch` (decode_run_requests() when the run was
        planned, decode_run_horizon steps at most) and, after each, the update of one step (its
        tokens: the first num_steps that `tokens` holds for batch[i], appended unbuilt:
        lazy_ids.py; None for no updates).
        Sync loop: step j's own update follows its schedule; overlap loop: the previous step's.
        `now_s` is the time of the last schedule or update applied.

        `steps_each` (overlap, with updates, through finishes): when steps_each[i] < num_steps,
        update steps_each[i] (at update_times_s[steps_each[i]]) brings batch[i] its last token
        and finishes it, as update_from_output does; schedule steps_each[i], just before that
        update, is its extra forward, so it is scheduled steps_each[i] + 1 times. A finished
        request is a ghost until the next schedule drops it and hands its id over (in the
        returned `finished`), or until the next one after the run."""
        sched = self.scheduler
        sched.now_s = now_s
        sched._merge_last_batch()  # the first schedule's; a no-op after a decode batch
        n = num_steps
        sched_each = None if steps_each is None else [min(m + 1, n) for m in steps_each]
        dropped = bool(sched.ghosts)  # the first schedule's filter drops them
        sched.ghosts.clear()
        finished = sched.finished_req_ids  # handed over by the first schedule
        sched.finished_req_ids = set()
        first = self.memory.first_alloc_steps(batch)  # before the counters move
        for i, r in enumerate(batch):
            r.num_computed_tokens += n if sched_each is None else sched_each[i]
            r.is_prefill_chunk = False
            if tokens is not None:
                m = n if steps_each is None or steps_each[i] >= n else steps_each[i] + 1
                if tokens.counts[i] < m:
                    raise ValueError(f"{r.request_id}: a run of {m} updates given {tokens.counts[i]} of its tokens")
                r.append_output_tokens_from(tokens.source, tokens.first[i], m)
            else:
                r.num_output_placeholders += n
        finish_at: list[list[Request]] | None = None
        if steps_each is not None:
            finish_at = [[] for _ in range(n)]
            for i, m in enumerate(steps_each):
                if m < n:
                    finish_at[m].append(batch[i])
        free_after = self.memory.apply_decode_run(batch, n, first, sched_each, finish_at, self._finish_in_run)
        if finish_at is not None:
            handed = {r.request_id for step in finish_at[:n - 1] for r in step}
            if handed:  # dropped and handed over by a later schedule of the run
                dropped = True
                finished = finished | handed
                sched.finished_req_ids -= handed
                sched.ghosts = [r for r in sched.ghosts if r.request_id not in handed]
        last = batch if sched_each is None else [r for r, m in zip(batch, sched_each) if m >= n]
        hits, queries = self._after_schedules(n, dropped, last, tokens is not None)
        return DecodeRunEffects(free_after, finished, hits, queries)

    def _after_schedules(self, num_steps: int, dropped: bool, last: Sequence[Request],
                         with_updates: bool) -> tuple[list[int], list[int]]:
        """What the run's schedule() calls change besides the batch, and the prefix-cache stats
        its updates take: (hits, queries) per update, empty without updates. `dropped`: a
        schedule's filter dropped a finished request; `last`: the run's last batch."""
        sched = self.scheduler
        cfg = sched.config
        # A filter that drops a finished request clears batch_is_full, priority scheduling clears
        # it to try preemption, and each memory check that passes decays new_token_ratio (in
        # order: the same float as stepping).
        if dropped or cfg.enable_priority_scheduling:
            sched.batch_is_full = False
        ratio, decay, floor = sched.new_token_ratio, sched.ratio_decay, sched.min_ratio
        for _step in range(num_steps):
            ratio = max(ratio - decay, floor)
        sched.new_token_ratio = ratio
        sched.prev_step_scheduled_req_ids = {r.request_id for r in last}
        sched.last_batch = Batch("decode", decode=list(last))
        hits: list[int] = []
        queries: list[int] = []
        if with_updates and sched.log_stats:  # each update takes the prefix-cache stats recorded since the previous one
            stats, sched.prefix_cache_stats = sched.prefix_cache_stats, PrefixCacheStats()
            hits = [stats.hits] + [0] * (num_steps - 1)
            queries = [stats.queries] + [0] * (num_steps - 1)
        return hits, queries

    def _finish_in_run(self, request: Request) -> None:
        """The update that brings a request of a run its last token: update_from_output's finish
        (its stop rule, then _finish: cache what it computed, free the rest, a ghost until the
        next filter)."""
        sched = self.scheduler
        if not check_stop(request, sched.max_model_len):
            raise AssertionError(f"{request.request_id}: a run's last step did not finish it")
        sched._finish(request)

    def decode_step_output(self, batch: Sequence[Request], joined_tokens: Sequence[int] = ()) -> SchedulerOutput:
        """The SchedulerOutput of the last plain decode step of `batch` scheduled by
        schedule_decode_steps, as update_from_output reads it (one sampled token per request, in
        order; nobody joins here); registered like a step schedule() returned. Page ids are not repeated: no
        executor reads an output after its step ran."""
        sched = self.scheduler
        ids = [r.request_id for r in batch]
        so = SchedulerOutput([], CachedRequestData(req_ids=ids), dict.fromkeys(ids, 1), len(ids), {}, [0],
                             set(), set())
        sched._steps[id(so)] = (so, StepInfo(sampling=set(ids)))
        sched._recent.append((so, False))
        return so

    def update_sampled_step(self, so: SchedulerOutput, mro: ModelRunnerOutput,
                            now_s: float) -> SampledStepUpdate | None:
        """Declined: SGLang's update reads the step's batch record (its merges, retractions and
        the overlap's extra forward), which no bulk update replays yet."""
        return None
