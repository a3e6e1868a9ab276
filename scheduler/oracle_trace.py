"""Step traces in the vLLM oracle's schema, and the oracle's deterministic token rule.

`run_step_trace` drives a Scheduler exactly like the oracle's driver drives vLLM: the clock is the
step index, requests are added before the step they arrive at, and after each schedule() every
scheduled request whose tokens reach the end of its known tokens samples (one token,
1000 + crc32(f"{req_id}:{k}") % 40000, or more with speculative decoding). `StepTraceConfig` takes
every flag of the oracle's drive.py (same names and defaults); the opt-in extensions (speculative
decoding, stop rules, aborts, sliding window / hybrid groups, LoRA, cache salt, KV connector, block
tables, the OffloadingConnector's CPU tier of tools/offload_oracle.py) use the oracle's fake worker and connector rules (scheduler/oracle_model.py) and add the
oracle's extra trace fields, in its order. The records are field-for-field comparable to the
oracle's trace lines (docs/PARITY.md). `step_record` is shared with the simulator's --step-trace
writer.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from servesim.scheduler.async_scheduler import make_scheduler
from servesim.scheduler.blocked_replay import BlockedReplay, request_kwargs
from servesim.scheduler.config import CacheConfig, SchedulerConfig, max_concurrent_batches
from servesim.scheduler.interface import SchedulerInterface
from servesim.scheduler.kv.kinds import group_specs_from_text
from servesim.scheduler.kv.single_type import KVCacheGroupSpec
from servesim.scheduler.kv_offload.config import OffloadConfig
from servesim.scheduler.kv_offload.replay import OffloadReplay
from servesim.scheduler.multimodal import MultiModalFeatureSpec
from servesim.scheduler.output import KVConnectorOutput, ModelRunnerOutput, SchedulerOutput
from servesim.scheduler.oracle_model import EOS_TOKEN_ID, OracleConnector, OracleModel
from servesim.scheduler.policies.base import DEFAULT_POLICY
from servesim.scheduler.request import Request, RequestStatus, SamplingParams


def oracle_token(req_id: str, k: int) -> int:
    """The k-th (0-based) output token of req_id: the one token source every executor uses."""
    return 1000 + zlib.crc32(f"{req_id}:{k}".encode()) % 40000


@dataclass(slots=True)
class StepTraceConfig:
    """The oracle driver's flags (same names, same defaults); see its README for each one."""

    num_blocks: int = 1000
    block_size: int = 16
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    max_model_len: int = 2048
    long_prefill_token_threshold: int = 0
    policy: str = DEFAULT_POLICY
    no_prefix_caching: bool = False
    no_chunked_prefill: bool = False
    async_scheduling: bool = False
    # vLLM's --pipeline-parallel-size: only the batch queue's depth changes (max_concurrent_batches).
    # The oracle driver has no flag for it; tools/record_golden.py runs it with this many stages.
    pipeline_parallel_size: int = 1
    max_steps: int = 1_000_000
    hash_algo: str = "sha256"
    # Opt-in extensions (all off by default, as the oracle's).
    num_spec_tokens: int = 0
    spec_method: str = "ngram"
    eos_rate: float = 0.0
    stop_token_ids: tuple[int, ...] = ()
    stop_rate: float = 0.0
    min_tokens: int = 0  # workload-side only: switches the stop-rule trace fields on
    abort_rate: float = 0.0  # workload-side only: switches the abort trace fields on
    abort_window: int = 200
    abort_after: int = 0
    abort_preempted_rate: float = 0.0  # workload-side only: switches the abort trace fields on
    sliding_window: int = 0
    hybrid: bool = False
    num_loras: int = 0
    max_loras: int = 1
    cache_salt: int = 0
    kv_connector_rate: float = 0.0  # > 0: the decode-side fake connector is on
    kv_load_steps: int = 3
    trace_block_tables: bool = False
    # OffloadingConnector (tools/offload_oracle.py): a CPU tier of this many offload blocks (0: off).
    offload_cpu_blocks: int = 0
    offload_block_size: int = 0  # tokens; 0: the GPU block size
    offload_eviction_policy: str = "lru"
    offload_store_threshold: int = 0  # the extra config's store_threshold (>= 2: store blocks seen that often)
    offload_load_steps: int = 2  # a load completes this many executions after the one starting it
    offload_store_steps: int = 2  # a store, after the one preparing it
    # KV cache groups of any kinds (tools/kv_groups_oracle.py): e.g. "full,mamba", "full,chunked_local:64"
    # ("" : the layout of sliding_window / hybrid above), and vLLM's --mamba-cache-mode.
    groups: str = ""
    mamba_cache_mode: str = "none"
    # Blocked waits (tools/blocked_oracle.py; workload-side draws, switching its trace fields on).
    grammar_rate: float = 0.0
    grammar_max_steps: int = 6
    streaming_rate: float = 0.0
    stream_gap: int = 30
    # Multimodal requests (tools/encoder_oracle.py): the encoder budget and cache the oracle sets on its
    # scheduler (0: off; the workload's `mm_items` then must be empty), and vLLM's disable_chunked_mm_input.
    encoder_budget: int = 0
    encoder_cache_size: int = 0
    disable_chunked_mm_input: bool = False
    # An encoder-decoder model (tools/encoder_oracle.py --encoder-decoder): groups full + cross_attention,
    # one encoder input per request (mm_items with in_prompt false).
    encoder_decoder: bool = False

    def __post_init__(self) -> None:
        self.stop_token_ids = tuple(self.stop_token_ids)
        if self.hybrid and self.sliding_window <= 0:
            raise ValueError("hybrid needs sliding_window > 0")
        if self.num_loras > 0 and self.max_loras < 1:
            raise ValueError("max_loras must be >= 1")
        if self.kv_connector_rate > 0 and self.hybrid:
            raise ValueError("the KV connector supports one KV cache group (not hybrid)")
        if self.kv_load_steps < 1:
            raise ValueError("kv_load_steps must be >= 1")
        if self.offload_cpu_blocks > 0 and (self.kv_connector_rate > 0 or self.hybrid):
            raise ValueError("the offload oracle runs alone, with one KV cache group (no P/D connector, not hybrid)")
        if self.offload_load_steps < 0 or self.offload_store_steps < 1:
            raise ValueError("offload_load_steps must be >= 0 and offload_store_steps >= 1")
        if (self.encoder_budget > 0) != (self.encoder_cache_size > 0):
            raise ValueError("encoder_budget and encoder_cache_size are set together (both > 0) or not at all")
        if self.pipeline_parallel_size < 1:
            raise ValueError("pipeline_parallel_size must be >= 1")
        if self.groups and (self.sliding_window or self.hybrid):
            raise ValueError("give a sliding window as a group (groups='full,sliding_window:W'), not with groups")
        if self.groups and (self.kv_connector_rate > 0 or self.offload_cpu_blocks > 0):
            raise ValueError("groups run without a KV connector (the oracle's connectors take one full-attention group)")
        if self.encoder_decoder and (self.groups or self.encoder_budget <= 0):
            raise ValueError("encoder_decoder sets its own groups (full, cross_attention) and needs encoder_budget > 0")
        if self.async_scheduling and self.num_spec_tokens > 0 and self.spec_method == "ngram":
            raise ValueError("vLLM refuses async scheduling with ngram speculation")

    @property
    def stop_rules(self) -> bool:
        return self.eos_rate > 0 or bool(self.stop_token_ids) or self.min_tokens > 0

    @property
    def aborts(self) -> bool:
        return self.abort_rate > 0 or self.abort_preempted_rate > 0

    def configs(self) -> tuple[SchedulerConfig, CacheConfig]:
        sc = SchedulerConfig(
            max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
            max_model_len=self.max_model_len, long_prefill_token_threshold=self.long_prefill_token_threshold,
            enable_chunked_prefill=not self.no_chunked_prefill, async_scheduling=self.async_scheduling,
            policy=self.policy, num_spec_tokens=self.num_spec_tokens, spec_method=self.spec_method,
            max_loras=self.max_loras if self.num_loras > 0 else None,
            disable_chunked_mm_input=self.disable_chunked_mm_input,
        )
        if self.encoder_budget > 0:
            # The oracle sets the budget and cache on its scheduler directly; a largest item of 1
            # leaves both exactly as set (compute_mm_encoder_budget takes the max).
            sc.mm_max_tokens_per_item = 1
            sc.max_num_encoder_input_tokens = self.encoder_budget
            sc.encoder_cache_size = self.encoder_cache_size
        attention = "full"
        if self.sliding_window > 0:
            attention = "hybrid" if self.hybrid else "sliding_window"
        groups: tuple[KVCacheGroupSpec, ...] = ()
        if self.groups or self.encoder_decoder:
            attention = "groups"
            text = "full,cross_attention" if self.encoder_decoder else self.groups
            groups = group_specs_from_text(text, self.block_size, self.mamba_cache_mode, self.num_spec_tokens)
        cc = CacheConfig(block_size=self.block_size, num_gpu_blocks=self.num_blocks,
                         enable_prefix_caching=not self.no_prefix_caching, hash_algo=self.hash_algo,
                         attention=attention, sliding_window=self.sliding_window or None,
                         kv_cache_groups=groups, mamba_cache_mode=self.mamba_cache_mode)
        return sc, cc

    def offload_config(self) -> OffloadConfig | None:
        """The CPU tier's settings (validated: OffloadConfig's refusals), None when offload is off."""
        if self.offload_cpu_blocks <= 0:
            return None
        cfg = OffloadConfig(num_cpu_blocks=self.offload_cpu_blocks, block_size=self.offload_block_size or None,
                            eviction_policy=self.offload_eviction_policy,
                            store_threshold=self.offload_store_threshold)
        cfg.block_size_factor(self.block_size)
        if self.no_prefix_caching:
            raise ValueError("offload needs prefix caching on (offload blocks are named by prefix-cache block hashes)")
        return cfg

    def model(self) -> OracleModel:
        return OracleModel(eos_rate=self.eos_rate, stop_token_ids=self.stop_token_ids, stop_rate=self.stop_rate,
                           num_spec_tokens=self.num_spec_tokens, spec_method=self.spec_method,
                           max_model_len=self.max_model_len)


def step_record(step: int, arrived: list[str], out: SchedulerOutput, sched: SchedulerInterface) -> dict:
    """The part of a trace line known right after schedule() (oracle field order); any scheduler."""
    cached = out.scheduled_cached_reqs
    num_running, num_waiting = sched.get_queue_lengths()
    return {
        "step": step,
        "arrived": arrived,
        "new": [
            {"req_id": n.req_id, "num_computed_tokens": n.num_computed_tokens,
             "prompt_len": len(n.prompt_token_ids), "block_ids": [list(g) for g in n.block_ids]}
            for n in out.scheduled_new_reqs
        ],
        "cached": [
            {"req_id": rid, "resumed": rid in cached.resumed_req_ids,
             "num_computed_tokens": cached.num_computed_tokens[i],
             "num_output_tokens": cached.num_output_tokens[i],
             "new_block_ids": None if cached.new_block_ids[i] is None else [list(g) for g in cached.new_block_ids[i]]}
            for i, rid in enumerate(cached.req_ids)
        ],
        "num_scheduled_tokens": dict(out.num_scheduled_tokens),
        "total_num_scheduled_tokens": out.total_num_scheduled_tokens,
        "num_common_prefix_blocks": list(out.num_common_prefix_blocks),
        "preempted": sorted(out.preempted_req_ids),
        "finished_req_ids": sorted(out.finished_req_ids),
        "num_waiting": num_waiting,
        "num_running": num_running,
        "num_free_blocks": sched.get_num_free_blocks(),
        "kv_usage": round(sched.kv_cache_manager.usage, 6),
    }


def finish_record(rec: dict, sampled: dict[str, int], finished_now: list[str], stats) -> None:
    """Complete a trace line with what update_from_output() produced."""
    ps = stats.prefix_cache_stats
    rec["sampled_token_ids"] = sampled
    rec["finished_after_update"] = finished_now
    rec["prefix_cache_stats"] = {
        "requests": ps.requests, "queries": ps.queries, "hits": ps.hits,
        "preempted_requests": ps.preempted_requests, "preempted_queries": ps.preempted_queries,
        "preempted_hits": ps.preempted_hits,
    }


def make_oracle_request(w: dict, sched) -> Request:
    """A workload line as the oracle driver builds it (absent fields: ignore_eos, no stop ids,
    min_tokens 0, no LoRA, no salt). EOS is the model's (id 2); ignore_eos switches it off."""
    sp = SamplingParams(max_tokens=int(w["max_tokens"]), min_tokens=int(w.get("min_tokens", 0)),
                        ignore_eos=bool(w.get("ignore_eos", True)), eos_token_id=EOS_TOKEN_ID,
                        stop_token_ids=tuple(w.get("stop_token_ids") or ()))
    return Request(w["req_id"], list(w["prompt_token_ids"]), sp, arrival_time=float(w["arrival_step"]),
                   priority=int(w.get("priority", 0)), lora_id=w.get("lora_id") or None,
                   cache_salt=w.get("cache_salt") or None, block_hasher=sched.block_hasher,
                   **request_kwargs(w),
                   mm_features=[MultiModalFeatureSpec(it["offset"], it["length"], it["mm_hash"],
                                                      it.get("modality", "image"), it.get("in_prompt", True))
                                for it in w.get("mm_items", ())])


class _InFlight:
    """One scheduled step waiting for its update: the output, its trace line, who samples."""

    __slots__ = ("out", "rec", "sample", "tail")

    def __init__(self, out: SchedulerOutput, rec: dict, sample: list[bool], tail: dict | None = None) -> None:
        self.out, self.rec, self.sample = out, rec, sample
        self.tail = tail  # fields known at schedule() that the oracle writes after the update's


class OracleDriver:
    """Plays the oracle's engine loop and fake worker around one of our schedulers (drive.py's
    order: arrivals, between-step aborts, schedule(), in-flight aborts, then update_from_output
    -- right away, or one step later under async scheduling -- and the drafter)."""

    def __init__(self, workload: list[dict], cfg: StepTraceConfig) -> None:
        sc, cc = cfg.configs()
        self.cfg = cfg
        self.sched = make_scheduler(sc, cc)
        self.model = cfg.model()
        self.spec = cfg.num_spec_tokens > 0
        self.connector: OracleConnector | None = None
        if cfg.kv_connector_rate > 0:
            self.connector = OracleConnector({w["req_id"] for w in workload if w.get("remote_prefill")})
            self.sched.connector = self.connector
        self.offload: OffloadReplay | None = None
        offload = cfg.offload_config()
        if offload is not None:
            self.offload = OffloadReplay(self.sched, offload, cfg.offload_load_steps, cfg.offload_store_steps)
        self.pending = sorted(workload, key=lambda w: w["arrival_step"])  # stable on ties
        self.prompt_len = {w["req_id"]: len(w["prompt_token_ids"]) for w in workload}
        self.lora_of = {w["req_id"]: w.get("lora_id") for w in workload}
        # step -> phase -> ids, in workload order (one finish_requests call per step and phase)
        self.aborts: dict[int, dict[str, list[str]]] = {}
        for w in workload:
            if "abort_step" in w:
                self.aborts.setdefault(w["abort_step"], {}).setdefault(w["abort_phase"], []).append(w["req_id"])
        self.abort_on_preempt = {w["req_id"]: w["abort_on_preempt"] for w in workload if "abort_on_preempt" in w}
        self.n_out: dict[str, int] = {}
        self.worker_drafts: dict[str, list[int]] = {}  # the drafter's latest proposal per request
        self.last_batch: set[str] = set()  # requests of the last executed step
        self.pending_aborted: dict[str, str] = {}
        self.kv_done_at: dict[int, list[str]] = {}  # step -> loads reported with that step's output
        self.in_flight: list[_InFlight] = []
        self.blocked: BlockedReplay | None = None
        if cfg.grammar_rate > 0 or cfg.streaming_rate > 0:
            self.blocked = BlockedReplay(cfg.grammar_rate > 0, cfg.streaming_rate > 0, cfg.async_scheduling)

    def abort(self, req_ids: list[str]) -> dict[str, str]:
        """finish_requests(ids, FINISHED_ABORTED); {id: status before} of those it finished."""
        sched = self.sched
        before = {rid: sched.requests[rid].status.name for rid in req_ids
                  if rid in sched.requests and not sched.requests[rid].is_finished()}
        done = set(sched.finish_requests(req_ids, RequestStatus.FINISHED_ABORTED))
        return {rid: before[rid] for rid in req_ids if rid in done}

    def run(self) -> Iterator[dict]:
        cfg, sched = self.cfg, self.sched
        depth = max_concurrent_batches(cfg.pipeline_parallel_size, cfg.async_scheduling)
        pos, step = 0, 0
        while step < cfg.max_steps:
            arrived = []
            while pos < len(self.pending) and self.pending[pos]["arrival_step"] <= step:
                w = self.pending[pos]
                pos += 1
                if self.blocked is not None:
                    self.blocked.add(sched, w, make_oracle_request(w, sched), step)
                else:
                    sched.add_request(make_oracle_request(w, sched))
                self.n_out[w["req_id"]] = 0
                arrived.append(w["req_id"])
            step_aborts = self.aborts.get(step, {})
            if "before_schedule" in step_aborts:
                self.pending_aborted.update(self.abort(step_aborts["before_schedule"]))
            if not sched.has_unfinished_requests() and not self.in_flight:
                if pos >= len(self.pending):
                    break
                step += 1  # idle: nothing has arrived yet
                continue
            if self.blocked is not None:
                self.blocked.before_schedule(sched, step)
            out = sched.schedule()
            # Decide sampling now: a later schedule() (async) may overwrite is_prefill_chunk.
            sample = [not sched.requests[rid].is_prefill_chunk for rid in out.num_scheduled_tokens]
            rec = step_record(step, arrived, out, sched)
            # The blocked-waits and encoder oracles record their fields right after schedule(), before
            # in-flight aborts (an encoder-decoder abort gives encoder slots back).
            blocked = {} if self.blocked is None else self.blocked.fields(sched, out)
            encoder = self._encoder_fields(out) or {}
            self._extend_schedule_record(rec, out, step, step_aborts)
            self.in_flight.append(_InFlight(out, rec, sample, {**blocked, **encoder}))
            while self.in_flight and (len(self.in_flight) >= depth or out.total_num_scheduled_tokens == 0):
                yield self._update()
            step += 1
        while self.in_flight:
            yield self._update()

    def _extend_schedule_record(self, rec: dict, out: SchedulerOutput, step: int, step_aborts: dict) -> None:
        cfg, sched = self.cfg, self.sched
        if self.spec:
            rec["spec_token_ids"] = {rid: list(ids) for rid, ids in out.scheduled_spec_decode_tokens.items()}
        if cfg.aborts:
            rec["aborted"] = dict(self.pending_aborted)
            self.pending_aborted.clear()
        if cfg.num_loras > 0:
            rec["loras"] = sorted({self.lora_of[rid] for rid in out.num_scheduled_tokens if self.lora_of.get(rid)})
        if self.connector is not None:
            started = self.connector.take_started_loads()
            rec["kv_loads_started"] = started
            self.kv_done_at.setdefault(step + cfg.kv_load_steps, []).extend(started)
        if cfg.trace_block_tables:
            kvm = sched.kv_cache_manager
            rec["block_tables"] = {r.request_id: [list(g) for g in kvm.get_block_ids(r.request_id)]
                                   for r in sched.running}
        in_flight_aborts = list(step_aborts.get("before_update", ()))
        for rid in sorted(out.preempted_req_ids):  # clients that give up once preempted
            phase = self.abort_on_preempt.pop(rid, None)
            if phase == "before_update":
                in_flight_aborts.append(rid)
            elif phase == "before_schedule":
                self.aborts.setdefault(step + 1, {}).setdefault("before_schedule", []).append(rid)
        if cfg.aborts:
            rec["aborted_in_flight"] = self.abort(in_flight_aborts) if in_flight_aborts else {}

    def _encoder_fields(self, out: SchedulerOutput) -> dict | None:
        """tools/encoder_oracle.py's fields (it appends them to drive.py's finished line)."""
        if self.cfg.encoder_budget <= 0:
            return None
        ecm = self.sched.encoder_cache_manager
        return {"scheduled_encoder_inputs": {rid: list(ids) for rid, ids in out.scheduled_encoder_inputs.items()},
                "free_encoder_mm_hashes": list(out.free_encoder_mm_hashes),
                "encoder_num_free_slots": ecm.num_free_slots, "encoder_num_freeable_slots": ecm.num_freeable_slots}

    def _sample(self, item: _InFlight) -> tuple[list[list[int]], dict[str, int]]:
        """The fake worker's sampled tokens per scheduled request, and accepted drafts."""
        out, model = item.out, self.model
        sampled: list[list[int]] = []
        num_accepted: dict[str, int] = {}
        for rid, do_sample in zip(out.num_scheduled_tokens, item.sample):
            if not (do_sample and rid in self.n_out):
                sampled.append([])  # partial prefill chunk: the token is discarded
                continue
            scheduled = out.scheduled_spec_decode_tokens.get(rid)
            if scheduled:
                n = len(scheduled)
                if not self.cfg.async_scheduling:
                    drafts = list(scheduled)
                elif rid in self.last_batch:
                    drafts = self.worker_drafts[rid][:n]  # the worker's own previous proposal
                else:
                    drafts = [-1] * n  # placeholders the worker could not fill: never accepted
                toks = model.verify(rid, self.n_out[rid], drafts)
                num_accepted[rid] = len(toks) - 1
            else:
                toks = [model.token(rid, self.n_out[rid])]
            sampled.append(toks)
            self.n_out[rid] += len(toks)
        return sampled, num_accepted

    def _update(self) -> dict:
        item = self.in_flight.pop(0)
        out, rec, cfg, sched = item.out, item.rec, self.cfg, self.sched
        req_ids = list(out.num_scheduled_tokens)
        sampled, num_accepted = self._sample(item)
        sampled_all = {rid: list(t) for rid, t in zip(req_ids, sampled) if t}
        kv_done = [rid for due in sorted(k for k in self.kv_done_at if k <= rec["step"])
                   for rid in self.kv_done_at.pop(due)]
        kv_output = KVConnectorOutput(finished_recving=tuple(kv_done)) if kv_done else None
        offload_fields = None
        if self.offload is not None:
            kv_output, offload_fields = self.offload.execute(out)
        mro = ModelRunnerOutput(req_ids, {rid: i for i, rid in enumerate(req_ids)}, sampled,
                                kv_connector_output=kv_output)
        eco = sched.update_from_output(out, mro)
        if self.spec and out.total_num_scheduled_tokens > 0:
            self._draft(req_ids, sampled)
        finished = [o for o in eco.outputs if o.finish_reason is not None]
        finish_record(rec, {rid: t[0] for rid, t in sampled_all.items()}, [o.request_id for o in finished],
                      eco.scheduler_stats)
        if self.spec:
            sd = eco.scheduler_stats.spec_decoding_stats
            rec["sampled_tokens_all"] = sampled_all
            rec["num_accepted"] = num_accepted
            rec["spec_decoding_stats"] = None if sd is None else {
                "num_drafts": sd.num_drafts, "num_draft_tokens": sd.num_draft_tokens,
                "num_accepted_tokens": sd.num_accepted_tokens,
                "num_accepted_tokens_per_pos": list(sd.num_accepted_tokens_per_pos)}
        if self.spec or cfg.stop_rules:
            rec["new_token_ids"] = {o.request_id: list(o.new_token_ids) for o in eco.outputs if o.new_token_ids}
        if self.connector is not None:
            rec["kv_loads_finished"] = sorted(kv_done)
        if cfg.stop_rules or cfg.aborts:
            rec["finish_reasons"] = {o.request_id: o.finish_reason for o in finished}
            rec["stop_reasons"] = {o.request_id: o.stop_reason for o in finished}
        if offload_fields is not None:
            rec.update(offload_fields)
            ps = eco.scheduler_stats.connector_prefix_cache_stats
            rec["offload_prefix_cache_stats"] = {
                "requests": ps.requests, "queries": ps.queries, "hits": ps.hits,
                "preempted_requests": ps.preempted_requests, "preempted_queries": ps.preempted_queries,
                "preempted_hits": ps.preempted_hits}
        if item.tail is not None:
            rec.update(item.tail)
        return rec

    def _draft(self, req_ids: list[str], sampled: list[list[int]]) -> None:
        """The drafter runs after the step; in sync mode EngineCore hands the drafts over."""
        self.last_batch = {rid for rid, toks in zip(req_ids, sampled) if toks}
        for rid, toks in zip(req_ids, sampled):
            n = self.n_out[rid]
            self.worker_drafts[rid] = self.model.propose(rid, n, self.prompt_len[rid] + n, sampled=bool(toks))
        if not self.cfg.async_scheduling:
            self.sched.update_draft_token_ids({rid: list(self.worker_drafts[rid]) for rid in req_ids})


def run_step_trace(workload: list[dict], cfg: StepTraceConfig) -> Iterator[dict]:
    """Yield one oracle-schema record per schedule() call (see module docstring)."""
    return OracleDriver(workload, cfg).run()
