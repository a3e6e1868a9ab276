"""Joins of prompts (scheduler/bulk/vllm.py and bulk/joins.py, "Joins"): a run's first schedule
applied by the bulk path (the batch's decodes in bulk, then the scheduler's own phases admitting
the waiting request with its whole prompt, or completing the last running request's prefill
chunk) leaves exactly the state schedule() leaves, computes exactly the tokens on exactly the
context the bulk path read ahead (what the step is priced from), and the steps after it are the
same. Twin async schedulers driven by hand, as vLLM's
tests drive theirs; a seeded random workload with shared prefixes and a tight block pool."""

from __future__ import annotations

import random

import pytest

from servesim.scheduler import ModelRunnerOutput
from servesim.scheduler.request import RequestStatus
from tests.sched_helpers import apply_due, make_sched, req, runs_of, scheduler_state


def _pair(**kw):
    return [make_sched(async_scheduling=True, **kw) for _ in range(2)]


def _add(scheds, rid: str, tokens, max_tokens: int) -> None:
    for sched in scheds:
        sched.add_request(req(sched, rid, list(tokens) if not isinstance(tokens, int) else tokens,
                              max_tokens=max_tokens))


def _output(sched, out) -> ModelRunnerOutput:
    """The step's output: one token for each request it brings to the end of its known tokens
    (a prefill chunk short of it samples none), read right after the schedule."""
    ids = list(out.num_scheduled_tokens)
    sampled = [[] if sched.requests[rid].is_prefill_chunk else [7] for rid in ids]
    return ModelRunnerOutput(ids, {r: i for i, r in enumerate(ids)}, sampled)


def _step_both(ref, bulk, flights, joined: list) -> None:
    """One loop top: where the bulk twin's horizon opens a run with joins, its first schedule by
    the bulk path beside schedule() on the reference; otherwise schedule() on both."""
    runs = runs_of(bulk)
    ref_flight, bulk_flight = flights
    joins = runs.decode_run_joining() if len(bulk_flight) == 1 and runs.decode_run_horizon(64, 1, True) else None
    ref_out = ref.schedule()
    mro = _output(ref, ref_out)
    ref_flight.append((ref_out, mro))
    if joins is not None and joins.requests:
        batch = runs.decode_run_requests() + joins.requests
        assert [r.request_id for r in batch] == list(ref_out.num_scheduled_tokens)
        eff = runs.schedule_decode_steps(batch, 1, None, ref.now_s)
        cached = ref_out.scheduled_cached_reqs
        before = dict(zip(cached.req_ids, cached.num_computed_tokens))
        before.update({nr.req_id: nr.num_computed_tokens for nr in ref_out.scheduled_new_reqs})
        ids = [r.request_id for r in joins.requests]
        assert [before[rid] for rid in ids] == joins.contexts  # a new one's hit read ahead, or its chunk
        assert [ref_out.num_scheduled_tokens[rid] for rid in ids] == joins.num_new_tokens == eff.joined_tokens
        assert eff.free_after == [ref.kv_cache_manager.block_pool.get_num_free_blocks()]
        assert eff.finished == ref_out.finished_req_ids
        joined.append(joins.contexts[0])
        bulk_flight.append((runs.decode_step_output(batch, eff.joined_tokens), mro))
    else:
        bulk_out = bulk.schedule()
        assert (dict(bulk_out.num_scheduled_tokens), bulk_out.finished_req_ids) == \
            (dict(ref_out.num_scheduled_tokens), ref_out.finished_req_ids)
        bulk_flight.append((bulk_out, mro))
    for sched, flight in ((ref, ref_flight), (bulk, bulk_flight)):
        apply_due(sched, flight, 2, not flight[-1][0].total_num_scheduled_tokens)
    assert scheduler_state(bulk) == scheduler_state(ref)


def test_a_new_prompt_joins_a_runs_first_schedule_as_schedule_admits_it():
    ref, bulk = _pair(num_blocks=80, block_size=4, max_num_batched_tokens=64)
    flights: tuple[list, list] = ([], [])
    _add((ref, bulk), "a", 9, 30)
    _add((ref, bulk), "b", 6, 30)
    joined: list[int] = []
    for _ in range(4):
        _step_both(ref, bulk, flights, joined)
    assert not joined  # nothing waited
    _add((ref, bulk), "n", 21, 8)
    _step_both(ref, bulk, flights, joined)
    assert joined == [0]  # it joined, whole, with no prefix hit
    assert ref.requests["n"].status == RequestStatus.RUNNING
    for _ in range(12):
        _step_both(ref, bulk, flights, joined)
    assert joined == [0]


def test_a_joining_prompt_computes_past_its_prefix_hit():
    ref, bulk = _pair(num_blocks=80, block_size=4, max_num_batched_tokens=64)
    flights: tuple[list, list] = ([], [])
    shared = list(range(500, 524))  # six blocks
    _add((ref, bulk), "s", shared + [1, 2, 3], 2)
    _add((ref, bulk), "a", 9, 40)
    joined: list[int] = []
    for _ in range(6):  # s finishes: its prompt's blocks stay cached in the free queue
        _step_both(ref, bulk, flights, joined)
    assert "s" not in ref.requests
    _add((ref, bulk), "n", shared + [9, 9, 9, 9, 9], 6)
    _step_both(ref, bulk, flights, joined)
    assert joined == [24]


def test_no_run_opens_where_the_batchs_decodes_would_evict_the_prompts_hit():
    """The hit read ahead must be the one the waiting phase finds behind the decodes: here the
    step's one decode allocation pops the free block the prompt would hit, so no run opens, and
    schedule() indeed admits it with no hit."""
    ref, bulk = _pair(num_blocks=15, block_size=4, max_num_batched_tokens=64)
    flights: tuple[list, list] = ([], [])
    shared = list(range(500, 508))
    _add((ref, bulk), "s", shared, 1)  # finishes at once: its two blocks go to the free queue
    _add((ref, bulk), "a", 31, 40)
    _add((ref, bulk), "c", 12, 3)  # finishes later: its blocks queue behind s's
    for _ in range(6):
        _step_both(ref, bulk, flights, [])
    kvm = bulk.kv_cache_manager
    first_free = kvm.block_pool.free_block_queue.get_all_free_blocks()[0]
    assert bulk.requests["a"].num_computed_tokens % 4 == 0  # its next token needs a block: the front one
    _add((ref, bulk), "n", shared[:4] + [9] * 5, 6)
    hit, num_hit = kvm.peek_computed_blocks(bulk.requests["n"])
    assert num_hit == 4 and hit.blocks[0][0] is first_free
    runs = runs_of(bulk)
    assert runs.decode_run_horizon(64, 1, True) == 0
    joined: list[int] = []
    _step_both(ref, bulk, flights, joined)
    assert not joined and ref.requests["n"].num_cached_tokens == 0


def test_a_prefill_chunk_completing_joins_a_runs_first_schedule():
    ref, bulk = _pair(num_blocks=80, block_size=4, max_num_batched_tokens=32)
    flights: tuple[list, list] = ([], [])
    _add((ref, bulk), "a", 5, 30)
    joined: list[int] = []
    for _ in range(3):
        _step_both(ref, bulk, flights, joined)
    _add((ref, bulk), "n", 40, 8)  # over the budget behind a's decode: its first chunk steps
    _step_both(ref, bulk, flights, joined)
    assert not joined and ref.requests["n"].is_prefill_chunk
    _step_both(ref, bulk, flights, joined)  # its last chunk: the run's first schedule
    assert joined == [31] and not ref.requests["n"].is_prefill_chunk
    for _ in range(10):
        _step_both(ref, bulk, flights, joined)
    assert joined == [31]


@pytest.mark.parametrize("why", ["two waiting", "budget", "seats", "preempted", "sync"])
def test_no_run_opens_with_a_prompt_that_cannot_join_whole(why):
    ref, bulk = _pair(num_blocks=80, block_size=4, max_num_batched_tokens=32, max_num_seqs=3)
    flights: tuple[list, list] = ([], [])
    _add((ref, bulk), "a", 5, 30)
    _add((ref, bulk), "b", 5, 30)
    for _ in range(3):
        _step_both(ref, bulk, flights, [])
    runs = runs_of(bulk)
    if why == "two waiting":
        _add((ref, bulk), "n", 5, 8)
        _add((ref, bulk), "m", 5, 8)
    elif why == "budget":  # 2 decodes + 31 prompt tokens > 32: it would be chunked
        _add((ref, bulk), "n", 31, 8)
    elif why == "seats":
        _add((ref, bulk), "c", 5, 30)
        _step_both(ref, bulk, flights, [])
        _step_both(ref, bulk, flights, [])
        _add((ref, bulk), "n", 5, 8)
    else:
        _add((ref, bulk), "n", 5, 8)
        if why == "preempted":  # it would come back as a resumed request, not a new one
            bulk.requests["n"].num_preemptions = 1
    if why == "sync":  # it would join, but only an async run's first schedule takes joins
        assert runs.decode_run_joining().requests and runs.decode_run_horizon(64, 0, True) == 0
        return
    assert not runs.decode_run_joining().requests
    if why != "seats":  # (a full batch never looks at the waiting request: the run goes on)
        assert runs.decode_run_horizon(64, 1, True) == 0


@pytest.mark.parametrize("seed", range(8))
def test_random_arrivals_join_exactly(seed):
    """Arrivals of prompts from a few shared prefixes, a quarter of them over the token budget
    (chunked), into pools from tight to roomy: every join the bulk path proves (a new prompt or a
    completing chunk) is schedule()'s, on the context it read ahead; preemptions and refusals step."""
    rng = random.Random(seed)
    ref, bulk = _pair(num_blocks=rng.choice([28, 60, 120, 200]), block_size=4, max_num_batched_tokens=48,
                      max_num_seqs=rng.choice([4, 8]), max_model_len=128)
    flights: tuple[list, list] = ([], [])
    prefixes = [[rng.randrange(1, 900) for _ in range(rng.randrange(4, 20))] for _ in range(3)]
    joined: list[int] = []
    for i in range(200):
        if rng.random() < 0.3:
            num_tail = rng.randrange(30, 60) if rng.random() < 0.25 else rng.randrange(1, 16)
            tail = [rng.randrange(1, 900) for _ in range(num_tail)]
            _add((ref, bulk), f"r{i}", rng.choice(prefixes) + tail, rng.randrange(1, 30))
        _step_both(ref, bulk, flights, joined)
    assert len(joined) >= 3 and any(joined)  # some joined, some past a prefix hit or a chunk
