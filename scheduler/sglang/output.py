"""SchedulerOutput for an SGLang batch, in the vLLM shape the executors and metrics consume.

* first admission: NewRequestData with its whole block table (cached prefix pages included);
* the chunked request's next chunk, and decode requests: CachedRequestData with new pages only;
* re-admission after a retraction/preemption: CachedRequestData marked resumed with its whole
  (new) block table, which the worker uses to replace the old one (vLLM's resumed semantics);
* num_scheduled_tokens: prefill requests in admission order, then decode requests;
* preempted_req_ids: requests retracted or priority-preempted by this schedule() call.
Counters then advance at once (num_computed_tokens, output placeholders), so the next schedule()
can run before this step's output is applied.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from servesim.scheduler.output import CachedRequestData, NewRequestData, SchedulerOutput

if TYPE_CHECKING:
    from servesim.scheduler.request import Request
    from servesim.scheduler.sglang.batching import Batch
    from servesim.scheduler.sglang.scheduler import SGLangScheduler


@dataclass(slots=True)
class StepInfo:
    """What update_from_output needs to know about a scheduled step."""

    sampling: set[str] = field(default_factory=set)  # requests that sample a token in this step
    prefill_end: dict[str, int] = field(default_factory=dict)  # req_id -> KV length at prefill end
    # Speculative verify: req_id -> its num_preemptions when scheduled (a retraction since voids
    # the step's draft accounting).
    spec_epoch: dict[str, int] = field(default_factory=dict)


def _add_cached(data: CachedRequestData, sched: SGLangScheduler, req: Request, pages: list[int] | None,
                resumed: bool) -> None:
    rid = req.request_id
    data.req_ids.append(rid)
    if resumed:
        data.resumed_req_ids.add(rid)
    if rid not in sched.prev_step_scheduled_req_ids:
        data.all_token_ids[rid] = req.all_token_ids_copy()  # as the vLLM scheduler (unbuilt ids stay so)
    data.new_block_ids.append((pages,) if pages else None)
    data.num_computed_tokens.append(req.num_computed_tokens)
    data.num_output_tokens.append(req.num_output_tokens + req.num_output_placeholders)


def build_output(sched: SGLangScheduler, batch: Batch | None, preempted: list[Request]) -> tuple[SchedulerOutput, StepInfo]:
    mem = sched.kv_cache_manager
    new_reqs: list[NewRequestData] = []
    cached = CachedRequestData()
    num_scheduled: dict[str, int] = {}
    spec: dict[str, list[int]] = {}
    if batch is not None:
        for a in batch.prefill:
            req = a.request
            pages = mem.new_pages_to_report(req.request_id)
            if a.continuing:
                _add_cached(cached, sched, req, pages, resumed=False)
            elif req.num_preemptions > 0:
                _add_cached(cached, sched, req, pages, resumed=True)
            else:
                new_reqs.append(NewRequestData(req.request_id, req.prompt_token_ids, req.sampling_params,
                                               (pages,), a.prefix_len, req.lora_id))
            num_scheduled[req.request_id] = a.extend_len
        for req in batch.decode:
            _add_cached(cached, sched, req, mem.new_pages_to_report(req.request_id), resumed=False)
            num_scheduled[req.request_id] = sched.num_decode_tokens
            if sched.num_decode_tokens > 1:  # a verify step: 1 + k tokens, k of them drafts
                spec[req.request_id] = sched._draft_placeholders
    so = SchedulerOutput(
        scheduled_new_reqs=new_reqs,
        scheduled_cached_reqs=cached,
        num_scheduled_tokens=num_scheduled,
        total_num_scheduled_tokens=sum(num_scheduled.values()),
        scheduled_spec_decode_tokens=spec,
        num_common_prefix_blocks=[0],  # cascade-attention hint: not computed for SGLang batches
        finished_req_ids=sched.finished_req_ids,
        preempted_req_ids={r.request_id for r in preempted},
    )
    sched.finished_req_ids = set()
    sched.prev_step_scheduled_req_ids = set(num_scheduled)
    info = _advance(sched, batch, num_scheduled)
    for rid in spec:
        info.spec_epoch[rid] = sched.requests[rid].num_preemptions
    return so, info


def _advance(sched: SGLangScheduler, batch: Batch | None, num_scheduled: dict[str, int]) -> StepInfo:
    """Move counters past this step; a request samples when the step reaches its last known
    token (prompt + outputs, in-flight ones included), as the executors decide too."""
    info = StepInfo()
    prefill_ids = {a.request.request_id for a in batch.prefill} if batch is not None else set()
    for rid, n in num_scheduled.items():
        req = sched.requests[rid]
        req.num_computed_tokens += n
        samples = req.num_computed_tokens >= req.num_tokens + req.num_output_placeholders
        req.is_prefill_chunk = not samples
        if samples:
            req.num_output_placeholders += 1
            info.sampling.add(rid)
            if rid in prefill_ids:
                info.prefill_end[rid] = req.num_computed_tokens
    return info
