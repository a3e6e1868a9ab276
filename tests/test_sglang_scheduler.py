"""SGLangScheduler: PrefillAdder budgets, new_token_ratio, retraction, queue orderings, priority
preemption, mixed chunk, overlap decision and the SchedulerOutput it produces."""

from __future__ import annotations

import random

import pytest

from servesim.scheduler import ModelRunnerOutput, Request, SamplingParams
from servesim.scheduler.sglang import SGLangConfig, SGLangScheduler
from servesim.scheduler.sglang.policy import QueueContext, calc_priority
from servesim.scheduler.sglang.prefill_adder import AddReqResult, PrefillAdder, RoundInput

BASE = dict(max_running_requests=16, chunked_prefill_size=64, enable_chunked_prefill=True, page_size=1,
            max_total_tokens=1000, enable_radix_cache=True, overlap_schedule=False, seed=0)


def make_sched(max_model_len: int = 4096, **kw) -> SGLangScheduler:
    return SGLangScheduler(SGLangConfig(**{**BASE, **kw}), max_model_len)


def req(rid: str, tokens: list[int] | int, max_tokens: int = 8, priority: int = 0, ignore_eos: bool = False) -> Request:
    if isinstance(tokens, int):
        base = 1000 + sum(map(ord, rid)) * 1000
        tokens = [base + i for i in range(tokens)]
    return Request(rid, tokens, SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos), priority=priority)


def step(sched: SGLangScheduler, token: int = 7):
    """schedule + update; requests that reach their last known token sample one token."""
    so = sched.schedule()
    sched.check_invariants()
    ids = list(so.num_scheduled_tokens)
    sampled = [[] if sched.requests[r].is_prefill_chunk else [token] for r in ids]
    eco = sched.update_from_output(so, ModelRunnerOutput(ids, {r: i for i, r in enumerate(ids)}, sampled))
    sched.check_invariants()
    return so, eco


def run_to_end(sched: SGLangScheduler, max_steps: int = 10_000) -> list:
    outs = []
    for _ in range(max_steps):
        if not sched.has_unfinished_requests():
            return outs
        outs.append(step(sched)[0])
    raise AssertionError("did not finish")


# --- config -----------------------------------------------------------------------------------------
def test_config_validates_and_lists_valid_policies():
    with pytest.raises(ValueError, match="valid: lpm, dfs-weight, fcfs, lof, random"):
        SGLangConfig(schedule_policy="sjf")
    with pytest.raises(ValueError, match="still None: max_running_requests"):
        SGLangScheduler(SGLangConfig(), 1024)
    cfg = SGLangConfig(max_running_requests=4).resolved(max_running_requests=99, page_size=16)
    assert cfg.max_running_requests == 4 and cfg.page_size == 16  # explicit settings win
    assert cfg.init_ratio == 0.7 and cfg.min_ratio == pytest.approx(0.098)


def test_prompt_that_cannot_fit_is_ignored_and_outputs_are_clamped():
    sched = make_sched(max_total_tokens=100)
    sched.add_request(req("big", 96))
    assert [o.request_id for o in sched.take_ignored_outputs()] == ["big"]
    r = req("ok", 50, max_tokens=1000)
    sched.add_request(r)
    assert r.max_tokens == 100 - 50 - 1 - 1  # SGLang: pool - paged input - page - 1


# --- PrefillAdder budgets ---------------------------------------------------------------------------
def _adder(sched, running=(), ratio=0.7, mixed=0):
    return PrefillAdder(sched.config, sched.kv_cache_manager, list(running), [], ratio, mixed,
                        sched.entry_seq, lambda r: None)


def _rnd(r: Request) -> RoundInput:
    return RoundInput([], None, 0, r.num_tokens)


def test_rem_total_tokens_reserves_running_decode_space():
    sched = make_sched(enable_radix_cache=False)
    running = req("run", 10, max_tokens=500)  # reserves min(500, clip) * 0.7 = 350 tokens
    adder = _adder(sched, [running])
    assert adder.rem_total_tokens == 1000 - 350
    # 100 input + 600 new = 700 >= 650: no room (cache-enabled path, ignore_eos off).
    sched.kv_cache_manager.cache_enabled = True
    assert adder.add_one_req(req("a", 100, max_tokens=600), _rnd(req("a", 100))) == AddReqResult.NO_TOKEN
    assert adder.add_one_req(req("b", 60, max_tokens=500), _rnd(req("b", 60))) == AddReqResult.CONTINUE
    assert adder.rem_total_tokens == 650 - 60 - 500
    assert adder.rem_input_tokens == 16384 - 60 and adder.rem_chunk_tokens == 64 - 60


def test_rem_input_tokens_caps_a_prefill_batch():
    sched = make_sched(max_prefill_tokens=100, chunked_prefill_size=1000)
    for rid in "abc":
        sched.add_request(req(rid, 60))
    so, _ = step(sched)
    assert list(so.num_scheduled_tokens) == ["a"]  # b: 60 >= 40 left, and a batch is not empty
    so, _ = step(sched)
    assert list(so.num_scheduled_tokens) == ["b"]  # prefill first: a waits for its decode


def test_chunked_prefill_one_request_at_a_time():
    sched = make_sched(chunked_prefill_size=64, page_size=4, max_total_tokens=1000)
    sched.add_request(req("long", 150, max_tokens=2))
    sched.add_request(req("short", 10, max_tokens=2))
    chunks = [step(sched)[0].num_scheduled_tokens for _ in range(3)]
    assert chunks[0] == {"long": 64}  # whole pages, and the chunk budget is spent
    assert chunks[1] == {"long": 64}
    assert chunks[2] == {"long": 22, "short": 10}  # last chunk, then the next request fits
    assert sched.chunked_req is None


def test_mixed_chunk_adds_decode_tokens_to_prefill_batches():
    for mixed, expect in ((False, {"b": 20}), (True, {"b": 20, "a": 1})):
        sched = make_sched(enable_mixed_chunk=mixed)
        sched.add_request(req("a", 20, max_tokens=5))
        step(sched)
        step(sched)  # a decodes
        sched.add_request(req("b", 20))
        assert step(sched)[0].num_scheduled_tokens == expect


# --- new_token_ratio ----------------------------------------------------------------------------------
def test_new_token_ratio_decays_per_decode_step_and_resets_when_idle():
    sched = make_sched()
    cfg = sched.config
    sched.add_request(req("a", 10, max_tokens=6))
    step(sched)  # prefill: no decay
    assert sched.new_token_ratio == pytest.approx(cfg.init_ratio)
    for k in range(1, 5):
        step(sched)
        assert sched.new_token_ratio == pytest.approx(cfg.init_ratio - k * cfg.ratio_decay)
    run_to_end(sched)
    sched.new_token_ratio = cfg.min_ratio
    sched.add_request(req("b", 10))  # arrives at an idle scheduler
    assert sched.new_token_ratio == cfg.init_ratio


def test_new_token_ratio_floor():
    sched = make_sched(new_token_ratio_decay_steps=2)
    sched.add_request(req("a", 10, max_tokens=8))
    run_to_end(sched)
    assert sched.new_token_ratio == pytest.approx(sched.config.min_ratio)


# --- retraction ---------------------------------------------------------------------------------------
def test_retraction_picks_fewest_outputs_then_longest_prompt_and_jumps_the_ratio():
    # 170 tokens: b and c fit next to a only because a's remaining output is reserved at the
    # decayed ratio; all three cannot finish together.
    sched = make_sched(max_total_tokens=170, chunked_prefill_size=200, new_token_ratio_decay_steps=1,
                       enable_radix_cache=False)
    sched.add_request(req("a", 20, max_tokens=100))
    step(sched)
    for _ in range(3):
        step(sched)  # a decodes alone; the ratio decays to its minimum
    sched.add_request(req("b", 22, max_tokens=40))
    sched.add_request(req("c", 24, max_tokens=40))
    assert step(sched)[0].num_scheduled_tokens == {"b": 22, "c": 24}
    retracted = expect = None
    for _ in range(200):
        so = sched.schedule()
        sched.check_invariants()
        if so.preempted_req_ids:
            retracted, running = so.preempted_req_ids, sched.running
            expect = (sum(r.num_output_tokens for r in running) + 20 * len(running)) / (
                sum(r.max_tokens for r in running) + 1)
            assert sched.new_token_ratio == pytest.approx(min(1.0, expect))  # jumps back up
        ids = list(so.num_scheduled_tokens)
        sched.update_from_output(so, ModelRunnerOutput(ids, {r: i for i, r in enumerate(ids)}, [[7]] * len(ids)))
        if retracted:
            break
    assert retracted == {"c"}  # b and c have as many outputs; c has the longer prompt
    assert expect > sched.config.min_ratio
    assert sched.requests["c"].num_computed_tokens == 0 and sched.waiting[-1].request_id == "c"
    outs = run_to_end(sched)
    resumed = [so for so in outs if "c" in so.scheduled_cached_reqs.resumed_req_ids]
    assert resumed  # it came back (as a resumed request with a fresh block table) and finished
    i = resumed[0].scheduled_cached_reqs.req_ids.index("c")
    assert resumed[0].num_scheduled_tokens["c"] == 24 + resumed[0].scheduled_cached_reqs.num_output_tokens[i]


def test_ghosts_keep_batch_full_until_the_next_filter():
    sched = make_sched(max_running_requests=2, enable_radix_cache=False)
    sched.add_request(req("a", 5, max_tokens=2))
    sched.add_request(req("b", 5, max_tokens=4))
    sched.add_request(req("c", 5, max_tokens=2))
    assert step(sched)[0].num_scheduled_tokens == {"a": 5, "b": 5}
    assert sched.batch_is_full
    step(sched)  # decode: a finishes but stays in SGLang's running batch until filtered
    assert [g.request_id for g in sched.ghosts] == ["a"] and sched.batch_is_full
    assert step(sched)[0].num_scheduled_tokens == {"b": 1}  # prefill skipped; filter frees the slot
    assert step(sched)[0].num_scheduled_tokens == {"c": 5}


# --- queue orderings ----------------------------------------------------------------------------------
def _queue_ctx(sched, **over):
    cfg = sched.config if not over else SGLangConfig(**{**BASE, **over})
    return QueueContext(cfg, sched.kv_cache_manager, random.Random(0), sched.entry_seq)


def _ids(queue):
    return [r.request_id for r in queue]


def test_fcfs_lof_and_priority_orderings():
    sched = make_sched()
    q = [req("a", 5, max_tokens=3, priority=2), req("b", 5, max_tokens=9, priority=1), req("c", 5, max_tokens=5, priority=1)]
    for r in q:
        sched._enqueue(r)
    calc_priority("fcfs", q, _queue_ctx(sched))
    assert _ids(q) == ["a", "b", "c"]
    calc_priority("lof", q, _queue_ctx(sched))
    assert _ids(q) == ["b", "c", "a"]
    calc_priority("fcfs", q, _queue_ctx(sched, enable_priority_scheduling=True))
    assert _ids(q) == ["b", "c", "a"]  # lower value first, then entry order
    calc_priority("fcfs", q, _queue_ctx(sched, enable_priority_scheduling=True,
                                        schedule_low_priority_values_first=False))
    assert _ids(q) == ["a", "b", "c"]


def test_random_ordering_is_seeded():
    sched = make_sched()
    q1 = [req(str(i), 3) for i in range(8)]
    q2 = list(q1)
    calc_priority("random", q1, _queue_ctx(sched))
    calc_priority("random", q2, _queue_ctx(sched))
    assert _ids(q1) == _ids(q2) and sorted(_ids(q1)) == sorted(map(str, range(8))) and _ids(q1) != list(map(str, range(8)))


def _cache_tokens(sched, tokens):
    mem = sched.kv_cache_manager
    pages = mem.pool.alloc(len(tokens))
    mem.tree.insert(tokens, pages)


def test_lpm_puts_the_longest_cached_prefix_first_and_dedups_in_batch():
    sched = make_sched()
    sys_prompt = list(range(100, 150))
    _cache_tokens(sched, sys_prompt)
    q = [req("none", 40), req("short", sys_prompt[:10] + [1, 2, 3]), req("long", sys_prompt + [9] * 5)]
    calc_priority("lpm", q, _queue_ctx(sched))
    assert _ids(q) == ["long", "short", "none"]
    # Two waiters sharing an uncached 40-token prefix: the second one waits for the first.
    shared = list(range(5000, 5040))
    q = [req("x1", shared + [1]), req("x2", shared + [2]), req("solo", 20)]
    calc_priority("lpm", q, _queue_ctx(sched))
    assert _ids(q) == ["x1", "solo", "x2"]
    # A long queue is left alone (FCFS fallback).
    q = [req("none", 40), req("long", sys_prompt + [9])]
    calc_priority("lpm", q, _queue_ctx(sched, lpm_fallback_queue_len=1))
    assert _ids(q) == ["none", "long"]


def test_dfs_weight_groups_the_heaviest_subtree_first():
    sched = make_sched()
    a, b = list(range(100, 120)), list(range(200, 220))
    _cache_tokens(sched, a)
    _cache_tokens(sched, b)
    q = [req("b1", b + [1]), req("a1", a + [1]), req("x", 10), req("a2", a + [2]), req("a3", a + [3])]
    calc_priority("dfs-weight", q, _queue_ctx(sched))
    assert _ids(q) == ["a1", "a2", "a3", "b1", "x"]  # 3 waiters under a, 1 under b, x at the root


def test_cache_aware_policy_without_radix_cache_is_fcfs():
    sched = make_sched(enable_radix_cache=False)
    q = [req("b", 5, max_tokens=1), req("a", 5, max_tokens=9)]
    calc_priority("lpm", q, _queue_ctx(sched))
    assert _ids(q) == ["b", "a"]


# --- priority preemption ------------------------------------------------------------------------------
def test_priority_preemption_respects_the_threshold():
    for threshold, expect in ((5, {"low"}), (20, set())):
        sched = make_sched(max_running_requests=1, enable_priority_scheduling=True,
                           priority_scheduling_preemption_threshold=threshold)
        sched.add_request(req("low", 10, max_tokens=20, priority=10))
        step(sched)
        step(sched)
        sched.add_request(req("high", 10, max_tokens=5, priority=0))
        so, _ = step(sched)
        assert so.preempted_req_ids == expect
        if expect:
            assert list(so.num_scheduled_tokens) == ["high"] and sched.waiting[0].request_id == "low"
        run_to_end(sched)


# --- output shape and overlap -------------------------------------------------------------------------
def test_output_reports_cached_prefix_and_block_deltas():
    sched = make_sched(page_size=4)
    sched.add_request(req("a", list(range(100, 120)), max_tokens=3))
    run_to_end(sched)
    sched.add_request(req("b", list(range(100, 120)) + [1, 2, 3, 4, 5], max_tokens=6))
    so, _ = step(sched)
    nr = so.scheduled_new_reqs[0]
    assert nr.num_computed_tokens == 20 and len(nr.block_ids[0]) == 7  # 5 cached pages + 2 new
    assert so.num_scheduled_tokens == {"b": 5}
    new_blocks = [step(sched)[0].scheduled_cached_reqs.new_block_ids[0] for _ in range(4)]
    assert new_blocks[:3] == [None] * 3  # positions 25..27 are in the 7th page
    assert new_blocks[3] is not None and len(new_blocks[3][0]) == 1  # position 28 starts the 8th


def test_overlap_allowed_consecutive_prefill_exception():
    sched = make_sched(overlap_schedule=True, disable_consecutive_prefill_overlap=True)
    sched.add_request(req("a", 10, max_tokens=3))
    so1 = sched.schedule()  # prefill a
    sched.add_request(req("b", 10, max_tokens=3))
    so2 = sched.schedule()  # prefill b, scheduled while a's prefill is in flight
    assert not sched.overlap_allowed(so1, so2)
    ids = list(so1.num_scheduled_tokens)
    sched.update_from_output(so1, ModelRunnerOutput(ids, {r: i for i, r in enumerate(ids)}, [[7]]))
    so3 = sched.schedule()  # decode a and b
    assert so3.num_scheduled_tokens == {"a": 1, "b": 1} and sched.overlap_allowed(so2, so3)
    assert not make_sched().overlap_allowed(so2, so3)  # overlap off: never
    assert make_sched(overlap_schedule=True).overlap_allowed(so1, so2)  # exception off by default


def test_ignore_eos_without_radix_cache_simulates_decode_exactly():
    """SGLang's add_one_req_ignore_eos: with ignore_eos and no radix cache, admission checks that
    finishing requests in order of remaining tokens never runs out of KV (the ratio path would
    admit this one: 20 + 40 < 100 - 50 * 0.7)."""
    running = req("run", 10, max_tokens=50, ignore_eos=True)
    for ignore_eos, expect in ((True, AddReqResult.NO_TOKEN), (False, AddReqResult.CONTINUE)):
        sched = make_sched(max_total_tokens=100, enable_radix_cache=False)
        new = req("new", 20, max_tokens=40, ignore_eos=ignore_eos)
        if not ignore_eos:
            sched.kv_cache_manager.cache_enabled = True  # the ratio path
        assert _adder(sched, [running]).add_one_req(new, _rnd(new)) == expect


def test_overlap_schedules_before_results_and_drops_the_extra_forward():
    sched = make_sched(overlap_schedule=True)
    sched.add_request(req("a", 10, max_tokens=2))

    def apply(so):
        ids = list(so.num_scheduled_tokens)
        return sched.update_from_output(so, ModelRunnerOutput(ids, {r: i for i, r in enumerate(ids)}, [[7]] * len(ids)))

    so1 = sched.schedule()  # prefill
    so2 = sched.schedule()  # a decodes before its first token is known (merged prefill batch)
    assert so2.num_scheduled_tokens == {"a": 1} and so2.scheduled_cached_reqs.num_output_tokens == [1]
    apply(so1)
    so3 = sched.schedule()  # a is not known to be finished yet: the extra forward
    assert so3.num_scheduled_tokens == {"a": 1}
    assert apply(so2).finished_req_ids == ["a"]
    assert apply(so3).outputs == []  # its token is dropped
    sched.check_invariants()
    assert sched.schedule().finished_req_ids == {"a"} and not sched.has_unfinished_requests()
