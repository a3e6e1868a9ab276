"""Macro-steps give byte-identical results to stepping (the differential harness), and stay off
where they cannot be exact."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pandas as pd
import pytest

from servesim.differential import cases, compare
from servesim.overrides import apply_overrides
from servesim.running import load_trace
from servesim.simulator.config import SimConfig
from servesim.simulator.build import build_engine
from servesim.traces.errors import InputError
from servesim.traces.synthetic import make_workload

FAST_CASES = ("golden:async_small_pool", "golden:fcfs_default", "golden:small_pool_priority",
              "golden:no_prefix_caching")


def _pair(sets: dict, wl):
    """(plain result, macro result, macro engine) for one config."""
    cfg = apply_overrides(SimConfig(), sets)
    plain = build_engine(dataclasses.replace(cfg, macro_steps=False), wl).run()
    eng = build_engine(dataclasses.replace(cfg, macro_steps=True), wl)
    macro = eng.run()
    pd.testing.assert_frame_equal(plain.metrics.requests_frame(), macro.metrics.requests_frame(), check_exact=True)
    pd.testing.assert_frame_equal(plain.metrics.steps_frame(), macro.metrics.steps_frame(), check_exact=True)
    assert (plain.prefix_hits, plain.prefix_queries, plain.num_steps) == (macro.prefix_hits, macro.prefix_queries,
                                                                         macro.num_steps)
    return plain, macro, eng


def _light_load(n: int = 60):
    return make_workload("poisson", {"num_requests": n, "arrival": {"rate_per_s": 2.0},
                                     "prompt_len": {"dist": "uniform", "low": 50, "high": 600},
                                     "output_len": {"dist": "uniform", "low": 20, "high": 300}},
                         np.random.default_rng(1))


@pytest.mark.parametrize("async_", [True, False])
def test_light_load_is_mostly_macro_stepped_and_identical(async_):
    _, macro, eng = _pair({"scheduler.async_scheduling": async_}, _light_load())
    assert eng.planner_declined is None
    assert eng.planner.num_macro_steps > macro.num_steps // 2


@pytest.mark.parametrize("sets", [
    {},
    {"scheduler.max_model_len": 400},  # some prompts refused at arrival (rejections mark progress)
    {"client.timeout_s": 3.0},  # client deadlines
    {"scheduler.policy": "priority"},
    # CPU-bound steps: a step's start reads its own batch's CPU time (the batch shrinks at finishes)
    {"cost_model.cpu_overhead.per_request_s": 0.004, "cost_model.cpu_overhead.fixed_s": 0.01},
])
def test_runs_end_with_an_update_past_the_arrival(sets):
    """A run cut by an arrival applies the update due after it too (fastpath/planner.py, MacroPlanner._past_arrival):
    the arrival is added afterwards, and the results are still those of stepping."""
    wl = make_workload("poisson", {"num_requests": 120, "arrival": {"rate_per_s": 6.0},
                                   "prompt_len": {"dist": "uniform", "low": 50, "high": 600},
                                   "output_len": {"dist": "uniform", "low": 20, "high": 300},
                                   "priority": {"values": [0, 1]}}, np.random.default_rng(5))
    plain, macro, eng = _pair(sets, wl)
    assert eng.planner.num_runs_past_arrival > 20
    if "scheduler.max_model_len" in sets:
        assert (plain.metrics.requests_frame()["reject_reason"].notna()).sum() > 5


@pytest.mark.parametrize("sets", [
    {"cache.num_gpu_blocks": 400, "scheduler.max_model_len": 6400},  # KV pressure: preemptions between runs
    {"cache.enable_prefix_caching": False, "scheduler.max_num_seqs": 8},  # full batch, waiting queue non-empty
    {"client.timeout_s": 4.0},  # client deadlines bound the runs
])
@pytest.mark.parametrize("async_", [True, False])
def test_bundled_sample_identical_under_pressure(sets, async_):
    _, _, eng = _pair({**sets, "scheduler.async_scheduling": async_}, load_trace(None, max_requests=80))
    assert eng.planner.num_macro_steps > 0


@pytest.mark.parametrize("name", FAST_CASES)
def test_differential_harness_fast_cases(name, tmp_path):
    (case,) = [c for c in cases() if c.name == name]
    out = compare(case, tmp_path)
    assert out.ok, out.mismatches


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in cases() if c.name not in FAST_CASES], ids=lambda c: c.name)
def test_differential_harness(case, tmp_path):
    out = compare(case, tmp_path)
    assert out.ok, out.mismatches


def test_harness_covers_every_shipped_input():
    names = {c.name.split(":")[0] for c in cases()}
    assert names == {"scenario", "cluster", "trace", "golden"}
    assert len([c for c in cases() if c.name.startswith("golden:")]) >= 40


@pytest.mark.parametrize("sets, reason", [
    ({"scheduler.policy": "continuum"}, "continuum"),
    ({"macro_steps": False}, "off"),
])
def test_fallbacks_say_why(sets, reason):
    eng = build_engine(apply_overrides(SimConfig(), sets), load_trace(None, max_requests=3))
    assert reason in eng.planner_declined
    eng.run()
    assert eng.planner is None  # declined: the reference engine steps every step


def test_step_trace_falls_back(tmp_path):
    import io

    eng = build_engine(SimConfig(), load_trace(None, max_requests=3), step_trace=io.StringIO())
    assert "step trace" in eng.planner_declined


def test_option_is_validated_and_fast_forward_is_a_deprecated_alias():
    with pytest.raises(InputError, match="macro_steps"):
        apply_overrides(SimConfig(), {"macro_steps": "maybe"})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = SimConfig(fast_forward=True)
    assert cfg.macro_steps and not cfg.fast_forward
    assert any("deprecated" in str(w.message) for w in caught)
    # Asking for both the alias and macro-steps off is a contradiction, refused naming the field.
    with pytest.raises(InputError, match="field 'fast_forward'.*macro_steps is false"):
        SimConfig(macro_steps=False, fast_forward=True)


def test_bulk_tokens_and_step_times_equal_the_per_step_ones():
    import random

    from servesim.scheduler.oracle_trace import oracle_token
    from servesim.scheduler.worker import TokenSource
    from servesim.simulator.cost_model import make_cost_model
    from servesim.simulator.cost_model.base import StepShape, decode_step_times_s

    for rid in ("r0", "llmservingsim-17", "é-unicode"):
        # decade and digit-count boundaries (the register is shared within a decade), none, one
        for k, n in ((5, 300), (4000, 200), (5000, 3), (0, 0), (0, 1), (9, 2), (99, 3), (10, 10),
                     (999_999, 5), (10**12 - 3, 7)):
            assert TokenSource().tokens(rid, k, n) == [oracle_token(rid, j) for j in range(k, k + n)]
    shared = TokenSource()  # its registers carry over from call to call, positions in any order
    pick = random.Random(1)
    for _ in range(500):
        rid, k, n = pick.choice(("r0", "r1")), pick.randrange(0, 3000), pick.randrange(0, 25)
        assert shared.tokens(rid, k, n) == [oracle_token(rid, j) for j in range(k, k + n)]
    # one position of each of several streams in one call (a run's step), on the same registers
    for _ in range(300):
        rids = [pick.choice(("r0", "r1", "é-unicode")) for _ in range(pick.randrange(0, 6))]
        positions = [pick.choice((pick.randrange(0, 3000), 10**12 - pick.randrange(1, 4))) for _ in rids]
        assert shared.tokens_at(rids, positions) == [oracle_token(r, k) for r, k in zip(rids, positions)]
    rng = random.Random(0)
    # dense TP1, dense TP4 (all-reduce), MoE (expert term), and the calibrated fit
    for name, model, tp in (("roofline", "llama-3.1-8b", 1), ("roofline", "llama-3.1-70b", 4),
                            ("roofline", "qwen3-30b-a3b", 2), ("calibrated", "llama-3.1-8b", 1)):
        cm = make_cost_model(name, model=model, gpu="h100", tp=tp)
        for _ in range(20):
            ctx = [rng.randint(1, 8000) for _ in range(rng.randint(1, 256))]
            ref = [cm.step_time_s(StepShape((1,) * len(ctx), tuple(c + j for c in ctx), len(ctx))) for j in range(40)]
            assert decode_step_times_s(cm, ctx, 40) == ref


def _random_case(seed: int):
    """A random small config and workload (KV pressure, small batches, deadlines, closed loops...)."""
    import random

    rng = random.Random(seed)
    sets: dict = {"scheduler.async_scheduling": rng.random() < 0.6}
    if rng.random() < 0.5:
        sets.update({"cache.num_gpu_blocks": rng.choice([120, 200, 400, 1000]), "scheduler.max_model_len": 1800})
    for key, p, values in (("cache.block_size", 0.3, [16, 32]), ("scheduler.max_num_seqs", 0.3, [2, 4, 8, 16]),
                           ("scheduler.max_num_batched_tokens", 0.3, [64, 256, 512]),
                           ("cache.enable_prefix_caching", 0.3, [False]), ("scheduler.policy", 0.3, ["priority"]),
                           ("client.timeout_s", 0.2, [0.5, 2.0, 5.0]), ("client.max_concurrency", 0.2, [1, 3, 10]),
                           ("scheduler.long_prefill_token_threshold", 0.2, [32, 128]),
                           ("frontend.enabled", 0.15, [True])):
        if rng.random() < p:
            sets[key] = rng.choice(values)
    wl = make_workload("poisson", {"num_requests": rng.randint(5, 80),
                                   "arrival": {"rate_per_s": rng.choice([0.5, 2.0, 10.0, 100.0])},
                                   "prompt_len": {"dist": "uniform", "low": 1, "high": rng.choice([50, 600, 1500])},
                                   "output_len": {"dist": "uniform", "low": 1, "high": rng.choice([3, 40, 300])}},
                       np.random.default_rng(seed))
    return sets, wl


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(24))
def test_random_configs_identical(seed):
    sets, wl = _random_case(seed)
    try:
        apply_overrides(SimConfig(), sets)
    except InputError:
        pytest.skip("a configuration vLLM refuses at start-up")
    _pair(sets, wl)


def _kv_bound_load(kind: str, seed: int = 3):
    """Bursty arrivals into a small pool: the waiting head is refused blocks for most steps."""
    cfg: dict = {"num_requests": 80, "arrival": {"rate_per_s": 50.0},
                 "prompt_len": {"dist": "uniform", "low": 100, "high": 700},
                 "output_len": {"dist": "uniform", "low": 100, "high": 500}}
    if kind != "plain":  # shared prefixes: the head hits cached blocks, some of them evictable
        cfg["prefix"] = {"num_groups": 12, "prefix_len": {"dist": "uniform", "low": 64, "high": 400}, "fraction": 0.8}
    if kind == "priority":
        cfg["priority"] = {"values": [0, 1, 2]}
    return make_workload("poisson", cfg, np.random.default_rng(seed))


@pytest.mark.parametrize("kind, sets", [
    ("plain", {}), ("prefix", {}), ("prefix", {"scheduler.enable_chunked_prefill": False}),
    ("priority", {"scheduler.policy": "priority"}),
])
@pytest.mark.parametrize("async_", [True, False])
def test_runs_pass_a_waiting_head_refused_blocks(kind, sets, async_):
    """Runs go on while the waiting head stays blocked by KV (its lookup recorded every step)."""
    sets = {"cache.num_gpu_blocks": 300, "scheduler.max_model_len": 2048, "scheduler.async_scheduling": async_,
            **sets}
    if "scheduler.enable_chunked_prefill" in sets:
        sets["scheduler.max_num_batched_tokens"] = 2048
    plain, macro, eng = _pair(sets, _kv_bound_load(kind))
    st = plain.metrics.steps_frame()
    # Steps with a request waiting below max_num_seqs: no run could include them before.
    blocked = int(((st.num_waiting > 0) & (st.num_prefill_tokens == 0)).sum())
    assert eng.planner.num_macro_steps + blocked - macro.num_steps > macro.num_steps // 3
    if kind != "plain":
        assert ((st.num_waiting > 0) & (st.num_prefill_tokens == 0) & (st.prefix_hit_tokens > 0)).sum() > 100


def test_run_stops_before_the_heads_next_block_is_cached():
    """A decoding request about to cache the block the waiting head misses first ends the run
    right there: the next lookup hits one block more (stepping shows it at that very step)."""
    from sched_helpers import make_sched, req, runs_of, step

    sched = make_sched(num_blocks=20, block_size=4, max_num_batched_tokens=64, max_model_len=256)
    sched.add_request(req(sched, "a", list(range(1, 10)), max_tokens=60))
    step(sched)  # prefill: 9 tokens computed (3 blocks, 2 cached), a 7 sampled
    # b's prompt starts with a's tokens as they will be (samples are 7s); 19 blocks: one too many.
    sched.add_request(req(sched, "b", list(range(1, 10)) + [7] * 10 + [99] * 57))
    k = runs_of(sched).decode_run_horizon(100, 0)
    assert k == 2  # a caches its block 2 (9, 7, 7, 7) at the third schedule
    hits = [step(sched)[1].scheduler_stats.prefix_cache_stats.hits for _ in range(k + 1)]
    assert hits == [8] * k + [12]
    assert len(sched.running) == 2  # the longer hit let b in
