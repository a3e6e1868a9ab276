"""The vLLM V1 scheduler (0.19.1 behaviour), with its queue order and preemption choice delegated
to a scheduling policy (scheduler/policies/).

Typical use (what an engine loop does each step):

    sched = Scheduler(SchedulerConfig(...), CacheConfig(...))
    sched.add_request(Request(...), now_s=t)
    out = sched.schedule(now_s=t)                    # SchedulerOutput
    model_out = executor.execute(out)                # ModelRunnerOutput
    results = sched.update_from_output(out, model_out, now_s=t + step)

Time is only ever passed in; the scheduler never reads a clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import ClassVar

from servesim.scheduler import blocked_waits
from servesim.scheduler._schedule import schedule_behind, schedule_step
from servesim.scheduler.config import CacheConfig, SchedulerConfig
from servesim.scheduler.connector import KVConnector
from servesim.scheduler.encoder_cache import (EncoderCache, EncoderCacheManager, compute_mm_encoder_budget,
                                              free_encoder_inputs)
from servesim.scheduler.encoder_decoder_cache import (EncoderDecoderCacheManager, check_encoder_decoder_config,
                                                      check_request_inputs)
from servesim.scheduler.hashing import TokenProvenance, make_block_hasher
from servesim.scheduler.interface import SchedulerCapabilities, StrandedRequest
from servesim.scheduler.kv.mamba import make_mamba_split
from servesim.scheduler.kv.manager import KVCacheManager, PrefixCacheStats
from servesim.scheduler.output import (
    EngineCoreOutputs, KVConnectorOutput, ModelRunnerOutput, RequestOutput, SchedulerOutput,
    SchedulerStats, SpecDecodingStats,
)
from servesim.scheduler.prefix_lookup import ProbeKeys, cpu_cached_prefix_tokens, gpu_cached_prefix_tokens
from servesim.scheduler.pyset import set_order
from servesim.scheduler.policies import SchedulingPolicy, make_policy
from servesim.scheduler.request import BLOCKED_WAITING_STATES, Request, RequestStatus, append_until_stop
from servesim.scheduler.stranded import stranded_head


class Scheduler:
    """Implements scheduler.interface.SchedulerInterface."""

    # Sync scheduling: schedule, execute, update, repeat (AsyncScheduler keeps two steps in flight).
    max_steps_in_flight: ClassVar[int] = 1  # ClassVar: a subclass may override it, compiled too
    # The bulk decode path (scheduler/bulk/vllm.py) replays this class's steps; a subclass that
    # changes what a step does declares None (simulator/cluster/pd_schedulers.py).
    decode_runs: ClassVar[str | None] = "vllm"

    def __init__(self, scheduler_config: SchedulerConfig, cache_config: CacheConfig,
                 log_stats: bool = True, tracer=None) -> None:
        self.scheduler_config = scheduler_config
        self.cache_config = cache_config
        self.max_num_running_reqs = scheduler_config.max_num_seqs
        self.max_num_scheduled_tokens = scheduler_config.max_num_scheduled_tokens
        # Resolved from the model before a scheduler is built (simulator/startup.py): never None here.
        self.max_model_len: int = scheduler_config.max_model_len  # type: ignore[assignment]
        self.max_loras = scheduler_config.max_loras
        self.num_spec_tokens = scheduler_config.num_spec_tokens
        self.num_lookahead_tokens = scheduler_config.num_lookahead_tokens
        self.log_stats = log_stats
        self.block_size = cache_config.block_size
        self.block_hasher = (
            make_block_hasher(cache_config.block_size, cache_config.hash_algo)
            if cache_config.enable_prefix_caching else None
        )
        # A head's hit is the prompt's hit up to the head's end only for plain full attention (a
        # sliding window or eagle's dropped last block depend on where the prompt ends).
        self.probe_keys = None if self.block_hasher is None else ProbeKeys(
            self.block_hasher, self.block_size, cache_config.hash_algo,
            growing=cache_config.attention == "full" and not scheduler_config.use_eagle)
        # A schedule() that scheduled and preempted nothing, with no output pending, decides the
        # same again until something outside changes (an arrival, a KV transfer) or a pin expires.
        self.capabilities = SchedulerCapabilities(
            max_steps_in_flight=self.max_steps_in_flight, idle_is_stable=True,
            prefix_cache="block_hash" if cache_config.enable_prefix_caching else None,
            decode_runs=self.decode_runs)
        self.requests: dict[str, Request] = {}
        self.running: list[Request] = []
        self.finished_req_ids: set[str] = set()  # since the previous schedule()
        self.prev_step_scheduled_req_ids: set[str] = set()
        self.finished_recving_kv_req_ids: set[str] = set()  # P/D: KV transfers that completed
        # P/D: the scheduler side of a KV connector (scheduler/connector.py), or None.
        self.connector: KVConnector | None = None
        # Lookups the connector answered (tokens the GPU prefix cache lacked, tokens it supplied),
        # reported in SchedulerStats while a connector is set (vLLM's connector_prefix_cache_stats).
        self.connector_prefix_cache_stats = PrefixCacheStats()
        # An encoder-decoder model (Whisper) is the one with cross-attention groups (vLLM reads it from
        # the model config; the groups are how this port learns it).
        self.is_encoder_decoder = any(g.kind == "cross_attention" for g in cache_config.kv_cache_groups)
        if self.is_encoder_decoder:
            check_encoder_decoder_config(scheduler_config, cache_config)
        self.kv_cache_manager = KVCacheManager(
            cache_config, self.max_model_len, use_eagle=scheduler_config.use_eagle, log_stats=log_stats
        )
        # Multimodal requests: one encoder compute budget per step and the encoder output cache
        # (scheduler/encoder_cache.py); both 0 for a text-only model.
        self.max_num_encoder_input_tokens, encoder_cache_size = compute_mm_encoder_budget(scheduler_config)
        self.encoder_cache_manager: EncoderCache = (
            EncoderDecoderCacheManager(encoder_cache_size) if self.is_encoder_decoder
            else EncoderCacheManager(encoder_cache_size))
        # The policy owns the waiting order, victim choice and finish hooks (scheduler/policies/).
        self.policy: SchedulingPolicy = make_policy(scheduler_config, self.kv_cache_manager, self.requests)
        self.waiting = self.policy.make_waiting_queue()
        self.skipped_waiting = self.policy.make_skipped_queue()
        # Bound once: schedule() calls these every step / every waiting request it considers.
        self._policy_on_step = self.policy.on_step
        self._select_waiting_queue = self.policy.select_queue
        self._make_skipped_queue = self.policy.make_skipped_queue
        self.tracer = tracer
        self.now_s = 0.0
        self.num_preemptions_total = 0
        # Sessions parked in WAITING_FOR_STREAMING_REQ: queued, but not unfinished work (vLLM).
        self.num_waiting_for_streaming_input = 0
        self._ignored: list[RequestOutput] = []
        self._max_request_blocks = cache_config.num_gpu_blocks - 1
        # vLLM's _mamba_block_aligned_split when it applies (need_mamba_block_aligned_split: Mamba
        # groups in align mode), else None; refuses what vLLM refuses of Mamba groups.
        self.mamba_split = make_mamba_split(scheduler_config, cache_config)

    # --- requests in -----------------------------------------------------------------------------
    def schedule(self, now_s: float | None = None) -> SchedulerOutput:
        """Decide the next step (scheduler/_schedule.py: running requests first, then waiting ones)."""
        return schedule_step(self, now_s)

    def schedule_behind(self, num_batch_tokens: int, start: int) -> tuple[list[Request], list[int]]:
        """The rest of a schedule(), behind the num_batch_tokens tokens a bulk path scheduled for
        `running` up to running[start] (scheduler/_schedule.py): the running phase from there
        on, then the waiting phase; returns the requests they scheduled and their tokens."""
        return schedule_behind(self, num_batch_tokens, start)

    def _update_after_schedule(self, out: SchedulerOutput) -> None:
        """Advance num_computed_tokens right away so the next schedule() can continue a chunked
        prefill without waiting for this step's output (rejections are clawed back later)."""
        requests = self.requests
        for rid, n in out.num_scheduled_tokens.items():
            request = requests[rid]
            request.num_computed_tokens += n
            request.is_prefill_chunk = request.num_computed_tokens < request.num_tokens + request.num_output_placeholders
            if request.structured_output_request is not None and not request.is_prefill_chunk:
                out.has_structured_output_requests = True
            if request.mm_features:  # items the prompt has passed live in the KV cache now
                free_encoder_inputs(self, request)
        self.finished_req_ids = set()

    def make_request(self, request_id: str, prompt_token_ids: list[int], sampling_params, **kw) -> Request:
        """Build a Request whose block hashes match this scheduler's cache settings."""
        return Request(request_id, prompt_token_ids, sampling_params, block_hasher=self.block_hasher, **kw)

    def add_request(self, request: Request, now_s: float | None = None) -> None:
        if now_s is not None:
            self.now_s = now_s
        existing = self.requests.get(request.request_id)
        if existing is not None:  # the next input chunk of a streaming session (blocked_waits.py)
            blocked_waits.add_session_input(self, existing, request)
            return
        if request.mm_features or self.is_encoder_decoder:
            check_request_inputs(request, self.is_encoder_decoder, self.max_num_encoder_input_tokens,
                                 self.encoder_cache_manager.cache_size)
        if self.block_hasher is not None:
            request.attach_block_hasher(self.block_hasher, self.block_size)
        reject_reason = self._never_fits(request)
        if reject_reason is not None:
            # It would block the head of the queue forever: finish it as ignored, never schedule.
            request.status = RequestStatus.FINISHED_IGNORED
            self._ignored.append(RequestOutput(request.request_id, [], "length", 0, reject_reason=reject_reason))
            return
        self.requests[request.request_id] = request
        self.kv_cache_manager.note_request(request)
        if request.resumable:
            blocked_waits.on_new_request(request)
        self._enqueue_waiting_request(request)
        self.policy.on_arrival(request, self.now_s)

    def _enqueue_waiting_request(self, request: Request) -> None:
        """Blocked requests (grammar, remote KV, streaming input) go to skipped_waiting (vLLM)."""
        if request.status in BLOCKED_WAITING_STATES:
            self.skipped_waiting.add_request(request)
        else:
            self.waiting.add_request(request)

    def _never_fits(self, request: Request) -> str | None:
        """Why the request's prompt can never be scheduled (a REJECT_REASONS name), or None. An
        encoder-decoder request also holds its encoder input's cross-attention blocks."""
        if request.num_prompt_tokens > self.max_model_len:
            return "prompt_exceeds_max_model_len"
        num_encoder = request.mm_features[0].num_embeds if self.is_encoder_decoder else 0
        if self.kv_cache_manager.blocks_needed(request.num_prompt_tokens, num_encoder) > self._max_request_blocks:
            return "exceeds_kv_pool"
        return None

    def stranded_request(self) -> StrandedRequest | None:
        """The head waiting request if it can never be admitted as things stand (scheduler/stranded.py)."""
        return stranded_head(self)

    def take_ignored_outputs(self) -> list[RequestOutput]:
        """Requests finished as FINISHED_IGNORED at add_request time (prompt can never fit), each
        with its reject_reason."""
        out, self._ignored = self._ignored, []
        return out

    # --- results in ------------------------------------------------------------------------------
    def update_from_output(self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput,
                           now_s: float | None = None) -> EngineCoreOutputs:
        if now_s is not None:
            self.now_s = now_s
        sampled = model_runner_output.sampled_token_ids
        index = model_runner_output.req_id_to_index
        spec_stats: SpecDecodingStats | None = None
        outputs: list[RequestOutput] = self.take_ignored_outputs()
        finished: list[str] = [o.request_id for o in outputs]
        stopped_running: set[Request] = set()
        stopped_preempted: set[Request] = set()
        spec_tokens = scheduler_output.scheduled_spec_decode_tokens
        for rid in scheduler_output.num_scheduled_tokens:
            request = self.requests.get(rid)
            if request is None or request.is_finished():
                continue  # aborted while the step was executing
            new_ids = sampled[index[rid]] if sampled else []
            drafts = spec_tokens.get(rid) if spec_tokens else None  # (no lookup without spec decode)
            if drafts and new_ids:
                spec_stats = self._clawback_rejected(request, drafts, new_ids, spec_stats)
            stopped = False
            status_before = request.status
            if new_ids:
                # a copy where a stop may cut it (append_until_stop deletes past the stop in place,
                # and the model runner's list is not ours); one id is never cut, so it needs none
                new_ids, stopped = self._update_request_with_output(
                    request, new_ids if len(new_ids) == 1 else new_ids[:])
            if stopped:
                reason = request.get_finished_reason()  # before a session resets its status
                # A session (resumable) takes its next chunk or parks instead of finishing.
                if not request.resumable or blocked_waits.handle_stopped_request(self, request):
                    self._free_request(request)
                    finished.append(rid)
                (stopped_running if status_before == RequestStatus.RUNNING else stopped_preempted).add(request)
            else:
                reason = None
            if new_ids or stopped:
                outputs.append(RequestOutput(rid, new_ids, reason, request.num_cached_tokens or 0,
                                             request.stop_reason))
        if stopped_running:
            self.running = [r for r in self.running if r not in stopped_running]
        if stopped_preempted:
            self.waiting.remove_requests(stopped_preempted)
        if model_runner_output.kv_connector_output is not None:
            self._update_from_kv_xfer_finished(model_runner_output.kv_connector_output)
        if model_runner_output.draft_token_ids:
            self.update_draft_token_ids(model_runner_output.draft_token_ids)
        stats = self.make_stats(spec_stats) if self.log_stats else None
        return EngineCoreOutputs(outputs, stats, finished)

    def _clawback_rejected(self, request: Request, drafts: list[int], new_ids: list[int],
                           spec_stats: SpecDecodingStats | None) -> SpecDecodingStats:
        """Spec decode: the step computed every draft, but only accepted ones stay computed."""
        num_draft = len(drafts)
        num_accepted = len(new_ids) - 1
        num_rejected = num_draft - num_accepted
        if request.num_computed_tokens > 0:
            request.num_computed_tokens -= num_rejected
        if request.num_output_placeholders > 0:
            request.num_output_placeholders -= num_rejected
        if spec_stats is None:
            spec_stats = SpecDecodingStats(self.num_spec_tokens, num_accepted_tokens_per_pos=[0] * max(self.num_spec_tokens, num_draft))
        spec_stats.observe_draft(num_draft, num_accepted)
        return spec_stats

    def _update_request_with_output(self, request: Request, new_ids: list[int]) -> tuple[list[int], bool]:
        """Append tokens one by one, stopping at the first stop condition (later ones are dropped)."""
        return append_until_stop(request, new_ids, self.max_model_len)

    def update_draft_token_ids(self, draft_token_ids: dict[str, list[int]]) -> None:
        for rid, drafts in draft_token_ids.items():
            request = self.requests.get(rid)
            if request is None or request.is_finished():
                continue
            request.spec_token_ids = [] if request.is_prefill_chunk else list(drafts)

    # --- finishing -------------------------------------------------------------------------------
    def finish_requests(self, request_ids: str | Iterable[str] | None,
                        finished_status: RequestStatus = RequestStatus.FINISHED_ABORTED,
                        now_s: float | None = None) -> list[str]:
        """Finish requests from outside (aborts). Returns the ids that were actually unfinished.

        As vLLM: several ids are de-duplicated into a set and freed in its iteration order, which
        decides the free queue's order; we replay CPython's order under PYTHONHASHSEED=0
        (scheduler/pyset.py) so the result does not depend on our own process's hash seed.
        """
        if now_s is not None:
            self.now_s = now_s
        assert RequestStatus.is_finished(finished_status)
        if isinstance(request_ids, str):
            request_ids = (request_ids,)
        elif request_ids is None:
            request_ids = list(self.requests)
        else:
            request_ids = set_order(request_ids)
        valid = []
        for rid in request_ids:
            request = self.requests.get(rid)
            if request is None or request.is_finished():
                continue
            valid.append(request)
        running_drop = {r for r in valid if r.status == RequestStatus.RUNNING}
        waiting_drop = [r for r in valid if r.status != RequestStatus.RUNNING]
        self.num_waiting_for_streaming_input -= sum(r.status == RequestStatus.WAITING_FOR_STREAMING_REQ
                                                    for r in waiting_drop)
        if running_drop:
            self.running = [r for r in self.running if r not in running_drop]
        if waiting_drop:
            self.waiting.remove_requests(waiting_drop)
            self.skipped_waiting.remove_requests(waiting_drop)
        for request in valid:
            delay_free_blocks = False
            if request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                # Its blocks are the target of a KV load in flight: free them only when the
                # worker reports the load finished (_update_from_kv_xfer_finished).
                delay_free_blocks = request.request_id not in self.finished_recving_kv_req_ids
                self.finished_recving_kv_req_ids.discard(request.request_id)
            request.status = finished_status
            self._free_request(request, delay_free_blocks)
        return [r.request_id for r in valid]

    def _free_request(self, request: Request, delay_free_blocks: bool = False) -> None:
        """A request finished: tell the connector, report the id to the worker, free its blocks
        unless a KV transfer still reads or writes them (then `_free_blocks` runs later)."""
        assert request.is_finished()
        if self.connector is not None:
            delay_free_blocks |= self._connector_finished(request)
        if request.mm_features:
            self.encoder_cache_manager.free(request)
        self.finished_req_ids.add(request.request_id)
        if delay_free_blocks:
            return
        if self.policy.on_finish(request, self.now_s):
            return  # the policy keeps the blocks and releases them itself later
        self._free_blocks(request)

    def _connector_finished(self, request: Request) -> bool:
        kvm = self.kv_cache_manager
        # Out-of-window blocks are freed before the connector sees the block table (as vLLM).
        kvm.coordinator.remove_skipped_blocks(request.request_id, request.num_tokens)
        delay, _params = self.connector.request_finished(request, kvm.get_block_ids(request.request_id))
        return delay

    def _free_blocks(self, request: Request) -> None:
        assert request.is_finished()
        self.kv_cache_manager.free(request)
        del self.requests[request.request_id]

    def _update_from_kv_xfer_finished(self, kv_output: KVConnectorOutput) -> None:
        """Loads that landed make their requests schedulable (or free an aborted one's blocks);
        sends that completed free the finished request's blocks. Both in vLLM's set order."""
        if self.connector is not None:
            self.connector.update_connector_output(kv_output)
        for rid in set_order(kv_output.finished_recving):
            request = self.requests.get(rid)
            if request is None:
                continue
            if request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                self.finished_recving_kv_req_ids.add(rid)
            else:
                assert request.is_finished(), f"{rid}: KV load reported for a {request.status.name} request"
                self._free_blocks(request)
        for rid in set_order(kv_output.finished_sending):
            request = self.requests.get(rid)
            if request is not None:
                self._free_blocks(request)

    def mark_grammar_ready(self, request_id: str) -> None:
        """The request's structured-output grammar has compiled: schedule() may promote it."""
        blocked_waits.mark_grammar_ready(self, request_id)

    # --- P/D hooks -------------------------------------------------------------------------------
    def mark_kv_received(self, request_id: str) -> None:
        """A remote KV load into this instance has completed (outside a step's output)."""
        self._update_from_kv_xfer_finished(KVConnectorOutput(finished_recving=(request_id,)))

    def mark_kv_sent(self, request_id: str) -> None:
        """The remote side has read a finished request's KV (outside a step's output)."""
        self._update_from_kv_xfer_finished(KVConnectorOutput(finished_sending=(request_id,)))

    # --- state queries ---------------------------------------------------------------------------
    def get_num_unfinished_requests(self) -> int:
        """Queued and running requests, less sessions waiting for their next input chunk (vLLM)."""
        return (len(self.waiting) + len(self.skipped_waiting) - self.num_waiting_for_streaming_input
                + len(self.running))

    def has_unfinished_requests(self) -> bool:
        return self.get_num_unfinished_requests() > 0

    def has_finished_requests(self) -> bool:
        return bool(self.finished_req_ids)

    def has_requests(self) -> bool:
        return self.has_unfinished_requests() or self.has_finished_requests()

    def get_request_counts(self) -> tuple[int, int]:
        """(running, waiting incl. skipped)."""
        return len(self.running), len(self.waiting) + len(self.skipped_waiting)

    def next_event_s(self) -> float | None:
        """The earliest simulated time at which this scheduler's state changes by itself (the
        policy releasing held KV), or None: an idle engine need not call schedule() before then
        unless something outside changes."""
        return self.policy.next_event_s()

    def get_queue_lengths(self) -> tuple[int, int]:
        """(running, waiting incl. skipped): the queues are what the stats count."""
        return len(self.running), len(self.waiting) + len(self.skipped_waiting)

    def get_num_free_blocks(self) -> int:
        return self.kv_cache_manager.block_pool.get_num_free_blocks()

    def overlap_allowed(self, prev_scheduler_output: SchedulerOutput, scheduler_output: SchedulerOutput) -> bool:
        """vLLM's batch queue always overlaps the next step's scheduling with the running one."""
        return True

    def cached_prefix_tokens(self, token_ids: Sequence[int], lora_id: int | None = None,
                             provenance: TokenProvenance | None = None) -> int:
        """Leading prompt tokens get_computed_blocks would hit now (scheduler/prefix_lookup.py)."""
        return gpu_cached_prefix_tokens(self, token_ids, lora_id, provenance)

    def cpu_cached_prefix_tokens(self, token_ids: Sequence[int], lora_id: int | None = None,
                                 provenance: TokenProvenance | None = None, num_gpu_cached_tokens: int = 0) -> int:
        """Prompt tokens past the GPU hit the connector's CPU tier would load now (prefix_lookup.py)."""
        return cpu_cached_prefix_tokens(self, token_ids, lora_id, provenance, num_gpu_cached_tokens)

    def reset_prefix_cache(self) -> bool:
        return self.kv_cache_manager.reset_prefix_cache()

    def make_stats(self, spec_stats: SpecDecodingStats | None = None) -> SchedulerStats:
        return SchedulerStats(
            num_running_reqs=len(self.running),
            num_waiting_reqs=len(self.waiting) + len(self.skipped_waiting),
            kv_cache_usage=self.kv_cache_manager.usage,
            prefix_cache_stats=self.kv_cache_manager.make_prefix_cache_stats(),
            spec_decoding_stats=spec_stats,
            num_pinned_reqs=self.policy.num_held_requests(),
            connector_prefix_cache_stats=self._take_connector_prefix_cache_stats(),
            encoder_cache_usage=self.encoder_cache_manager.usage,
            encoder_cache_stats=self.encoder_cache_manager.take_stats(),
        )

    def _take_connector_prefix_cache_stats(self) -> PrefixCacheStats | None:
        if self.connector is None:
            return None
        stats, self.connector_prefix_cache_stats = self.connector_prefix_cache_stats, PrefixCacheStats()
        return stats

    def check_invariants(self) -> None:
        from servesim.scheduler.invariants import check_invariants

        check_invariants(self)
