"""A prompt joining a run of verify steps at its first schedule (scheduler/bulk/spec_join.py): the
run's schedule 0 admits the one waiting request behind the batch's verifies, and the whole
outputs stay those of stepping (requests, steps, prefix stats)."""

from __future__ import annotations

import numpy as np

import pytest

from servesim.scheduler.bulk.spec_join import SpecJoin, hit_survives_verifies
from servesim.traces.synthetic import make_workload
from inner_loop import share  # tests/inner_loop.py
from sched_helpers import make_sched, req, step
from test_spec_runs import _pair, _spec


def _load(n: int, rate: float, seed: int, out: tuple[int, int], prefix: bool):
    cfg: dict = {"num_requests": n, "arrival": {"rate_per_s": rate},
                 "prompt_len": {"dist": "uniform", "low": 30, "high": 700},
                 "output_len": {"dist": "uniform", "low": out[0], "high": out[1]}}
    if prefix:  # shared prefixes: a joiner hits cached blocks, some of them free (evictable)
        cfg["prefix"] = {"num_groups": 6, "prefix_len": {"dist": "uniform", "low": 32, "high": 400}, "fraction": 0.8}
    return make_workload("poisson", cfg, np.random.default_rng(seed))


def test_arrivals_join_runs_identical():
    """Light load: nearly every arrival finds a steady batch and joins a run there."""
    eng, macro = _pair(_spec([0.7, 0.7, 0.7]), _load(60, 3.0, 1, (20, 300), False))
    assert eng.planner.num_joined > 40
    assert eng.planner.num_macro_steps > macro.num_steps * 4 // 5


@pytest.mark.parametrize("sets", share([
    {},
    # a small pool: verifies evict cached blocks (a joiner's free hit blocks among them), runs cut by KV
    {"cache.num_gpu_blocks": 260, "scheduler.max_model_len": 2048},
    {"cache.num_gpu_blocks": 400, "cache.block_size": 32, "scheduler.max_model_len": 2048},
    # the budget: a prompt joins only where it fits behind the verifies' tokens
    {"scheduler.max_num_batched_tokens": 512, "scheduler.max_num_seqs": 8},
    {"scheduler.max_model_len": 720},  # joiners near max_model_len
    {"scheduler.spec_method": "eagle"},  # no joins (a drafting model's lookahead): runs still identical
    {"cost_model.name": "calibrated"},  # every step priced on its StepShape
], [0, 1, 3]))
@pytest.mark.parametrize("prefix", [False, True])
def test_joins_identical_under_pressure(sets, prefix):
    eng, _ = _pair(_spec([0.8, 0.6, 0.4], **sets), _load(90, 8.0, 4, (5, 400), prefix))
    if "scheduler.spec_method" not in sets:
        assert eng.planner.num_joined > 0


def test_joiners_finishing_inside_their_first_runs():
    """Outputs of 1 to 6 tokens: a joiner's max_tokens stops it at update 1 (skipped at schedule 1)
    or a few updates on, inside the run it joined (the run goes through finishes)."""
    eng, _ = _pair(_spec([0.9, 0.9]), _load(120, 20.0, 7, (1, 6), True))
    assert eng.planner.num_joined > 10 and eng.planner.num_bulk_finishes > 20


@pytest.mark.parametrize("sets", [
    {},
    {"scheduler.long_prefill_token_threshold": 1024},  # chunks cut by the threshold: the last one joins
    {"cache.num_gpu_blocks": 450, "scheduler.max_model_len": 6000},  # a small pool: the last chunk's blocks
])
def test_long_prompts_last_chunks_join_runs_identical(sets):
    """Prompts longer than the token budget are chunked; the run's schedule 0 computes the last
    chunk of the last running one behind the verifies (a running joiner), also alone (nothing
    else running)."""
    wl = make_workload("poisson", {"num_requests": 50, "arrival": {"rate_per_s": 2.0},
                                   "prompt_len": {"dist": "uniform", "low": 200, "high": 5000},
                                   "output_len": {"dist": "uniform", "low": 5, "high": 300}},
                       np.random.default_rng(11))
    eng, _ = _pair(_spec([0.7, 0.5], **{"scheduler.max_model_len": 6000, **sets}), wl)
    assert eng.planner.num_chunks_joined > 5 and eng.planner.num_joined > 5


def test_no_join_in_the_sync_loop():
    """Sync: a request waiting at a loop top is scheduled by a stepped step (no join)."""
    eng, _ = _pair(_spec([0.7, 0.7], **{"scheduler.async_scheduling": False}), _load(40, 3.0, 2, (20, 200), False))
    assert eng.planner.num_joined == eng.planner.num_chunks_joined == 0 and eng.planner.num_macro_runs > 0


def _joining(sched, tokens: list[int]) -> SpecJoin:
    w = req(sched, "w", tokens)
    hit, num_hit = sched.kv_cache_manager.peek_computed_blocks(w)
    num_blocks = -(-w.num_tokens // sched.block_size)
    return SpecJoin(w, hit, num_hit, w.num_tokens - num_hit, num_blocks, num_blocks)


def test_a_verify_popping_a_free_block_of_the_hit_refuses_it():
    """The joiner's hit is two free blocks at the free queue's front: a verify of schedule 0 that
    allocates a block takes the first, and the lookup behind it finds less (stepping shows it)."""
    sched = make_sched(num_blocks=10, block_size=4)
    prompt = list(range(1, 9))
    sched.add_request(req(sched, "a", prompt, max_tokens=1))
    step(sched)  # a computes its 2 blocks, caches them and finishes: both free, cached
    pool = sched.kv_cache_manager.block_pool
    sched.add_request(req(sched, "b", 4 * (pool.get_num_free_blocks() - 2), max_tokens=50))
    step(sched)  # b takes every block never used: a's two are all that is free
    join = _joining(sched, prompt + [500, 501, 502, 503])
    assert join.num_hit_tokens == 8 and pool.get_num_free_blocks() == 2
    b = sched.running[0]
    assert not hit_survives_verifies(sched, [b], [b.num_computed_tokens], join, 1)
    assert hit_survives_verifies(sched, [b], [b.num_computed_tokens], join, 0)
    step(sched)  # b's next token needs a block: a's first one goes
    assert sched.kv_cache_manager.peek_computed_blocks(join.request)[1] == 4


def test_a_verify_caching_the_first_missing_block_refuses_it():
    """A running request whose next schedule caches the block the joiner misses first (same
    tokens): the lookup behind it would hit one block more."""
    sched = make_sched(num_blocks=20, block_size=4)
    prompt = [11, 12, 13, 14, 15, 16, 17]
    sched.add_request(req(sched, "b", prompt, max_tokens=50))
    step(sched)  # b computes 7 tokens (1 block cached) and samples a 7: its block 1 is full, uncached
    b = sched.running[0]
    join = _joining(sched, prompt + [7, 40, 41, 42, 43, 44])
    assert join.num_hit_tokens == 4
    assert not hit_survives_verifies(sched, [b], [b.num_computed_tokens], join, 0)
    other = _joining(sched, prompt + [8, 40, 41, 42, 43, 44])  # its block 1 differs: b's caching is no hit
    assert hit_survives_verifies(sched, [b], [b.num_computed_tokens], other, 0)
    step(sched)
    assert sched.kv_cache_manager.peek_computed_blocks(join.request)[1] == 8
