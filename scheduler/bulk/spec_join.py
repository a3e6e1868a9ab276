"""A prompt joining a run of verify steps at its first schedule (scheduler/bulk/spec.py, "Joins").

Async loop only: the step in flight S schedules every running request, and one request waits
or the last running one is a prompt whose chunk is in S. The run's schedule 0 verifies the
batch (the running phase, in bulk), then the scheduler's own phases (Scheduler.schedule_behind:
its lookup, allocation and counters) compute the rest of the prompt: the waiting phase admits a
new one whole, the running phase completes a chunked one. Update 0 is S's, which brings the
prompt nothing (a chunk samples nothing); from schedule 1 on the joiner is in the steady state
of a request whose in-flight step ran its prefill (one placeholder, num_spec_tokens placeholder
drafts, num_computed_tokens == num_tokens), one step behind the batch: it verifies at schedules
1, 2, ..., update 1 brings its first token and grows its context by num_spec_tokens more (that
prefill verified no drafts: its bump), and its acceptances are drawn from output position 1 on.

What has to be proven before the run: schedule 0 completes exactly its prompt, and a new one's
prefix hit is the one a peek finds now (the step's price reads it). Functions of the vLLM bulk
path (a friend of the scheduler: bulk/__init__.py); all but admit_joiner read and change nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from servesim.scheduler.bulk.joins import completing_chunk, joining_prompt

if TYPE_CHECKING:
    from servesim.scheduler.bulk.kv import KVDecodeRuns
    from servesim.scheduler.kv.manager import KVCacheBlocks
    from servesim.scheduler.request import Request
    from servesim.scheduler.scheduler import Scheduler


@dataclass(slots=True)
class SpecJoin:
    """The prompt a run's schedule 0 completes behind its verifies (spec_joiner, completing_joiner)."""

    request: Request
    hit: KVCacheBlocks | None  # a new prompt's prefix hit now (peek_computed_blocks); None: a running chunk
    num_hit_tokens: int  # the context its prefill computes on (its hit, or its chunks computed)
    num_prefill_tokens: int  # the tokens it computes at schedule 0: the rest of its prompt
    num_blocks: int  # blocks it holds after schedule 0: its whole prompt's (and, running, lookahead slots)
    num_blocks_taken: int  # of them, at most this many come off the free queue at schedule 0


def spec_joiner(sched: Scheduler, kv: KVDecodeRuns, num_batch: int) -> SpecJoin | None:
    """The one waiting request the next schedule surely admits whole behind num_batch verifies
    (joining_prompt's rules: new, alone, seated, its whole prompt's blocks free now), with the
    verifies' tokens in the budget too, a stop rule the run replays (max_tokens only) and room
    below max_model_len; None where not proven. Its hit is peeked (no lookup recorded)."""
    head = joining_prompt(sched, kv)
    if head is None:
        return None
    num_prompt = head.num_tokens
    sp = head.sampling_params
    if (num_batch * (1 + sched.num_spec_tokens) + num_prompt > sched.max_num_scheduled_tokens
            or head.structured_output_request is not None or head.resumable or head.spec_token_ids
            or sp.stop_token_ids or (sp.eos_token_id is not None and not sp.ignore_eos)
            or sp.min_tokens > head.max_tokens or num_prompt >= sched.max_model_len):
        return None
    kvm = sched.kv_cache_manager
    hit, num_hit = kvm.peek_computed_blocks(head)
    num_blocks = -(-num_prompt // kvm.block_size)  # (no lookahead at a first admission)
    return SpecJoin(head, hit, num_hit, num_prompt - num_hit, num_blocks, num_blocks)


def completing_joiner(sched: Scheduler, num_batch: int) -> SpecJoin | None:
    """The last running request, a prompt whose chunk is in flight, when the next schedule's
    running phase computes the rest of it behind num_batch verifies (completing_chunk's rules, the
    verifies' tokens in the budget too, a stop rule the run replays) and nothing waits; None where
    not proven. No lookup: its blocks are its own, plus the rest's (and lookahead slots)."""
    r = completing_chunk(sched)
    if r is None or sched.waiting or sched.skipped_waiting:
        return None
    rest = r.num_tokens - r.num_computed_tokens
    sp = r.sampling_params
    if (num_batch * (1 + sched.num_spec_tokens) + rest > sched.max_num_scheduled_tokens
            or r.structured_output_request is not None or r.resumable
            or sp.stop_token_ids or (sp.eos_token_id is not None and not sp.ignore_eos)
            or sp.min_tokens > r.max_tokens):
        return None
    kvm = sched.kv_cache_manager
    mgr = kvm._single_full
    assert mgr is not None
    need = -(-min(r.num_tokens + sched.num_lookahead_tokens, sched.max_model_len) // kvm.block_size)
    held = len(mgr.req_to_blocks.get(r.request_id, ()))
    return SpecJoin(r, None, r.num_computed_tokens, rest, max(need, held), max(0, need - held))


def hit_survives_verifies(sched: Scheduler, batch: Sequence[Request], contexts: Sequence[int], join: SpecJoin,
                          num_pops: int) -> bool:
    """Whether the joiner's lookup at schedule 0, behind the verifies of `batch` (their contexts
    there), finds the hit peeked now: those verifies' allocations (num_pops blocks off the free
    queue's front) take no free block of the hit, and their cachings (full blocks up to the
    scheduled tokens, or the known ones) put no block under its first missing hash (a hash
    lookup returns the first block inserted under it, so later ones change no hit). Only
    blocks of the hit with no holder are in the free queue."""
    kvm = sched.kv_cache_manager
    r = join.request
    if join.hit is None or not kvm.enable_caching or r.skip_reading_prefix_cache:
        return True  # (a running chunk looks nothing up)
    blocks = join.hit.blocks[0]
    protected = {b.block_id for b in blocks if b.ref_cnt == 0}
    if protected and num_pops and kvm.block_pool.free_block_queue.index_of_first(protected, num_pops) < num_pops:
        return False
    m, bs = len(blocks), kvm.block_size
    if m >= (r.num_tokens - 1) // bs:
        return True  # the lookup never looks past block m - 1 (the last token is recomputed)
    miss = r.block_hashes[m]
    mgr = kvm._single_full
    assert mgr is not None
    ns = sched.num_spec_tokens
    for b, c in zip(batch, contexts):
        if mgr.num_cached_block.get(b.request_id, 0) > m:
            continue  # its block m is cached already (and was missed)
        upto = min(c + 1 + ns, b.num_tokens)  # what schedule 0 caches of it
        hashes = b.block_hashes
        if upto // bs > m and (len(hashes) <= m or hashes[m] == miss):
            return False
    return True


def admit_joiner(sched: Scheduler, join: SpecJoin, steps_each: Sequence[int], now_s: float) -> int:
    """The rest of schedule 0 (Scheduler.schedule_behind) behind the verifies of the run's running
    requests (steps_each: the schedules that take each; 0: skipped at schedule 0): the running
    phase from a running joiner, the waiting phase, which must complete exactly the joiner's
    prompt, computing the tokens the plan priced. Returns the blocks it took off the free queue
    (new ones, and free ones a new prompt's hit holds)."""
    queue = sched.kv_cache_manager.block_pool.free_block_queue
    before = queue.num_free_blocks
    num_verifies = 0
    for m in steps_each:
        if m:
            num_verifies += 1
    sched.now_s = now_s
    start = len(sched.running) - (join.hit is None)  # a running chunk: the running phase from it
    joined, tokens = sched.schedule_behind(num_verifies * (1 + sched.num_spec_tokens), start)
    r = join.request
    if (len(joined) != 1 or joined[0] is not r or r.num_computed_tokens != r.num_tokens
            or tokens != [join.num_prefill_tokens]):
        raise AssertionError(f"a spec run's first schedule admitted {[x.request_id for x in joined]} ({tokens}), "
                             f"not {r.request_id} with {join.num_prefill_tokens} tokens")
    return before - queue.num_free_blocks
