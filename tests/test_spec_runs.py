"""Speculative decoding on the fast path (simulator/fastpath/spec_runs.py, scheduler/bulk/spec.py):
runs of verify steps give byte-identical outputs to stepping, and decline what they cannot prove."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from servesim.overrides import apply_overrides
from servesim.running import load_trace
from servesim.scheduler.worker import TokenSource
from servesim.simulator.build import build_engine
from servesim.simulator.config import SimConfig
from servesim.simulator.summary import summarize
from servesim.traces.errors import InputError
from servesim.traces.synthetic import make_workload


def _workload(n: int = 60, rate: float = 3.0, seed: int = 1, out: tuple[int, int] = (20, 300)):
    return make_workload("poisson", {"num_requests": n, "arrival": {"rate_per_s": rate},
                                     "prompt_len": {"dist": "uniform", "low": 50, "high": 600},
                                     "output_len": {"dist": "uniform", "low": out[0], "high": out[1]}},
                         np.random.default_rng(seed))


def _pair(sets: dict, wl):
    """Run with and without the fast path; whole outputs must be equal (test_macro_steps._pair:
    requests, steps, prefix stats, step count), the summaries too. Returns the macro engine."""
    from test_macro_steps import _pair as whole_pair

    plain, macro, eng = whole_pair(sets, wl)
    cfg = apply_overrides(SimConfig(), sets)
    summaries = [json.dumps(summarize(r.metrics, r.sim_duration_s, 0.0, cfg.slo, len(wl.requests), r.prefix_hits,
                                      r.prefix_queries), sort_keys=True, default=str) for r in (plain, macro)]
    assert summaries[0] == summaries[1]
    return eng, macro


def _spec(acceptance: list[float], **more) -> dict:
    return {"scheduler.num_spec_tokens": len(acceptance), "spec_decode.acceptance": acceptance, **more}


@pytest.mark.parametrize("async_", [True, False])
@pytest.mark.parametrize("acceptance", [[0.0], [1.0, 1.0], [0.7, 0.7, 0.7], [0.9, 0.5, 0.8, 0.2]])
def test_verify_runs_identical_and_mostly_bulk(async_, acceptance):
    eng, macro = _pair(_spec(acceptance, **{"scheduler.async_scheduling": async_}), _workload())
    assert eng.planner_declined is None
    assert eng.planner.num_macro_steps > macro.num_steps * 3 // 4  # light load: most steps in runs


@pytest.mark.parametrize("sets", [
    # a tight pool: waiting requests and preemptions (runs stop; the steps between are stepped)
    {"cache.num_gpu_blocks": 300, "scheduler.max_model_len": 2048},
    {"cache.num_gpu_blocks": 300, "scheduler.max_model_len": 2048, "scheduler.async_scheduling": False},
    {"scheduler.max_model_len": 500},  # runs end before a schedule max_model_len would cut
    {"client.timeout_s": 3.0},  # client deadlines: schedules stop before the first
    {"scheduler.spec_method": "eagle"},  # lookahead slots in every allocation
    {"scheduler.spec_method": "draft_model", "scheduler.async_scheduling": False},
    {"cache.enable_prefix_caching": False},
    {"seed": 5},
    {"scheduler.max_num_batched_tokens": 64, "scheduler.max_num_seqs": 16},  # the budget bounds the batch
    {"cache.block_size": 32},
])
def test_verify_runs_identical_under_pressure(sets):
    _pair(_spec([0.7, 0.6, 0.5], **sets), _workload(80, 6.0, 2))


@pytest.mark.parametrize("async_", [True, False])
def test_requests_finishing_between_runs(async_):
    """Short outputs: most requests finish a few steps after their first (each finish is stepped)."""
    eng, _ = _pair(_spec([0.8, 0.4], **{"scheduler.async_scheduling": async_}), _workload(80, 5.0, 9, (1, 12)))
    assert eng.planner.num_macro_runs > 0


def test_bundled_trace_identical():
    _pair(_spec([0.7, 0.7, 0.7]), load_trace(None, max_requests=50))


def _random_sets(seed: int) -> dict:
    rng = random.Random(seed)
    ns = rng.randint(1, 4)
    sets = _spec([rng.choice([0.0, 0.3, 0.7, 1.0]) for _ in range(ns)],
                 **{"scheduler.async_scheduling": rng.random() < 0.6, "seed": seed,
                    "scheduler.spec_method": rng.choice(["ngram", "ngram", "eagle", "draft_model"])})
    if rng.random() < 0.5:
        sets.update({"cache.num_gpu_blocks": rng.choice([200, 400, 1000]), "scheduler.max_model_len": 1800})
    for key, p, values in (("cache.block_size", 0.3, [16, 32]), ("scheduler.max_num_seqs", 0.3, [2, 4, 16]),
                           ("scheduler.max_num_batched_tokens", 0.3, [64, 256]),
                           ("cache.enable_prefix_caching", 0.3, [False]), ("client.timeout_s", 0.2, [0.5, 2.0])):
        if rng.random() < p:
            sets[key] = rng.choice(values)
    return sets


@pytest.mark.parametrize("seed", range(6))
def test_random_spec_configs_identical(seed):
    sets = _random_sets(seed)
    try:
        apply_overrides(SimConfig(), sets)
    except InputError:
        pytest.skip("a configuration vLLM refuses at start-up")
    _pair(sets, _workload(40, random.Random(seed).choice([1.0, 4.0, 20.0]), seed, (1, 200)))


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6, 40))
def test_random_spec_configs_identical_slow(seed):
    test_random_spec_configs_identical(seed)


def test_accepted_run_is_num_accepted_step_after_step():
    source = TokenSource(seed=11, acceptance=(0.9, 0.4, 0.7))
    for rid in ("r0", "chat-123", "x" * 40):
        for num_drafts in range(4):
            k = 37
            run = source.accepted_run(rid, k, 60, num_drafts)
            assert len(run) == 60
            for a in run:
                assert a == source.num_accepted(rid, k, num_drafts)
                k += 1 + a
    assert TokenSource(0, (1.0, 1.0)).accepted_run("a", 0, 3, 2) == [2, 2, 2]
    assert TokenSource(0, (0.0, 1.0)).accepted_run("a", 0, 3, 2) == [0, 0, 0]
    assert TokenSource(0, (1.0, 1.0)).accepted_run("a", 0, 2, 1) == [1, 1]  # only num_drafts positions


def test_layouts_it_does_not_replay_decline_with_the_reason():
    sets = _spec([0.7, 0.7], **{"cache.attention": "groups", "scheduler.max_model_len": 4096,
                                "cache.kv_cache_groups": [{"kind": "full", "block_size": 16},
                                                          {"kind": "sliding_window", "block_size": 16,
                                                           "sliding_window": 256}]})
    eng = build_engine(apply_overrides(SimConfig(), sets), load_trace(None, max_requests=3))
    assert eng.planner is None and "KV layout" in eng.planner_declined
    eng = build_engine(apply_overrides(SimConfig(), _spec([0.7, 0.7], engine="sglang")),
                       load_trace(None, max_requests=3))
    assert eng.planner is None and "speculative decoding" in eng.planner_declined
