"""A waiting request a run's schedules stop at, refused alike at each (the vLLM bulk path's
proof: bulk/vllm.py decode_run_horizon). A function of `VllmDecodeRuns` (a friend of the
scheduler: bulk/__init__.py) reading the scheduler's queues, limits and configuration and the KV
manager's prefix cache (a peek: no lookup recorded); it changes nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING

from servesim.scheduler.request import RequestStatus

if TYPE_CHECKING:
    from servesim.scheduler.bulk.kv import KVDecodeRuns
    from servesim.scheduler.kv.manager import KVCacheBlocks
    from servesim.scheduler.request import Request
    from servesim.scheduler.scheduler import Scheduler

HEAD_POLICIES = ("fcfs", "priority")  # waiting queues whose head a run provably keeps (or sees join)
_ADMITTABLE = (RequestStatus.WAITING, RequestStatus.PREEMPTED)


def refused_head_hit(sched: Scheduler, kv: KVDecodeRuns, head: Request, num_batch: int) -> KVCacheBlocks | None:
    """The head's prefix-cache hit now if the next plain schedule of num_batch decodes stops at
    the waiting `head` and every later one provably will, as long as the hit stays the same
    (decode_run_fit then bounds the run so); None if not proven. Each schedule looks the head
    up, then stops (chunked prefill off and its tokens over the budget) or its admission fails
    for lack of blocks (KVDecodeRuns.admission_fails). Through a run the token budget is
    constant (the batch is), free blocks only fall (no request finishes: decode_run_horizon)
    and so does nothing else the decision reads. Only the fcfs and priority queues (whose
    head changes only by arrivals and admissions), a head with no LoRA slot to check, and
    no request skipped in an earlier step."""
    cfg = sched.scheduler_config
    if (sched.skipped_waiting or cfg.policy not in HEAD_POLICIES or head.status not in _ADMITTABLE
            or head.num_computed_tokens or (sched.max_loras is not None and head.lora_id is not None)
            or cfg.use_eagle):
        return None
    budget = sched.max_num_scheduled_tokens - num_batch
    if (cfg.enable_chunked_prefill or head.num_tokens <= budget) and kv.admission_surely_fits(head):
        return None  # admitted, whatever its hit: the lookup below would only confirm it
    hit, num_hit = sched.kv_cache_manager.peek_computed_blocks(head)
    num_new = head.num_tokens - num_hit
    threshold = cfg.long_prefill_token_threshold
    if 0 < threshold < num_new:
        num_new = threshold
    if (cfg.enable_chunked_prefill or num_new <= budget) and not kv.admission_fails(
            head, min(num_new, budget), hit, num_hit, cfg.scheduler_reserve_full_isl):
        return None
    return hit
