"""The vLLM scheduler's stranded head: a waiting request its admission checks refuse for good.

vLLM 0.19.1 refuses a request only at add_request (prompt longer than max_model_len, or a prompt
whose blocks exceed the pool: Scheduler._never_fits here). A request that passes and later can
never be admitted waits forever at the head of the queue, and blocks every request behind it:

- a hybrid (full + sliding-window) request preempted after some output tokens must recompute
  prompt + outputs; with scheduler_reserve_full_isl the full-ISL check counts those tokens in
  every group, which can exceed the pool the prompt alone fitted (the fuzzer found one: 39 + 39
  blocks against 77; the vLLM 0.19.1 oracle idles the same way with 77 free blocks);
- chunked prefill off with a token budget smaller than the request's tokens (a draft model keeps
  max_num_seqs slots of the budget; start-up refuses the configurations where a prompt can hit it,
  a resumed request's prompt + outputs is checked here).

The proof is the scheduler's own arithmetic in the one state where nothing else can change it:
nothing running, no request holding KV (every block free), the whole token budget free. The
prefix-cache hit is read as it stands (peek, no stats): only another request running changes it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from servesim.scheduler.interface import StrandedRequest
from servesim.scheduler.request import BLOCKED_WAITING_STATES

if TYPE_CHECKING:
    from servesim.scheduler.scheduler import Scheduler


def stranded_head(sched: Scheduler) -> StrandedRequest | None:
    """Scheduler.stranded_request (the contract: scheduler/interface.py)."""
    kvm = sched.kv_cache_manager
    pool = kvm.block_pool
    if sched.running or not (sched.waiting or sched.skipped_waiting):
        return None
    if pool.get_num_free_blocks() != pool.num_gpu_blocks - 1 or sched.connector is not None:
        return None  # something holds KV (it will free it), or a connector may still load tokens
    request = sched._select_waiting_queue(sched.waiting, sched.skipped_waiting).peek_request()
    if request.status in BLOCKED_WAITING_STATES or request.num_computed_tokens or request.mm_features:
        return None  # a blocked wait ends by itself; encoder budgets are checked at add_request
    cfg = sched.scheduler_config
    rid = request.request_id
    blocks, num_hit = kvm.peek_computed_blocks(request)
    num_new = request.num_tokens - num_hit
    if 0 < cfg.long_prefill_token_threshold < num_new:
        num_new = cfg.long_prefill_token_threshold
    budget = sched.max_num_scheduled_tokens
    if not cfg.enable_chunked_prefill and num_new > budget:
        return StrandedRequest(rid, "token_budget", (
            f"{num_new} tokens to compute in one step (chunked prefill off), the step budget is {budget}"))
    free = pool.get_num_free_blocks()
    if cfg.scheduler_reserve_full_isl:  # KVCacheManager.can_fit_full_sequence's arithmetic
        full = min(request.num_tokens, sched.max_model_len)
        need = kvm.coordinator.get_num_blocks_to_allocate(rid, full, blocks.blocks, min(num_hit, sched.max_model_len),
                                                          full)
        if need > free:
            return StrandedRequest(rid, "kv_pool", (
                f"{need} KV blocks to admit its {request.num_tokens} tokens (full-ISL check, every group), "
                f"the whole pool has {free}"))
    if sched.mamba_split is not None:
        return None  # Mamba align mode cuts the first chunk to whole blocks: no proof from its size
    # The first chunk alone (allocate_slots' arithmetic; a request coming back holds no lookahead yet).
    first = min(num_hit + min(num_new, budget), sched.max_model_len)
    need = kvm.coordinator.get_num_blocks_to_allocate(rid, first, blocks.blocks, num_hit, first)
    if need > free:
        return StrandedRequest(rid, "kv_pool", (
            f"{need} KV blocks for its first chunk of {first - num_hit} tokens, the whole pool has {free}"))
    return None
