"""SGLang's EAGLE / MTP speculative decoding (chain drafts): verify steps of 1 + k tokens, the KV
they take, rejected drafts rolled back, the decode memory check's multiplier, the engine run
(acceptance drawn by the executor's seeded model) and the fast path declining hybrid and
speculative runs with a stated reason."""

from __future__ import annotations

import numpy as np
import pytest

from servesim.scheduler import CacheConfig, ModelRunnerOutput, Request, SamplingParams, SchedulerConfig
from servesim.scheduler.sglang import SGLangConfig, SGLangScheduler
from servesim.scheduler.sglang.hybrid_config import MambaCacheConfig
from servesim.simulator.build import attach_planner
from servesim.simulator.config import SimConfig, SpecDecodeConfig
from servesim.simulator.engine import Engine
from servesim.simulator.outputs import build_summary
from servesim.simulator.scheduler_kinds.sglang import map_sglang_config
from servesim.traces.synthetic import make_workload

BASE = dict(max_running_requests=8, chunked_prefill_size=64, enable_chunked_prefill=True, page_size=1,
            max_total_tokens=1000, enable_radix_cache=True, overlap_schedule=False, seed=0)


def make_sched(**kw) -> SGLangScheduler:
    return SGLangScheduler(SGLangConfig(**{**BASE, "speculative_num_steps": 2, **kw}), 4096)


def req(rid: str, n: int, max_tokens: int = 10) -> Request:
    return Request(rid, [ord(rid)] * n, SamplingParams(max_tokens=max_tokens, ignore_eos=True))


def update(sched: SGLangScheduler, so, tokens: dict[str, list[int]]):
    ids = list(so.num_scheduled_tokens)
    out = ModelRunnerOutput(ids, {r: i for i, r in enumerate(ids)}, [tokens.get(r, []) for r in ids])
    eco = sched.update_from_output(so, out)
    sched.check_invariants()
    return eco


def test_a_verify_step_schedules_one_plus_k_tokens_and_rolls_back_rejected_drafts():
    sched = make_sched()
    sched.add_request(req("a", 10))
    so = sched.schedule()
    assert so.num_scheduled_tokens == {"a": 10} and so.scheduled_spec_decode_tokens == {}
    update(sched, so, {"a": [5]})
    so = sched.schedule()  # verify: the last token plus 2 draft placeholders
    assert so.num_scheduled_tokens == {"a": 3} and so.scheduled_spec_decode_tokens == {"a": [-1, -1]}
    assert so.scheduled_cached_reqs.num_computed_tokens == [10]
    assert len(sched.kv_cache_manager.reqs["a"].pages) == 13
    eco = update(sched, so, {"a": [6, 6]})  # one draft accepted, plus the bonus token
    a = sched.requests["a"]
    assert (a.num_output_tokens, a.num_computed_tokens) == (3, 12)
    stats = eco.scheduler_stats.spec_decoding_stats
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens,
            stats.num_accepted_tokens_per_pos) == (1, 2, 1, [1, 0])
    so = sched.schedule()  # from 12 computed: KV to 15 tokens (the rejected draft's slot reused)
    assert so.scheduled_cached_reqs.num_computed_tokens == [12]
    assert len(sched.kv_cache_manager.reqs["a"].pages) == 15
    update(sched, so, {"a": [7, 7, 7]})  # all accepted
    assert (a.num_output_tokens, a.num_computed_tokens) == (6, 15)


def test_overlap_schedules_the_next_verify_before_the_acceptance_is_known():
    sched = make_sched(overlap_schedule=True, enable_spec_v2=True)
    sched.add_request(req("a", 10))
    update(sched, sched.schedule(), {"a": [5]})
    s1 = sched.schedule()
    s2 = sched.schedule()  # optimistic: as if every draft of s1 were accepted
    assert s2.scheduled_cached_reqs.num_computed_tokens == [13]
    update(sched, s1, {"a": [6]})  # none accepted
    update(sched, s2, {"a": [6, 6, 6]})
    a = sched.requests["a"]
    assert (a.num_output_tokens, a.num_computed_tokens) == (5, 14)  # 14 = prompt + outputs - 1


def test_decode_memory_check_reserves_draft_and_verify_tokens():
    sched = make_sched()
    for rid in "ab":
        sched.add_request(req(rid, 10))
    so = sched.schedule()
    update(sched, so, {"a": [1], "b": [1]})
    mem, running = sched.kv_cache_manager, [sched.requests[r] for r in "ab"]
    # SGLang's buf multiplier: 2 requests x (3 verify + 2 draft tokens), page size 1
    assert mem.decode_tokens_needed(running, 3, 5) == 10
    free = mem.pool.available_size()
    assert sched._check_decode_mem(running)
    mem.pool.alloc(free - 9)  # one token short of the reservation: the check fails
    assert not sched._check_decode_mem(running)
    # Pages of 16: only a request at a page boundary counts in SGLang's figure, but a verify step
    # whose tokens cross a boundary takes a page anyway.
    big = make_sched(page_size=16, max_total_tokens=1600)
    big.add_request(req("c", 15))
    update(big, big.schedule(), {"c": [1]})
    c = big.requests["c"]
    assert (c.num_computed_tokens, len(big.kv_cache_manager.reqs["c"].pages)) == (15, 1)
    assert big.kv_cache_manager.decode_tokens_needed([c], 3, 5) == 16
    assert big.kv_cache_manager.decode_tokens_needed([c], 1, 1) == 0


def test_speculative_config_is_checked_and_inherited():
    with pytest.raises(ValueError, match="speculative_eagle_topk must be 1"):
        SGLangConfig(speculative_num_steps=3, speculative_eagle_topk=4)
    with pytest.raises(ValueError, match="must be speculative_num_steps \\+ 1 \\(4\\)"):
        SGLangConfig(speculative_num_steps=3, speculative_num_draft_tokens=8)
    with pytest.raises(ValueError, match="enable_mixed_chunk is not supported"):
        SGLangConfig(speculative_num_steps=3, enable_mixed_chunk=True)
    cc = CacheConfig(block_size=16, num_gpu_blocks=101)
    m = map_sglang_config(SchedulerConfig(max_num_seqs=4, num_spec_tokens=3), cc)
    # num_spec_tokens -> speculative_num_steps; the pool gains draft + verify headroom
    assert (m.speculative_num_steps, m.max_total_tokens) == (3, 1600 + 4 * (3 + 4) + 100)  # 108 pages
    # Without spec v2 SGLang turns the overlap schedule off for EAGLE / MTP; with it, it stays on.
    async_sc = SchedulerConfig(max_num_seqs=4, num_spec_tokens=3, async_scheduling=True)
    assert not map_sglang_config(async_sc, cc).overlap_schedule
    assert not map_sglang_config(async_sc, cc, SGLangConfig(overlap_schedule=True)).overlap_schedule
    assert map_sglang_config(async_sc, cc, SGLangConfig(enable_spec_v2=True)).overlap_schedule
    with pytest.raises(ValueError, match="needs enable_spec_v2"):
        SGLangConfig(speculative_num_steps=2, overlap_schedule=True)
    with pytest.raises(ValueError, match="differs from scheduler.num_spec_tokens"):
        map_sglang_config(SchedulerConfig(num_spec_tokens=2), cc, SGLangConfig(speculative_num_steps=3))


# --- the engine ---------------------------------------------------------------------------------------
def _run(num_spec_tokens: int = 0, mamba: MambaCacheConfig | None = None, page_size: int | None = None) -> dict:
    wl = make_workload("sessions", {
        "num_requests": 24, "arrival": {"rate_per_s": 4.0}, "prompt_len": {"dist": "fixed", "value": 256},
        "output_len": {"dist": "fixed", "value": 16},
        "sessions": {"num_turns": {"dist": "fixed", "value": 3}, "think_time_s": {"dist": "fixed", "value": 2.0}}},
        np.random.default_rng(0))
    cfg = SimConfig(engine="sglang", scheduler=SchedulerConfig(max_model_len=4096, num_spec_tokens=num_spec_tokens),
                    spec_decode=SpecDecodeConfig(acceptance=(0.8, 0.6)[:num_spec_tokens]),
                    cache=CacheConfig(block_size=16, num_gpu_blocks=450), derive_num_gpu_blocks=False,
                    sglang=SGLangConfig(page_size=page_size, mamba=mamba or MambaCacheConfig()))
    return build_summary(cfg, attach_planner(Engine(cfg, wl)).run(), 24)


def test_engine_runs_mtp_with_fewer_steps_and_declines_the_fast_path():
    plain, spec = _run(), _run(num_spec_tokens=2)
    assert plain["num_finished"] == spec["num_finished"] == 24
    assert plain["fast_path"]["used"] and not spec["fast_path"]["used"]
    assert "speculative decoding" in spec["fast_path"]["declined_reason"]
    assert spec["num_steps"] < plain["num_steps"]
    again = _run(num_spec_tokens=2)
    drop = ("wall_time_s", "sim_speedup_x")
    assert {k: v for k, v in spec.items() if k not in drop} == {k: v for k, v in again.items() if k not in drop}


def test_engine_runs_a_hybrid_model_and_declines_the_fast_path():
    hybrid = _run(mamba=MambaCacheConfig(num_mamba_layers=36, max_mamba_cache_size=60), page_size=1)
    assert hybrid["num_finished"] == 24 and hybrid["prefix_cache_hit_tokens"] > 0
    assert not hybrid["fast_path"]["used"]
    assert "SGLang hybrid (Mamba)" in hybrid["fast_path"]["declined_reason"]


# --- randomized: hybrid cache x MTP x overlap under memory pressure ------------------------------------
@pytest.mark.parametrize("seed", range(12))
def test_random_multi_turn_runs_keep_every_invariant(seed):
    """Tight KV and few states (KV and state evictions, retractions), follow-up turns that resume
    from cached states, random acceptance, overlap on odd seeds: the scheduler's invariants (KV
    pages and state slots conserved, locks, no locked state freed) hold after every call."""
    import random

    rng = random.Random(seed)
    k = 2 if seed % 3 else 0
    slots = 9 if seed < 6 else 15  # few states: state evictions; more requests: retractions
    mamba = MambaCacheConfig(num_mamba_layers=2, max_mamba_cache_size=slots)
    sched = SGLangScheduler(SGLangConfig(**{**BASE, "max_total_tokens": 200, "max_running_requests": slots // 3,
                                            "chunked_prefill_size": 32, "overlap_schedule": bool(seed % 2)},
                                         new_token_ratio_decay_steps=1, speculative_num_steps=k, enable_spec_v2=True,
                                         mamba=mamba), 4096)
    made = 0
    live: list[Request] = []

    def add(prompt: list[int]) -> None:
        nonlocal made
        r = Request(f"r{made}", prompt, SamplingParams(max_tokens=rng.randint(1, 80), ignore_eos=True))
        made += 1
        live.append(r)
        sched.add_request(r)

    for _ in range(4):
        add([rng.randint(1, 3) for _ in range(rng.randint(5, 40))])
    in_flight: list = []
    for _ in range(3000):
        if sched.has_unfinished_requests():
            in_flight.append(sched.schedule())
            sched.check_invariants()
            if len(in_flight) < sched.capabilities.max_steps_in_flight:
                continue
        elif not in_flight:
            break
        so = in_flight.pop(0)
        info = sched._steps[id(so)][1]
        ids = list(so.num_scheduled_tokens)
        toks = [[5] * (1 + (rng.randint(0, k) if r in so.scheduled_spec_decode_tokens else 0))
                if r in info.sampling else [] for r in ids]
        sched.update_from_output(so, ModelRunnerOutput(ids, {r: i for i, r in enumerate(ids)}, toks))
        sched.check_invariants()
        for r in [r for r in live if r.is_finished()]:
            live.remove(r)
            if made < 40 and rng.random() < 0.8:  # the next turn extends this conversation
                add(list(r.all_token_ids) + [rng.randint(1, 3) for _ in range(rng.randint(1, 20))])
    else:
        raise AssertionError("did not finish")
    assert made >= 4 and not sched.requests
    mem = sched.kv_cache_manager
    assert mem.mamba_pool.available_size() + len(mem.mamba_tree.mamba_nodes) == slots
