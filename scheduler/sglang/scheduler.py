"""SGLangScheduler: SGLang's scheduling loop behind the interface our engine drives.

One schedule() is SGLang's get_next_batch_to_run:
  1. the chunked request caches what it computed so far (cache_unfinished_req);
  2. the last prefill (or mixed) batch is merged into the running batch, finished ones filtered;
  3. a new prefill batch is tried first (PrefillAdder over the sorted waiting queue);
  4. otherwise the running batch decodes one token each, after the decode memory check, which
     may retract requests back to the waiting queue.
Prefill and decode are separate forward passes (unless mixed chunk is on), unlike vLLM's single
token budget. update_from_output is SGLang's process_batch_result. The scheduler keeps no wall
clock and never waits for a result to schedule, so it works with one step in flight (overlap).
"""

from __future__ import annotations

import itertools
import random
from collections import deque
from collections.abc import Iterable, Sequence

from servesim.scheduler.hashing import TokenProvenance, make_block_hasher
from servesim.scheduler.interface import SchedulerCapabilities, StrandedRequest
from servesim.scheduler.kv.manager import PrefixCacheStats
from servesim.scheduler.output import (
    EngineCoreOutputs, ModelRunnerOutput, RequestOutput, SchedulerOutput, SchedulerStats, SpecDecodingStats,
)
from servesim.scheduler.prefix_lookup import shared_probe
from servesim.scheduler.request import Request, RequestStatus, append_until_stop
from servesim.scheduler.sglang.batching import Batch, BatchingMixin
from servesim.scheduler.sglang.config import SGLangConfig
from servesim.scheduler.sglang.hicache import HiCacheController
from servesim.scheduler.sglang.hybrid_config import check_resolved
from servesim.scheduler.sglang.hicache_config import LOAD_BACK_THRESHOLD_TOKENS
from servesim.scheduler.sglang.memory import SGLangMemory
from servesim.scheduler.sglang.output import StepInfo, build_output

MAX_INPUT_MARGIN = 5  # SGLang: max_req_input_len = max_req_len - 5


class SGLangScheduler(BatchingMixin):
    """Implements scheduler.interface.SchedulerInterface."""

    def __init__(self, config: SGLangConfig, max_model_len: int, log_stats: bool = True,
                 page_keys_hash_algo: str | None = None) -> None:
        """`page_keys_hash_algo`: key the radix tree by page keys (memory.py), hashing the ids of
        requests whose provenance is not declared with this algorithm (CacheConfig.hash_algo);
        None keys it by token ids, as SGLang does. Either way it hits and misses alike."""
        missing = config.unresolved_fields()
        if missing:
            raise ValueError(f"SGLangConfig fields still None: {', '.join(missing)} "
                             "(fill them from the shared configs: simulator.scheduler_kinds.sglang.map_sglang_config)")
        page_size, enable_radix_cache = config.page_size, config.enable_radix_cache
        assert page_size is not None and enable_radix_cache is not None  # resolved: checked just above
        self.config = config
        self.max_model_len = max_model_len
        self.log_stats = log_stats
        self.page_size = page_size
        hc = config.hicache
        self.hicache = HiCacheController(hc, page_size, config.num_pages * page_size) \
            if hc.enable_hierarchical_cache else None
        self.kv_cache_manager = SGLangMemory(config.num_pages, page_size, enable_radix_cache,
                                             self.hicache, hc.hicache_write_policy, check_resolved(config),
                                             page_keys=page_keys_hash_algo is not None)
        # Keys each request's pages as its tokens are appended (page keys only: None otherwise).
        self.page_keys_hash_algo = page_keys_hash_algo if self.kv_cache_manager.page_keys else None
        self.block_hasher = None if self.page_keys_hash_algo is None else \
            make_block_hasher(page_size, self.page_keys_hash_algo)
        # Tokens a decode step computes per request: 1, or a speculative verify's 1 + k (k drafts,
        # placeholders here: the worker proposes them and draws their acceptance).
        self.num_decode_tokens = 1 + config.speculative_num_steps
        self._draft_placeholders = [-1] * config.speculative_num_steps
        # Two steps in flight with SGLang's overlap schedule (event_loop_overlap). An idle
        # schedule() is not declared stable: SGLang's own loop steps again at once. With HiCache
        # it is: schedule() itself steps again while an idle round changed the state (_idle_rounds),
        # and the engine then sleeps until a copy ends (next_event_s) instead of spinning at one
        # instant. (With HiCache the bulk decode path declines: scheduler/bulk/sglang.py.)
        self.capabilities = SchedulerCapabilities(
            max_steps_in_flight=2 if config.overlap_schedule else 1, idle_is_stable=self.hicache is not None,
            prefix_cache="radix" if config.enable_radix_cache else None, decode_runs="sglang")
        pool_tokens = config.num_pages * config.page_size
        self.max_req_len = min(max_model_len - 1, pool_tokens - 1)  # tokens per request at most
        self.requests: dict[str, Request] = {}  # unfinished requests
        self.waiting: list[Request] = []
        self.running: list[Request] = []  # SGLang's running_batch.reqs (decoding)
        # Finished requests SGLang still holds in running_batch until its next filter_batch: they
        # count against max_running_requests and keep batch_is_full set until then.
        self.ghosts: list[Request] = []
        self.batch_is_full = False
        self.chunked_req: Request | None = None
        self.last_batch: Batch | None = None
        # new_token_ratio's bounds and decay (the config's derived values, read at every decode step)
        self.init_ratio, self.min_ratio, self.ratio_decay = config.init_ratio, config.min_ratio, config.ratio_decay
        self.new_token_ratio = self.init_ratio
        self.entry_seq: dict[str, int] = {}  # FCFS time: order of entry into the waiting queue
        self._seq = itertools.count()
        self.rng = random.Random(config.seed)
        self.finished_req_ids: set[str] = set()  # since the previous schedule()
        self.prev_step_scheduled_req_ids: set[str] = set()
        self.prefix_cache_stats = PrefixCacheStats()
        self.num_retractions_total = 0
        self.now_s = 0.0
        self._pending: list[RequestOutput] = []  # ignored at arrival / aborted: reported next
        self._steps: dict[int, tuple[SchedulerOutput, StepInfo]] = {}  # id(so) -> step, until applied
        self._recent: deque[tuple[SchedulerOutput, bool]] = deque(maxlen=8)  # (so, is_extend)

    def _set_now(self, now_s: float | None) -> None:
        if now_s is not None:
            self.now_s = now_s
            if self.hicache is not None:
                self.hicache.now_s = now_s

    # --- requests in -----------------------------------------------------------------------------
    def add_request(self, request: Request, now_s: float | None = None) -> None:
        self._set_now(now_s)
        rid = request.request_id
        if rid in self.requests:
            raise ValueError(f"duplicate request id {rid!r}")
        if not self.requests:
            self.new_token_ratio = self.init_ratio  # SGLang re-inits it when idle
        max_new = self._clamp_max_new_tokens(request)
        if max_new < 1:
            # SGLang aborts a prompt that cannot fit; like vLLM we finish it as ignored.
            request.status = RequestStatus.FINISHED_IGNORED
            self._pending.append(RequestOutput(rid, [], "length", 0, reject_reason=self._refusal_reason(request)))
            return
        request.max_tokens = min(request.max_tokens, max_new)
        if self.block_hasher is not None:
            request.attach_block_hasher(self.block_hasher, self.page_size)
        self.requests[rid] = request
        self._enqueue(request)

    def _clamp_max_new_tokens(self, request: Request) -> int:
        """SGLang's validate_input_length + init_req_max_new_tokens: the output room left by
        the context length and by the whole pool (a request must fit alone)."""
        n = request.num_prompt_tokens
        if n >= self.max_req_len - MAX_INPUT_MARGIN:
            return 0
        ps = self.page_size
        paged = -(-n // ps) * ps
        pool_tokens = self.config.num_pages * ps
        return min(request.max_tokens, self.max_req_len - n - 1, pool_tokens - paged - ps - 1)

    def _refusal_reason(self, request: Request) -> str:
        """Which of _clamp_max_new_tokens' bounds left no output room: the context length
        (max_model_len, less SGLang's input margin) or the pool (max_req_len is the smaller)."""
        if request.num_prompt_tokens >= self.max_req_len - MAX_INPUT_MARGIN:
            return "no_room_to_generate" if self.max_req_len == self.max_model_len - 1 else "exceeds_kv_pool"
        return "exceeds_kv_pool"  # the prompt's pages leave no page to decode into

    def _enqueue(self, request: Request) -> None:
        self.waiting.append(request)
        self.entry_seq[request.request_id] = next(self._seq)

    def stranded_request(self) -> StrandedRequest | None:
        """Never one: SGLang clamps max_new_tokens to the pool, refuses a prompt that cannot fit
        and aborts a request that cannot decode even alone (its own rules, not a wait)."""
        return None

    def take_ignored_outputs(self) -> list[RequestOutput]:
        out, self._pending = self._pending, []
        return out

    # --- one step ----------------------------------------------------------------------------------
    def schedule(self, now_s: float | None = None) -> SchedulerOutput:
        self._set_now(now_s)
        preempted: list[Request] = []
        batch = self._get_next_batch_to_run(preempted)
        if batch is None and self.hicache is not None and not preempted:
            batch = self._idle_rounds(preempted)
        self.last_batch = batch
        so, info = build_output(self, batch, preempted)
        self._steps[id(so)] = (so, info)
        self._recent.append((so, batch is not None and batch.is_extend))
        return so

    def _idle_state(self) -> tuple:
        return (len(self.ghosts), self.batch_is_full, len(self.running), len(self.waiting),
                self.chunked_req is not None, len(self.kv_cache_manager.loading))

    def _idle_rounds(self, preempted: list[Request]) -> Batch | None:
        """HiCache: SGLang's loop runs an idle round again at once; do those rounds here while one
        changed the state (a filtered batch, a cleared batch_is_full), so an idle schedule() is
        stable. Bounded: each round that changes anything shrinks ghosts or flips a flag."""
        for _ in range(4):
            before = self._idle_state()
            self.last_batch = None
            batch = self._get_next_batch_to_run(preempted)
            if batch is not None or preempted or self._idle_state() == before:
                return batch
        return None

    def _get_next_batch_to_run(self, preempted: list[Request]) -> Batch | None:
        if self.chunked_req is not None:
            self.kv_cache_manager.cache_unfinished(self.chunked_req, self.chunked_req.num_computed_tokens)
        self._merge_last_batch()
        batch = self._get_new_batch_prefill(preempted)
        if batch is not None:
            return batch  # prefill first
        if self.running or self.ghosts:
            return self._update_running_batch(preempted)
        return None

    def _merge_last_batch(self) -> None:
        lb = self.last_batch
        if lb is None or not lb.is_extend:
            return
        reqs = lb.requests()
        keep = [r for r in reqs
                if r is not self.chunked_req and r.status == RequestStatus.RUNNING]
        if len(keep) < len(reqs):
            self.batch_is_full = False  # SGLang: the filtered batch got smaller
        self.running.extend(keep)

    def overlap_allowed(self, prev_scheduler_output: SchedulerOutput, scheduler_output: SchedulerOutput) -> bool:
        """May `scheduler_output` be scheduled while `prev_scheduler_output` runs (the engine's
        2-deep batch queue)? Off without overlap scheduling, and for two prefill batches in a
        row when disable_consecutive_prefill_overlap is set (SGLang's is_disable_overlap_for_batch:
        process the first prefill's result before launching the second, for its TTFT)."""
        if not self.config.overlap_schedule:
            return False
        if self.config.disable_consecutive_prefill_overlap:
            return not (self._is_extend(prev_scheduler_output) and self._is_extend(scheduler_output))
        return True

    def _is_extend(self, so: SchedulerOutput) -> bool:
        for s, is_extend in self._recent:
            if s is so:
                return is_extend
        return False

    # --- results in --------------------------------------------------------------------------------
    def update_from_output(self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput,
                           now_s: float | None = None) -> EngineCoreOutputs:
        self._set_now(now_s)
        outputs = self.take_ignored_outputs()
        finished = [o.request_id for o in outputs]
        step = self._steps.pop(id(scheduler_output), None)
        info = StepInfo() if step is None else step[1]
        sampled, index = model_runner_output.sampled_token_ids, model_runner_output.req_id_to_index
        spec = scheduler_output.scheduled_spec_decode_tokens
        k = self.config.speculative_num_steps
        spec_stats = SpecDecodingStats(k, num_accepted_tokens_per_pos=[0] * k) if spec else None
        for rid in scheduler_output.num_scheduled_tokens:
            request = self.requests.get(rid)
            if rid in info.sampling and request is not None:
                request.num_output_placeholders -= 1
            if request is None or request.is_finished():
                continue  # finished while this step ran (overlap's extra forward): dropped
            new_ids = list(sampled[index[rid]]) if sampled and rid in index else []
            if spec_stats is not None and rid in spec and new_ids:
                self._accept_drafts(request, len(spec[rid]), len(new_ids) - 1, info, spec_stats)
            # A request retracted after this step was scheduled keeps the token (SGLang drops it and
            # samples it again; the sampled tokens are the same here).
            new_ids, stopped = append_until_stop(request, new_ids, self.max_model_len)
            if stopped:
                self._finish(request)
                finished.append(rid)
            elif rid in info.prefill_end and request.status == RequestStatus.RUNNING:
                self.kv_cache_manager.cache_unfinished(request, info.prefill_end[rid])
            if new_ids or stopped:
                outputs.append(RequestOutput(rid, new_ids, request.get_finished_reason(),
                                             request.num_cached_tokens or 0, request.stop_reason))
        stats = self.make_stats(spec_stats) if self.log_stats else None
        return EngineCoreOutputs(outputs, stats, finished)

    def _accept_drafts(self, request: Request, num_drafts: int, num_accepted: int, info: StepInfo,
                       spec_stats: SpecDecodingStats) -> None:
        """A verify step computed every draft; the rejected ones' KV is not part of the sequence
        (SGLang frees their slots; our block table keeps the pages, reused by the next step). A
        request retracted since the step was scheduled recomputes from scratch: nothing to undo."""
        spec_stats.observe_draft(num_drafts, num_accepted)
        if request.num_preemptions == info.spec_epoch.get(request.request_id):
            request.num_computed_tokens -= num_drafts - num_accepted

    def _finish(self, request: Request) -> None:
        """process_batch_result's release: cache what was computed, free the rest; a finished
        decoding request stays in SGLang's running batch until the next filter (a ghost)."""
        rid = request.request_id
        if request in self.running:
            self.running.remove(request)
            self.ghosts.append(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        if rid in self.kv_cache_manager.reqs:
            kv_len = min(request.num_computed_tokens, request.num_tokens - 1)
            self.kv_cache_manager.release(request, kv_len, insert=True)
        self._drop(request)

    def finish_requests(self, request_ids: str | Iterable[str], finished_status: RequestStatus =
                        RequestStatus.FINISHED_ABORTED, now_s: float | None = None) -> list[str]:
        """Finish requests from outside (a client went away: SGLang's abort_request). A waiting
        request leaves the queue; one holding KV (decoding, or the chunked prefill) caches what it
        computed in the radix tree and frees the rest, as a finished request does. A step already
        in flight drops its output. Returns the ids that were still unfinished."""
        self._set_now(now_s)
        done = []
        for rid in dict.fromkeys((request_ids,) if isinstance(request_ids, str) else request_ids):
            request = self.requests.get(rid)
            if request is None or request.is_finished():
                continue
            request.status = finished_status
            if request is self.chunked_req:
                self.chunked_req = None
            self._finish(request)
            done.append(rid)
        return done

    def _abort(self, request: Request) -> None:
        """Out of memory even alone (SGLang's graceful abort in retract_decode)."""
        request.status = RequestStatus.FINISHED_ABORTED
        if request in self.running:
            self.running.remove(request)
        self.kv_cache_manager.release(request, 0, insert=False)
        self._pending.append(RequestOutput(request.request_id, [], "abort", request.num_cached_tokens or 0,
                                           reject_reason="exceeds_kv_pool"))
        self._drop(request)

    def _drop(self, request: Request) -> None:
        self.finished_req_ids.add(request.request_id)
        self.entry_seq.pop(request.request_id, None)
        self.kv_cache_manager.forget(request.request_id)
        del self.requests[request.request_id]

    # --- state queries -----------------------------------------------------------------------------
    def get_num_unfinished_requests(self) -> int:
        return len(self.requests)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def get_request_counts(self) -> tuple[int, int]:
        """(running, waiting): running counts every request holding KV (incl. the chunked one)."""
        return len(self.requests) - len(self.waiting), len(self.waiting)

    def mark_grammar_ready(self, request_id: str) -> None:
        """SGLang's grammar queue is not modelled: the simulator refuses structured-output requests
        for this engine before any reaches here."""
        raise NotImplementedError("structured-output grammar waits are modelled for engine: vllm only")

    def next_event_s(self) -> float | None:
        """When a HiCache copy in flight ends (it may release a waiting request or KV); None
        otherwise: nothing else here changes by itself (only arrivals and outputs move it)."""
        return self.hicache.next_done_s() if self.hicache is not None else None

    def get_queue_lengths(self) -> tuple[int, int]:
        """(decoding batch, waiting queue): SGLang has no blocked queue."""
        return len(self.running), len(self.waiting)

    def get_num_free_blocks(self) -> int:
        return self.kv_cache_manager.num_free_pages()

    def cached_prefix_tokens(self, token_ids: Sequence[int], lora_id: int | None = None,
                             provenance: TokenProvenance | None = None) -> int:
        """Leading tokens the radix tree would match now: whole pages of the first
        len(token_ids) - 1 tokens (as _match_prefix limits a request's match); read-only. With
        page keys, the prompt's are a probe's (prefix_lookup.py: shared with every replica that
        keys pages alike)."""
        if not token_ids:
            return 0
        n = len(token_ids) - 1
        if self.block_hasher is None or self.page_keys_hash_algo is None:
            return self.kv_cache_manager.peek(token_ids[:n], lora_id)
        probe = shared_probe(self.block_hasher, self.page_size, self.page_keys_hash_algo, token_ids, len(token_ids),
                             lora_id, provenance)
        return self.kv_cache_manager.peek(probe.block_hashes[:n // self.page_size], lora_id)

    def cpu_cached_prefix_tokens(self, token_ids: Sequence[int], lora_id: int | None = None,
                                 provenance: TokenProvenance | None = None, num_gpu_cached_tokens: int = 0) -> int:
        """Host-tier tokens below the device match of the first len(token_ids) - 1 tokens, when
        load_back would load them (at least LOAD_BACK_THRESHOLD_TOKENS); read-only. The radix
        tree finds the device part itself, so num_gpu_cached_tokens is not needed."""
        if self.hicache is None or not token_ids:
            return 0
        n = self.kv_cache_manager.peek_host(token_ids[:len(token_ids) - 1], lora_id)
        return n if n >= LOAD_BACK_THRESHOLD_TOKENS else 0

    def make_stats(self, spec_stats: SpecDecodingStats | None = None) -> SchedulerStats:
        stats, self.prefix_cache_stats = self.prefix_cache_stats, PrefixCacheStats()
        running, waiting = self.get_request_counts()
        return SchedulerStats(running, waiting, self.kv_cache_manager.usage, stats, spec_stats,
                              hicache_stats=self.hicache.take_stats() if self.hicache is not None else None)

    def check_invariants(self) -> None:
        from servesim.scheduler.sglang.invariants import check_invariants

        check_invariants(self)
