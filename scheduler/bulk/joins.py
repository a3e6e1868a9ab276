"""Joins: the requests a vLLM run's first schedule takes behind its batch's decodes, each
completing its prompt there (DecodeRuns.decode_run_joining; the module docstrings of bulk/vllm.py
and bulk/pd.py): a new request admitted whole, or the last running request's prefill chunk.

Functions of the vLLM bulk path (`VllmDecodeRuns`, a friend of the scheduler: bulk/__init__.py)
that decide who joins, what each computes there, and how far a run with them may go. They read
the scheduler's `waiting`, `skipped_waiting`, `running`, limits and configuration and the KV
manager's prefix cache (a peek: no lookup is recorded), and change nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from servesim.scheduler.bulk.heads import HEAD_POLICIES
from servesim.scheduler.bulk.interface import Joins
from servesim.scheduler.request import RequestStatus

if TYPE_CHECKING:
    from servesim.scheduler.bulk.kv import KVDecodeRuns
    from servesim.scheduler.request import Request
    from servesim.scheduler.scheduler import Scheduler


def joining_prompt(sched: Scheduler, kv: KVDecodeRuns) -> Request | None:
    """The waiting request the next schedule surely admits with its whole prompt behind the
    running requests' decodes, or None. It is the only one waiting (a second one would be looked
    up behind it, on blocks it changes), new (no computed token, no preemption, no multimodal
    input, no LoRA slot to check, no drafting model's lookahead), there is a seat for it, and the
    token budget left by every running request's one token covers its prompt (whatever its prefix
    hit: no chunk, and no long-prefill cut). Its blocks are counted by decode_run_fit (`joining`):
    where they fit, allocate_slots and the full-prompt gate admit it."""
    cfg = sched.scheduler_config
    waiting = sched.waiting
    if len(waiting) != 1 or sched.skipped_waiting or cfg.policy not in HEAD_POLICIES or cfg.use_eagle:
        return None
    head = waiting.peek_request()
    num_prompt = head.num_tokens
    num_seated = len(sched.running)
    if (head.status != RequestStatus.WAITING or head.num_computed_tokens or head.num_preemptions
            or head.mm_features or (sched.max_loras is not None and head.lora_id is not None)
            or num_seated >= sched.max_num_running_reqs
            or num_seated + num_prompt > sched.max_num_scheduled_tokens
            or 0 < cfg.long_prefill_token_threshold < num_prompt
            or not kv.admission_surely_fits(head)):
        return None
    return head


def completing_chunk(sched: Scheduler) -> Request | None:
    """The last running request, when it is a new prompt's prefill chunk that the next schedule
    completes behind the other running requests' decodes (whatever their number: the token budget
    left by every other running request's one token covers the rest of its prompt, no long-prefill
    cut, below max_model_len), or None. Last: nobody is scheduled after it in the running phase;
    no output yet, no preemption, no multimodal input or LoRA slot to check."""
    running = sched.running
    if not running:
        return None
    r = running[-1]
    cfg = sched.scheduler_config
    rest = r.num_tokens - r.num_computed_tokens
    if (not r.is_prefill_chunk or r.status != RequestStatus.RUNNING or r.num_output_placeholders
            or r.num_output_tokens or r.num_preemptions or r.spec_token_ids or r.mm_features or rest < 1
            or (sched.max_loras is not None and r.lora_id is not None) or cfg.use_eagle
            or len(running) - 1 + rest > sched.max_num_scheduled_tokens
            or 0 < cfg.long_prefill_token_threshold < rest or r.num_tokens >= sched.max_model_len):
        return None
    return r


def join_plan(sched: Scheduler, kv: KVDecodeRuns, batch: list[Request], joining: list[Request]) -> Joins | None:
    """What the joining requests compute at the run's first schedule behind `batch`'s decodes:
    the rest of each prompt, past its computed chunk (a running one) or its prefix hit, read ahead
    (peek) where those decodes provably leave it as it is (KVDecodeRuns.hit_survives_decodes);
    None where not proven."""
    kvm = sched.kv_cache_manager
    contexts: list[int] = []
    num_chunks = 0  # prefill chunks, running already
    for r in joining:
        if r.status == RequestStatus.RUNNING:  # a prefill chunk: no lookup
            contexts.append(r.num_computed_tokens)
            num_chunks += 1
            continue
        hit, num_hit = kvm.peek_computed_blocks(r)
        if not kv.hit_survives_decodes(batch, r, hit):
            return None
        contexts.append(num_hit)
    return Joins(joining, contexts, [r.num_tokens - c for r, c in zip(joining, contexts)], num_chunks)


def joining_bound(sched: Scheduler, joining: list[Request], k: int, through: bool, caps: list[int]) -> int:
    """decode_run_horizon's k bounded for the requests joining at the run's first schedule
    (through: their caps appended); 0 where one refuses the run. A joining request computes the
    rest of its prompt there and samples, so update i + 1 brings it o + i + 1 outputs: one step
    more than a running request with o outputs and one in flight."""
    max_len = sched.max_model_len
    for r in joining:
        sp = r.sampling_params
        if sp.stop_token_ids or (sp.eos_token_id is not None and not sp.ignore_eos):
            return 0
        if through:
            if sp.min_tokens > r.max_tokens:
                return 0
            caps.append(r.max_tokens - r.num_output_tokens)  # exact: decode_run_steps' count
            k = min(k, max_len - r.num_tokens - 2)
        else:
            k = min(min(k, r.max_tokens - r.num_output_tokens - 1), max_len - r.num_tokens - 2)
        if k < 1:
            return 0
    return k


def num_running(batch: Sequence[Request]) -> int:
    """The run's batch's requests before the joining ones that end it (not yet running, or a
    prefill chunk: a plain decode is neither)."""
    m = len(batch)
    while m and (batch[m - 1].status != RequestStatus.RUNNING or batch[m - 1].is_prefill_chunk):
        m -= 1
    return m
