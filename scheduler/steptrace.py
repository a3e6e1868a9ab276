"""Step traces in the vLLM oracle's schema, and the oracle's deterministic token rule.

`run_step_trace` drives a Scheduler exactly like the oracle's driver drives vLLM: the clock is the
step index, requests are added before the step they arrive at, and after each schedule() every
scheduled request whose tokens reach the end of its known tokens samples one token
(1000 + crc32(f"{req_id}:{k}") % 40000). The records it yields are field-for-field comparable to
the oracle's trace lines. `step_record` is shared with the simulator's --step-trace writer.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from scheduler.async_scheduler import make_scheduler
from scheduler.config import CacheConfig, SchedulerConfig
from scheduler.output import ModelRunnerOutput, SchedulerOutput
from scheduler.request import Request, SamplingParams


def oracle_token(req_id: str, k: int) -> int:
    """The k-th (0-based) output token of req_id: the one token source every executor uses."""
    return 1000 + zlib.crc32(f"{req_id}:{k}".encode()) % 40000


@dataclass(slots=True)
class StepTraceConfig:
    """The oracle driver's flags, with its defaults."""

    num_blocks: int = 1000
    block_size: int = 16
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    max_model_len: int = 2048
    long_prefill_token_threshold: int = 0
    policy: str = "fcfs"
    no_prefix_caching: bool = False
    no_chunked_prefill: bool = False
    async_scheduling: bool = False
    max_steps: int = 1_000_000

    def configs(self) -> tuple[SchedulerConfig, CacheConfig]:
        sc = SchedulerConfig(
            max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
            max_model_len=self.max_model_len, long_prefill_token_threshold=self.long_prefill_token_threshold,
            enable_chunked_prefill=not self.no_chunked_prefill, async_scheduling=self.async_scheduling,
            policy=self.policy,
        )
        cc = CacheConfig(block_size=self.block_size, num_gpu_blocks=self.num_blocks,
                         enable_prefix_caching=not self.no_prefix_caching)
        return sc, cc


def step_record(step: int, arrived: list[str], out: SchedulerOutput, sched) -> dict:
    """The part of a trace line known right after schedule() (oracle field order)."""
    cached = out.scheduled_cached_reqs
    kvm = sched.kv_cache_manager
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
        "num_waiting": len(sched.waiting) + len(sched.skipped_waiting),
        "num_running": len(sched.running),
        "num_free_blocks": kvm.block_pool.get_num_free_blocks(),
        "kv_usage": round(kvm.usage, 6),
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


def run_step_trace(workload: list[dict], cfg: StepTraceConfig) -> Iterator[dict]:
    """Yield one oracle-schema record per schedule() call (see module docstring)."""
    sc, cc = cfg.configs()
    sched = make_scheduler(sc, cc)
    pending = sorted(workload, key=lambda w: w["arrival_step"])  # stable: keeps file order on ties
    pos = 0
    n_out: dict[str, int] = {}
    in_flight: list[tuple[SchedulerOutput, dict, list[bool]]] = []
    depth = 2 if cfg.async_scheduling else 1
    step = 0

    def do_update() -> dict:
        out, rec, sample = in_flight.pop(0)
        req_ids = list(out.num_scheduled_tokens)
        sampled_lists: list[list[int]] = []
        for rid, do_sample in zip(req_ids, sample):
            if do_sample and rid in n_out:
                sampled_lists.append([oracle_token(rid, n_out[rid])])
                n_out[rid] += 1
            else:
                sampled_lists.append([])
        mro = ModelRunnerOutput(req_ids, {rid: i for i, rid in enumerate(req_ids)}, sampled_lists)
        eco = sched.update_from_output(out, mro)
        finished_now = [o.request_id for o in eco.outputs if o.finish_reason is not None]
        sampled = {rid: t[0] for rid, t in zip(req_ids, sampled_lists) if t}
        finish_record(rec, sampled, finished_now, eco.scheduler_stats)
        return rec

    while step < cfg.max_steps:
        arrived = []
        while pos < len(pending) and pending[pos]["arrival_step"] <= step:
            w = pending[pos]
            pos += 1
            sp = SamplingParams(max_tokens=int(w["max_tokens"]), ignore_eos=True)
            sched.add_request(Request(w["req_id"], list(w["prompt_token_ids"]), sp,
                                      arrival_time=float(w["arrival_step"]), priority=int(w.get("priority", 0)),
                                      block_hasher=sched.block_hasher))
            n_out[w["req_id"]] = 0
            arrived.append(w["req_id"])
        if not sched.has_unfinished_requests() and not in_flight:
            if pos >= len(pending):
                break
            step += 1  # idle: nothing has arrived yet
            continue
        out = sched.schedule()
        # Decide sampling now: a later schedule() (async) may overwrite is_prefill_chunk.
        sample = [not sched.requests[rid].is_prefill_chunk for rid in out.num_scheduled_tokens]
        in_flight.append((out, step_record(step, arrived, out, sched), sample))
        while in_flight and (len(in_flight) >= depth or out.total_num_scheduled_tokens == 0):
            yield do_update()
        step += 1
    while in_flight:
        yield do_update()
