"""Builders shared by the scheduler tests (requests and model outputs made by hand, like vLLM's)."""

from __future__ import annotations

import zlib

from servesim.scheduler import (
    CacheConfig, ModelRunnerOutput, Request, SamplingParams, Scheduler, SchedulerConfig,
    make_block_hasher, make_scheduler,
)


def make_sched(num_blocks: int = 100, block_size: int = 4, max_num_seqs: int = 16,
               max_num_batched_tokens: int = 64, max_model_len: int = 256, **kw) -> Scheduler:
    cache_kw = {k: kw.pop(k) for k in list(kw) if k in ("enable_prefix_caching", "sliding_window", "attention",
                                                       "enable_kv_cache_events", "hash_algo")}
    sc = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                         max_model_len=max_model_len, **kw)
    cc = CacheConfig(block_size=block_size, num_gpu_blocks=num_blocks, **cache_kw)
    return make_scheduler(sc, cc)


def req(sched: Scheduler, rid: str, tokens: list[int] | int, max_tokens: int = 8, **kw) -> Request:
    if isinstance(tokens, int):
        # Distinct content per request id, so no accidental prefix sharing.
        base = 1000 + zlib.crc32(rid.encode()) % 50_000 * 10
        tokens = [base + i for i in range(tokens)]
    sp_kw = {k: kw.pop(k) for k in list(kw) if k in ("min_tokens", "ignore_eos", "eos_token_id", "stop_token_ids")}
    sp = SamplingParams(max_tokens=max_tokens, **sp_kw)
    hasher = sched.block_hasher or make_block_hasher(sched.block_size)
    return Request(rid, tokens, sp, block_hasher=hasher, **kw)


def output_for(out, tokens: dict[str, list[int]] | None = None, default: int = 7) -> ModelRunnerOutput:
    """One sampled token per request that finished its known tokens (partial chunks sample none)."""
    ids = list(out.num_scheduled_tokens)
    sampled = []
    for rid in ids:
        if tokens is not None and rid in tokens:
            sampled.append(list(tokens[rid]))
        else:
            sampled.append([default])
    return ModelRunnerOutput(ids, {r: i for i, r in enumerate(ids)}, sampled)


def step(sched: Scheduler, tokens: dict[str, list[int]] | None = None, default: int = 7):
    """schedule + update, sampling only for requests that are not partial prefill chunks."""
    out = sched.schedule()
    ids = list(out.num_scheduled_tokens)
    sampled = []
    for rid in ids:
        r = sched.requests[rid]
        if r.is_prefill_chunk:
            sampled.append([])
        elif tokens is not None and rid in tokens:
            sampled.append(list(tokens[rid]))
        else:
            sampled.append([default])
    eco = sched.update_from_output(out, ModelRunnerOutput(ids, {r: i for i, r in enumerate(ids)}, sampled))
    sched.check_invariants()
    return out, eco


def decode_output(req_ids: list[str], token_ids: list[int]) -> ModelRunnerOutput:
    """The output of one plain decode step: request i sampled token_ids[i] (a run's last step,
    left in flight, as SimExecutor.decode_step_output builds it)."""
    return ModelRunnerOutput(req_ids, {r: i for i, r in enumerate(req_ids)}, [[t] for t in token_ids])


def apply_due(sched, in_flight: list, depth: int, scheduled_nothing: bool) -> None:
    """The engine loop's updates after a schedule: the oldest in-flight (SchedulerOutput,
    ModelRunnerOutput) pairs are applied while depth are in flight (1: sync; 2: async or
    overlap), or all of them when the schedule scheduled nothing; then the invariants."""
    while in_flight and (len(in_flight) >= depth or scheduled_nothing):
        old, mro = in_flight.pop(0)
        sched.update_from_output(old, mro)
    sched.check_invariants()


def runs_of(sched):
    """The scheduler's bulk decode path (scheduler/bulk/), as the engine builds it."""
    from servesim.scheduler.bulk import decode_runs_for

    runs = decode_runs_for(sched)
    assert runs is not None, f"{type(sched).__name__} declares no bulk decode path"
    return runs


def scheduler_state(sched) -> dict:
    """Everything a schedule changes that a later step reads (twin schedulers compare it)."""
    kvm = sched.kv_cache_manager
    mgr = kvm._single_full
    return {
        "running": [r.request_id for r in sched.running],
        "waiting": [r.request_id for r in sched.waiting],
        "skipped": [r.request_id for r in sched.skipped_waiting],
        "requests": {rid: (r.status, r.num_computed_tokens, r.num_output_placeholders, r.is_prefill_chunk,
                           r.num_cached_tokens, r.num_tokens) for rid, r in sched.requests.items()},
        "blocks": {rid: [b.block_id for b in bl] for rid, bl in mgr.req_to_blocks.items()},
        "cached": dict(mgr.num_cached_block),
        "free": [b.block_id for b in kvm.block_pool.free_block_queue.get_all_free_blocks()],
        "hashes": sorted((b.block_id, b.block_hash) for bl in mgr.req_to_blocks.values() for b in bl
                         if b.block_hash is not None),
        "landed": set(sched.finished_recving_kv_req_ids),
        "prev": set(sched.prev_step_scheduled_req_ids),
        "finished": set(sched.finished_req_ids),
        "stats": (kvm.prefix_cache_stats.hits, kvm.prefix_cache_stats.queries),
    }
