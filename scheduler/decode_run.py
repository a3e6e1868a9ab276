"""Runs of plain decode steps applied in bulk (macro-steps; the engine side is simulator/macro_step.py).

A plain decode step schedules exactly one token for every running request, in `running` order,
admits nobody, preempts nobody and finishes nobody. When the scheduler's state proves the next k
steps are all plain, their effect is fixed: each request's num_computed_tokens grows by k, the KV
manager allocates and caches blocks at the block boundaries (scheduler/kv/decode_run.py, in
vLLM's order), and each update appends the sampled token. Mixed into Scheduler.

DecodeRunMixin extends ScheduleMixin instead of sitting beside it as a second base: mypyc compiles
single inheritance only (Scheduler -> DecodeRunMixin -> ScheduleMixin; no method names overlap).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from servesim.scheduler._schedule import ScheduleMixin
from servesim.scheduler.output import CachedRequestData, SchedulerOutput
from servesim.scheduler.request import RequestStatus

if TYPE_CHECKING:
    from servesim.scheduler.request import Request
    from servesim.scheduler.scheduler import Scheduler


class DecodeRunMixin(ScheduleMixin):
    def decode_run_horizon(self: Scheduler, max_steps: int, num_in_flight: int) -> int:
        """How many of the next schedule() calls (at most max_steps) are provably plain decode steps
        of one fixed batch (decode_run_requests()), none of whose updates finishes a request of
        that batch; 0 if not even one.

        `num_in_flight` is the number of steps scheduled but not yet updated (0: sync loop; 1: the
        async loop between steps, when every running request holds one output placeholder). With
        one in flight, a request whose in-flight step brings it to max_tokens is skipped by the
        next schedule (vLLM's async skip-ahead) and finished by that step's update: it leaves the
        batch, the rest stays fixed. Conservative: any state not recognised answers 0."""
        if (self.connector is not None or self.num_spec_tokens or self.num_lookahead_tokens
                or self.tracer is not None or self.policy.next_event_s() is not None):
            return 0
        running = self.running
        n = len(running)
        if n == 0:
            return 0
        # A waiting request is never looked at while the batch is full (schedule() stops first).
        if (self.waiting or self.skipped_waiting) and n < self.max_num_running_reqs:
            return 0
        threshold = self.scheduler_config.long_prefill_token_threshold
        if 0 < threshold < 1:
            return 0
        k = max_steps
        max_len = self.max_model_len
        ph = num_in_flight
        num_batch = 0
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
            k = min(k, r.max_tokens - r.num_output_tokens - 1, max_len - ntok - 2)
            if k < 1:
                return 0
        if num_batch == 0 or num_batch > self.max_num_scheduled_tokens:
            return 0
        if num_batch < n and (self.waiting or self.skipped_waiting):
            return 0  # the finish frees a seat: the next schedule admits a waiting request
        return self.kv_cache_manager.decode_run_fit(self.decode_run_requests(), k)

    def decode_run_requests(self: Scheduler) -> list[Request]:
        """The batch of the next plain decode step, in scheduling order: the running requests but
        those the async skip-ahead rule passes over (their in-flight step reaches max_tokens)."""
        return [r for r in self.running
                if not (r.num_output_placeholders > 0 and r.num_output_tokens + 1 >= r.max_tokens)]

    def schedule_decode_steps(self: Scheduler, batch: Sequence[Request], num_steps: int,
                              token_ids: Sequence[Sequence[int]], now_s: float) -> tuple[list[int], set[str]]:
        """Apply num_steps plain decode schedules of `batch` (decode_run_requests() when the run was
        planned) and, after each, the update of one step (its tokens: token_ids[i] for batch[i],
        num_steps each, or empty lists for no updates).

        Sync loop: step j's own update follows its schedule. Async loop: the update that follows
        schedule j is the previous step's (already in flight), so placeholders stay constant.
        Returns the free-block count after each schedule (for the step's kv usage) and the ids
        finished since the previous schedule, which the first step's output hands the worker.
        `now_s` is the time of the last schedule or update applied."""
        self.now_s = now_s
        t0 = [r.num_tokens for r in batch]
        with_updates = bool(token_ids) and len(token_ids[0]) > 0
        if with_updates:
            for r, toks in zip(batch, token_ids):
                r.append_output_token_ids(list(toks))  # hashes the blocks they complete
        free_after = self.kv_cache_manager.apply_decode_run(batch, num_steps, t0)
        for r in batch:  # spec_token_ids stay empty (no drafts: decode_run_horizon checked)
            r.num_computed_tokens += num_steps
            r.is_prefill_chunk = False
            if not with_updates:
                r.num_output_placeholders += num_steps
        self.prev_step_scheduled_req_ids = {r.request_id for r in batch}
        finished = self.finished_req_ids
        none_finished: set[str] = set()
        self.finished_req_ids = none_finished
        if with_updates:
            self.kv_cache_manager.make_prefix_cache_stats()  # each update resets the stats; nothing was looked up
        return free_after, finished

    def decode_step_output(self: Scheduler, batch: Sequence[Request]) -> SchedulerOutput:
        """The SchedulerOutput of the last plain decode step of `batch` scheduled by
        schedule_decode_steps, as update_from_output reads it (one token per request, in order; no
        drafts). Block ids are not repeated: no executor reads an output after its step ran."""
        cached = CachedRequestData(req_ids=[r.request_id for r in batch])
        return SchedulerOutput([], cached, {r.request_id: 1 for r in batch}, len(batch), {},
                               [0] * self.kv_cache_manager.num_kv_cache_groups, set(), set())
