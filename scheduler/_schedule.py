"""schedule(), split into its phases: functions of the Scheduler (scheduler.py) they run for.

Scheduler.schedule() calls schedule_step(self); each phase reads and writes that scheduler's
queues, KV cache manager and policy as vLLM's one schedule() method does (the parameter keeps
vLLM's name, `self`, so the code reads as vLLM's). Nothing else calls these functions.

The algorithm has no prefill or decode phase: each request's num_computed_tokens chases its
num_tokens_with_spec, and one token budget is spent first on RUNNING requests (in order), then,
only if nothing was preempted, on WAITING ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from servesim.scheduler import blocked_waits
from servesim.scheduler.encoder_cache import (commit_encoder_inputs, cross_attention_tokens,
                                              try_schedule_encoder_inputs)
from servesim.scheduler.kv.manager import KVCacheBlocks
from servesim.scheduler.output import CachedRequestData, NewRequestData, SchedulerOutput
from servesim.scheduler.request import BLOCKED_WAITING_STATES, Request, RequestStatus

if TYPE_CHECKING:
    from servesim.scheduler.scheduler import Scheduler


@dataclass(slots=True)
class _StepState:
    """Everything one schedule() call accumulates before it builds the SchedulerOutput."""

    token_budget: int
    new_reqs: list[Request] = field(default_factory=list)
    resumed_reqs: list[Request] = field(default_factory=list)
    running_reqs: list[Request] = field(default_factory=list)  # scheduled from RUNNING
    preempted_reqs: list[Request] = field(default_factory=list)
    req_to_new_blocks: dict[str, KVCacheBlocks] = field(default_factory=dict)
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)  # req_id -> tokens
    spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)
    scheduled_loras: set[int] = field(default_factory=set)
    prefix_events: list[dict] = field(default_factory=list)  # only filled when tracing
    encoder_budget: int = 0  # embeddings the encoder may still compute this step
    scheduled_encoder_inputs: dict[str, list[int]] = field(default_factory=dict)  # req_id -> item indices


def schedule_step(self: Scheduler, now_s: float | None = None) -> SchedulerOutput:
    if now_s is not None:
        self.now_s = now_s
    self._policy_on_step(self.now_s)  # timed policy state (e.g. held KV expiring) first
    if self.tracer is not None:
        self.tracer.snapshot(self)
    st = _StepState(token_budget=self.max_num_scheduled_tokens, encoder_budget=self.max_num_encoder_input_tokens)
    self.kv_cache_manager.new_step_starts()
    _schedule_running(self, st)
    if self.max_loras is not None:
        st.scheduled_loras = {r.lora_id for r in st.running_reqs if r.lora_id is not None}
    if not st.preempted_reqs:
        _schedule_waiting(self, st)
    out = _build_output(self, st)
    if self.connector is not None:  # plans from the tokens computed before this step (vLLM's order)
        out.kv_connector_metadata = self.connector.build_connector_meta(out)
    self._update_after_schedule(out)
    if self.tracer is not None:
        self.tracer.decision(self, st, out)
    return out

# --- phase 1: RUNNING ----------------------------------------------------------------------
def _schedule_running(self: Scheduler, st: _StepState, start: int = 0) -> None:
    """The RUNNING phase, from running[start] on (0: all of it; more: behind a bulk path's decodes)."""
    cfg = self.scheduler_config
    threshold = cfg.long_prefill_token_threshold
    lookahead = self.num_lookahead_tokens
    req_index = start
    while req_index < len(self.running) and st.token_budget > 0:
        request = self.running[req_index]
        # Async skip-ahead: the in-flight step already reaches max_tokens even if every draft
        # is rejected, so scheduling another step would only produce a discarded token.
        if (
            request.num_output_placeholders > 0
            and request.num_computed_tokens + 2 - request.num_output_placeholders
            >= request.num_prompt_tokens + request.max_tokens
        ):
            req_index += 1
            continue
        num_new = request.num_tokens_with_spec + request.num_output_placeholders - request.num_computed_tokens
        if 0 < threshold < num_new:
            num_new = threshold
        num_new = min(num_new, st.token_budget)
        # Keep the input position below max_model_len (matters with spec decode).
        num_new = min(num_new, self.max_model_len - 1 - request.num_computed_tokens)
        encoder_inputs, encoder_budget_left = None, st.encoder_budget
        if request.mm_features:  # cut before an item the encoder cannot run this step
            encoder_inputs, num_new, encoder_budget_left = try_schedule_encoder_inputs(
                self, request, request.num_computed_tokens, num_new, st.encoder_budget)
        if self.mamba_split is not None:  # Mamba align mode: whole blocks (scheduler/kv/mamba.py)
            num_new = self.mamba_split(request, num_new)
        if num_new <= 0:
            req_index += 1  # `continue`, not `break`: later requests may still fit
            continue
        new_blocks, num_rolled_back = _allocate_or_preempt(self, st, request, num_new, lookahead)
        # Each rolled-back victim sat before this request in `running` (as in vLLM, victims
        # that were skipped earlier in the step do not shift the index).
        req_index -= num_rolled_back
        if new_blocks is None:
            break
        st.running_reqs.append(request)
        rid = request.request_id
        st.req_to_new_blocks[rid] = new_blocks
        st.num_scheduled_tokens[rid] = num_new
        st.token_budget -= num_new
        req_index += 1
        if encoder_inputs:
            commit_encoder_inputs(self, st, request, encoder_inputs, encoder_budget_left)
        if request.spec_token_ids:
            num_spec = num_new + request.num_computed_tokens - request.num_tokens - request.num_output_placeholders
            if num_spec > 0:
                st.spec_decode_tokens[rid] = request.spec_token_ids[:num_spec]
            request.spec_token_ids = []  # new drafts arrive via update_draft_token_ids


def _allocate_or_preempt(self: Scheduler, st: _StepState, request: Request, num_new: int,
                         lookahead: int) -> tuple[KVCacheBlocks | None, int]:
    """allocate_slots, preempting victims until it succeeds or the request itself is evicted.

    Returns the new blocks (None if the request was evicted) and how many victims had been
    scheduled earlier in this step and were rolled back."""
    rolled_back = 0
    while True:
        new_blocks = self.kv_cache_manager.allocate_slots(request, num_new, num_lookahead_tokens=lookahead)
        if new_blocks is not None:
            return new_blocks, rolled_back
        victim = self.policy.pick_victim(self.running)
        self.running.remove(victim)
        if victim in st.running_reqs:
            # A policy may pick a victim scheduled earlier in this step: roll back what it got.
            vid = victim.request_id
            st.running_reqs.remove(victim)
            st.token_budget += st.num_scheduled_tokens.pop(vid)
            st.req_to_new_blocks.pop(vid)
            st.spec_decode_tokens.pop(vid, None)
            encoder_inputs = st.scheduled_encoder_inputs.pop(vid, None)
            if encoder_inputs:  # give back the encoder budget its items took
                st.encoder_budget += sum(victim.mm_features[i].num_embeds for i in encoder_inputs)
            rolled_back += 1
        _preempt_request(self, victim)
        st.preempted_reqs.append(victim)
        if victim is request:
            return None, rolled_back


def _preempt_request(self: Scheduler, request: Request) -> None:
    """Free the victim's KV and send it back to the front of the waiting queue (recompute)."""
    assert request.status == RequestStatus.RUNNING
    self.kv_cache_manager.free(request)
    if request.mm_features:
        self.encoder_cache_manager.free(request)
    request.status = RequestStatus.PREEMPTED
    request.num_computed_tokens = 0
    if request.spec_token_ids:
        request.spec_token_ids = []
    request.num_preemptions += 1
    self.num_preemptions_total += 1
    self.waiting.prepend_request(request)

# --- phase 2: WAITING ----------------------------------------------------------------------
def _schedule_waiting(self: Scheduler, st: _StepState) -> None:
    cfg = self.scheduler_config
    kvm = self.kv_cache_manager
    step_skipped = self._make_skipped_queue()
    select_queue = self._select_waiting_queue
    while (self.waiting or self.skipped_waiting) and st.token_budget > 0:
        if len(self.running) == self.max_num_running_reqs:
            break
        queue = select_queue(self.waiting, self.skipped_waiting)
        request = queue.peek_request()
        if request.status in BLOCKED_WAITING_STATES and not _try_promote_blocked(self, request):
            step_skipped.prepend_request(queue.pop_request())
            continue
        if (
            self.max_loras is not None
            and request.lora_id is not None
            and len(st.scheduled_loras) == self.max_loras
            and request.lora_id not in st.scheduled_loras
        ):
            step_skipped.prepend_request(queue.pop_request())
            continue
        num_external, load_async, connector_queries = 0, False, 0
        if request.num_computed_tokens == 0:
            new_computed_blocks, num_new_local = kvm.get_computed_blocks(request)
            if self.connector is not None:  # tokens whose KV lives elsewhere (another instance, CPU)
                ext_tokens, load_async = self.connector.get_num_new_matched_tokens(request, num_new_local)
                if ext_tokens is None:  # the connector cannot tell yet: ask again next step (vLLM)
                    step_skipped.prepend_request(queue.pop_request())
                    continue
                num_external = request.num_external_computed_tokens = ext_tokens
                connector_queries = request.num_tokens - num_new_local
            num_computed = num_new_local + num_external
        else:  # came back from a remote KV transfer with its tokens already in place
            new_computed_blocks, num_new_local = kvm.empty_kv_cache_blocks, 0
            num_computed = request.num_computed_tokens
        encoder_inputs, encoder_budget_left = None, st.encoder_budget
        if load_async:  # reserve blocks for the remote KV; no work this step
            num_new = 0
        else:
            num_new, encoder_inputs, encoder_budget_left = _num_new_waiting(self, st, request, num_computed)
            if num_new == 0:  # no chunk fits, or the next item cannot be encoded: stop admitting
                break
        if self.mamba_split is not None:  # Mamba align mode: whole blocks; none fit: stop here (vLLM)
            if not (num_new := self.mamba_split(request, num_new, num_new_local, num_external)):
                break
        lookahead = 0 if request.num_computed_tokens == 0 else self.num_lookahead_tokens
        if self.tracer is not None:
            _trace_lookup(st, request, num_new_local)
        num_encoder = cross_attention_tokens(self, request, encoder_inputs)
        fits = not cfg.scheduler_reserve_full_isl or kvm.can_fit_full_sequence(
            request, num_new_computed_tokens=num_new_local, new_computed_blocks=new_computed_blocks,
            num_external_computed_tokens=num_external, num_encoder_tokens=num_encoder,
        )
        new_blocks = None if not fits else kvm.allocate_slots(
            request, num_new, num_new_computed_tokens=num_new_local, new_computed_blocks=new_computed_blocks,
            num_lookahead_tokens=lookahead, num_external_computed_tokens=num_external, delay_cache_blocks=load_async,
            num_encoder_tokens=num_encoder)
        if new_blocks is None:
            if request.mm_features:  # drop the encoder-cache references the lookup took (vLLM)
                self.encoder_cache_manager.free(request)
            break
        if self.connector is not None:  # every admission, not only remote loads (as vLLM)
            self.connector.update_state_after_alloc(request, kvm.get_blocks(request.request_id), num_external)
            if connector_queries:  # the connector's hits among the tokens the GPU cache lacked (vLLM)
                self.connector_prefix_cache_stats.record(connector_queries, num_external, request.num_preemptions > 0)
        if load_async:  # park it in WAITING_FOR_REMOTE_KVS until the load is reported (vLLM)
            queue.pop_request()
            request.status = RequestStatus.WAITING_FOR_REMOTE_KVS
            # Counts the tokens being loaded; promotion caches them and, on a full prompt
            # hit, steps back one token so the last one is recomputed to sample.
            request.num_computed_tokens = num_computed
            step_skipped.prepend_request(request)
            continue
        _admit(self, st, queue.pop_request(), num_new, num_computed)
        if encoder_inputs:
            commit_encoder_inputs(self, st, request, encoder_inputs, encoder_budget_left)
    if step_skipped:
        self.skipped_waiting.prepend_requests(step_skipped)


def _trace_lookup(st: _StepState, request: Request, num_new_local: int) -> None:
    st.prefix_events.append({"req_id": request.request_id, "job_id": request.job_id,
                             "local_hit_tokens": num_new_local, "num_prompt_tokens": request.num_prompt_tokens,
                             "num_tokens": request.num_tokens})


def _num_new_waiting(self: Scheduler, st: _StepState, request: Request,
                     num_computed: int) -> tuple[int, list[int] | None, int]:
    """Tokens to schedule for a waiting request (0: stop admitting), the items the encoder runs for
    it and the encoder budget they leave."""
    cfg = self.scheduler_config
    # num_tokens, not num_prompt_tokens: a resumed request recomputes its outputs too.
    num_new = request.num_tokens - num_computed
    if 0 < cfg.long_prefill_token_threshold < num_new:
        num_new = cfg.long_prefill_token_threshold
    if not cfg.enable_chunked_prefill and num_new > st.token_budget:
        return 0, None, st.encoder_budget
    num_new = min(num_new, st.token_budget)
    if not request.mm_features:
        return num_new, None, st.encoder_budget
    # Cut before an item the encoder cannot run this step.
    inputs, num_new, budget_left = try_schedule_encoder_inputs(self, request, num_computed, num_new, st.encoder_budget)
    return num_new, inputs, budget_left


def _admit(self: Scheduler, st: _StepState, request: Request, num_new: int, num_computed: int) -> None:
    self.running.append(request)
    if request.status == RequestStatus.WAITING:
        st.new_reqs.append(request)
    elif request.status == RequestStatus.PREEMPTED:
        st.resumed_reqs.append(request)
    else:
        raise RuntimeError(f"invalid status {request.status} for admission of {request.request_id}")
    if self.max_loras is not None and request.lora_id is not None:
        st.scheduled_loras.add(request.lora_id)
    rid = request.request_id
    st.req_to_new_blocks[rid] = self.kv_cache_manager.get_blocks(rid)
    st.num_scheduled_tokens[rid] = num_new
    st.token_budget -= num_new
    request.status = RequestStatus.RUNNING
    request.num_computed_tokens = num_computed
    if request.num_cached_tokens is None:
        request.num_cached_tokens = num_computed


def _try_promote_blocked(self: Scheduler, request: Request) -> bool:
    if request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
        if request.request_id not in self.finished_recving_kv_req_ids:
            return False
        self.finished_recving_kv_req_ids.discard(request.request_id)
        # The transferred blocks are now valid: enter them in the prefix cache.
        self.kv_cache_manager.cache_blocks(request, request.num_computed_tokens)
        if request.num_computed_tokens == request.num_tokens:
            request.num_computed_tokens = request.num_tokens - 1  # recompute the last token
        if request.num_cached_tokens is None:
            request.num_cached_tokens = request.num_computed_tokens
        request.status = RequestStatus.PREEMPTED if request.num_preemptions else RequestStatus.WAITING
        return True
    return blocked_waits.try_promote(self, request)  # grammar and streaming-input waits

# --- behind a bulk path's decodes ----------------------------------------------------------
def schedule_behind(self: Scheduler, num_batch_tokens: int, start: int) -> tuple[list[Request], list[int]]:
    """The rest of a schedule() whose RUNNING phase a bulk path applied up to running[start]
    (scheduler/bulk/: a run's first schedule, requests joining it): its requests scheduled
    num_batch_tokens tokens (one-token decodes, or verifies of 1 + num_spec_tokens), nobody
    preempted, those tokens taken from the budget. The RUNNING phase from running[start]
    on (a prefill chunk completing) and the WAITING phase on what is left, then what
    _build_output and _update_after_schedule do for the requests they schedule (the previous
    step's ids, the counters and placeholders); the bulk path builds the step's output. Returns
    them, in scheduling order, and the tokens each was scheduled."""
    st = _StepState(token_budget=self.max_num_scheduled_tokens - num_batch_tokens,
                    encoder_budget=self.max_num_encoder_input_tokens)
    if start < len(self.running):
        _schedule_running(self, st, start)
    if not st.preempted_reqs:
        _schedule_waiting(self, st)
    scheduled = st.num_scheduled_tokens
    if not scheduled:
        return [], []
    self.prev_step_scheduled_req_ids.update(scheduled)
    self._update_after_schedule(SchedulerOutput([], CachedRequestData(), scheduled, sum(n for n in scheduled.values()),
                                                st.spec_decode_tokens, [], set(), set()))
    return [self.requests[rid] for rid in scheduled], list(scheduled.values())

# --- output --------------------------------------------------------------------------------
def _build_output(self: Scheduler, st: _StepState) -> SchedulerOutput:
    # sum over a generator, not a view: mypyc compiles it to a loop (a view is summed by a call into the
    # interpreter's builtin); the same below and in the hot paths that sum per step
    total = sum(n for n in st.num_scheduled_tokens.values())
    assert total <= self.max_num_scheduled_tokens and st.token_budget >= 0
    assert len(self.running) <= self.max_num_running_reqs
    num_common = [0] * self.kv_cache_manager.num_kv_cache_groups
    if self.running:
        num_common = self.kv_cache_manager.get_num_common_prefix_blocks(self.running[0].request_id)
    new_data = [
        NewRequestData(r.request_id, r.prompt_token_ids, r.sampling_params,
                       st.req_to_new_blocks[r.request_id].get_block_ids(), r.num_computed_tokens, r.lora_id,
                       r.mm_features)
        for r in st.new_reqs
    ]
    cached = _make_cached_request_data(self, st)
    self.prev_step_scheduled_req_ids = set(st.num_scheduled_tokens)
    return SchedulerOutput(
        scheduled_new_reqs=new_data,
        scheduled_cached_reqs=cached,
        num_scheduled_tokens=st.num_scheduled_tokens,
        total_num_scheduled_tokens=total,
        scheduled_spec_decode_tokens=st.spec_decode_tokens,
        num_common_prefix_blocks=num_common,
        finished_req_ids=self.finished_req_ids,
        preempted_req_ids={r.request_id for r in st.preempted_reqs},
        scheduled_encoder_inputs=st.scheduled_encoder_inputs,
        free_encoder_mm_hashes=self.encoder_cache_manager.get_freed_mm_hashes(),
    )


def _make_cached_request_data(self: Scheduler, st: _StepState):
    data = CachedRequestData()
    prev = self.prev_step_scheduled_req_ids
    num_running = len(st.running_reqs)
    for idx, req in enumerate(st.running_reqs + st.resumed_reqs):
        rid = req.request_id
        data.req_ids.append(rid)
        if idx >= num_running:
            data.resumed_req_ids.add(rid)
        if rid not in prev:
            data.all_token_ids[rid] = req.all_token_ids[:]  # vLLM: all_token_ids.copy()
        data.new_block_ids.append(st.req_to_new_blocks[rid].get_block_ids_or_none())
        data.num_computed_tokens.append(req.num_computed_tokens)
        data.num_output_tokens.append(req.num_output_tokens + req.num_output_placeholders)
    return data
