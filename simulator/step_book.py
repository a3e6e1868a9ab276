"""The engine's book of steps: each step's row and step-trace record, token times, finishes,
prefix-cache totals and the progress callback.

The engine (simulator/engine.py) writes a step here when it schedules it (`record_schedule`) and
when its output is applied (`record_update`, `record_finish`); the fast path
(simulator/fastpath/) writes the rows, token times and finishes of a whole run at once through the
same objects (`metrics.steps.extend_decode_run`, `metrics.on_decode_run`), exactly as stepping would
have written them one by one.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import IO

from servesim.scheduler.interface import SchedulerInterface
from servesim.scheduler.kv.manager import PrefixCacheStats
from servesim.scheduler.oracle_trace import finish_record, step_record
from servesim.scheduler.output import EngineCoreOutputs, ModelRunnerOutput, SchedulerOutput
from servesim.scheduler.encoder_cache import EncoderCacheStats
from servesim.scheduler.sglang.hicache import HiCacheStats
from servesim.simulator.metrics import MetricsCollector

PROGRESS_EVERY_STEPS = 256  # the progress callback runs at every update whose step count is a multiple


class StepBook:
    def __init__(self, metrics: MetricsCollector, step_trace: IO[str] | None,
                 progress: Callable[[float, int], None] | None) -> None:
        self.metrics = metrics
        self.step_trace = step_trace  # JSONL in the vLLM oracle's schema, one record per step (or None)
        self.progress = progress  # (simulated s, requests done) -> None
        self.num_steps = 0  # steps scheduled so far
        self.num_preemptions = 0
        self.prefix_hits = 0  # tokens, requests never preempted (vLLM's hit-rate definition)
        self.prefix_queries = 0
        self.hicache: HiCacheStats | None = None  # SGLang HiCache totals (None: no host tier)
        # SGLang HiCache per step with any copy or host hit: (update time s, host hit tokens, bytes
        # loaded, bytes written); the time series bins them by second (outputs.py).
        self.hicache_rows: list[tuple[float, int, int, int]] = []
        # A KV connector's lookups (vLLM's connector_prefix_cache_stats) summed: tokens the GPU prefix
        # cache lacked at admission, those the connector supplied (preempted requests apart), and the
        # steps with any hit: (update s, hit tokens, preempted requests' included).
        self.connector_stats = PrefixCacheStats()
        # Multimodal: encoder-cache lookups summed over the run, in embeddings (None: none happened).
        self.encoder_cache: EncoderCacheStats | None = None
        self.connector_hit_rows: list[tuple[float, int]] = []
        self.num_done = 0  # requests finished, rejected or given up
        self.arrived_since_step: list[str] = []  # request ids added since the last schedule (step trace)

    def record_schedule(self, so: SchedulerOutput, now: float, sched: SchedulerInterface) -> tuple[dict | None, int]:
        """Bookkeeping of a step just scheduled: (its step-trace record or None, its steps row)."""
        m = self.metrics.requests
        for nr in so.scheduled_new_reqs:
            if m[nr.req_id].first_scheduled_s is None:
                m[nr.req_id].first_scheduled_s = now
        for rid in so.preempted_req_ids:
            m[rid].num_preemptions += 1
        self.num_preemptions += len(so.preempted_req_ids)
        rec = None
        if self.step_trace is not None:
            rec = step_record(self.num_steps, self.arrived_since_step, so, sched)
        self.arrived_since_step = []
        # A step's decode tokens: one token (and its drafts) of a cached request past its prompt
        # that was not just resumed; every other scheduled token is a prefill token.
        num_new, spec, cached = so.num_scheduled_tokens, so.scheduled_spec_decode_tokens, so.scheduled_cached_reqs
        requests, resumed = sched.requests, cached.resumed_req_ids
        shape_decode = 0
        for rid, computed in zip(cached.req_ids, cached.num_computed_tokens):
            if rid not in resumed and computed >= requests[rid].num_prompt_tokens:
                n = num_new[rid]
                if n - (len(spec.get(rid, ())) if spec else 0) == 1:
                    shape_decode += n
        shape_prefill = sum(n for n in num_new.values()) - shape_decode  # (a generator: a compiled loop)
        running, waiting = sched.get_request_counts()
        row = self.metrics.steps.append(self.num_steps, now, len(so.num_scheduled_tokens), shape_prefill,
                                        shape_decode, sched.kv_cache_manager.usage, running, waiting,
                                        len(so.preempted_req_ids))
        self.num_steps += 1
        return rec, row

    def record_update(self, row: int, now: float, mro: ModelRunnerOutput, eco: EngineCoreOutputs,
                      rec: dict | None) -> None:
        """A step's output applied at `now` (its token times and finishes already recorded): its
        prefix-cache stats, its row's update time, its step-trace record, the progress callback."""
        ps = eco.scheduler_stats.prefix_cache_stats
        self.prefix_hits += ps.hits
        self.prefix_queries += ps.queries
        hs = eco.scheduler_stats.hicache_stats
        if hs is not None:
            if self.hicache is None:
                self.hicache = HiCacheStats()
            self.hicache.add(hs)
            if hs.host_hit_tokens or hs.load_bytes or hs.write_bytes:
                self.hicache_rows.append((now, hs.host_hit_tokens, hs.load_bytes, hs.write_bytes))
        es = eco.scheduler_stats.encoder_cache_stats
        if es is not None:
            if self.encoder_cache is None:
                self.encoder_cache = EncoderCacheStats()
            self.encoder_cache.merge(es)
        cs = eco.scheduler_stats.connector_prefix_cache_stats
        if cs is not None:
            total = self.connector_stats
            total.requests += cs.requests
            total.queries += cs.queries
            total.hits += cs.hits
            total.preempted_requests += cs.preempted_requests
            total.preempted_queries += cs.preempted_queries
            total.preempted_hits += cs.preempted_hits
            if cs.hits or cs.preempted_hits:
                self.connector_hit_rows.append((now, cs.hits + cs.preempted_hits))
        self.metrics.steps.set_update(row, now, ps.hits, ps.queries)  # duration: schedule to output applied
        if rec is not None:
            assert self.step_trace is not None
            sampled = {rid: t[0] for rid, t in zip(mro.req_ids, mro.sampled_token_ids) if t}
            finish_record(rec, sampled, [o.request_id for o in eco.outputs if o.finish_reason is not None],
                          eco.scheduler_stats)
            self.step_trace.write(json.dumps(rec) + "\n")
        if self.progress is not None and self.num_steps % PROGRESS_EVERY_STEPS == 0:
            self.progress(now, self.num_done)

    def record_finish(self, request_id: str, now: float, reason: str | None, num_cached: int) -> None:
        self.metrics.on_finish(request_id, now, reason, num_cached)
        self.num_done += 1

    def record_reject(self, request_id: str, reason: str) -> None:
        self.metrics.on_reject(request_id, reason)
        self.num_done += 1

    def record_stranded(self, request_id: str, reason: str, detail: str) -> None:
        """The engine aborted a request the scheduler could never admit (RequestEnds.abort_stranded);
        one warning line names it, as rejections are never silent."""
        self.metrics.on_stranded(request_id, reason)
        self.num_done += 1
        logging.getLogger("servesim").warning(
            "WARNING: request %s aborted (%s): it can never be admitted: %s. vLLM 0.19.1 waits on it forever, "
            "blocking the requests behind it; liveness.stranded_requests=wait keeps that (docs/LIVENESS.md)",
            request_id, reason, detail)

    def record_gone(self, request_id: str) -> None:
        """A client gave up (its deadline passed): the request is done for the run."""
        self.metrics.on_timeout(request_id)
        self.num_done += 1
