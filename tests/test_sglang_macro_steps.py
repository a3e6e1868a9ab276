"""Macro-steps on the SGLang engine: byte-identical results to stepping, in the sync and overlap
loops, under KV pressure (retractions between runs), with a full batch and a waiting queue,
mixed chunks, priority scheduling, the cache-aware ordering, client deadlines and in a cluster."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pandas as pd
import pytest

from servesim.overrides import apply_overrides
from servesim.simulator.cluster import Cluster, ClusterConfig, ReplicaGroup, RouterConfig, sim_config_from_dict
from servesim.simulator.config import SimConfig
from servesim.simulator.build import build_engine
from servesim.simulator.engine import Engine
from servesim.traces.errors import InputError
from servesim.traces.synthetic import make_workload
from inner_loop import share, slow_unless  # tests/inner_loop.py


def _pair(sets: dict, wl) -> Engine:
    """Run the config stepped and macro-stepped; assert identical frames; the macro engine."""
    cfg = apply_overrides(SimConfig(), {"engine": "sglang", **sets})
    plain = build_engine(dataclasses.replace(cfg, macro_steps=False), wl).run()
    eng = build_engine(dataclasses.replace(cfg, macro_steps=True), wl)
    macro = eng.run()
    pd.testing.assert_frame_equal(plain.metrics.requests_frame(), macro.metrics.requests_frame(), check_exact=True)
    pd.testing.assert_frame_equal(plain.metrics.steps_frame(), macro.metrics.steps_frame(), check_exact=True)
    assert (plain.prefix_hits, plain.prefix_queries, plain.num_steps) == (macro.prefix_hits, macro.prefix_queries,
                                                                         macro.num_steps)
    return eng


def _load(n: int = 80, rate: float = 4.0, seed: int = 1, prefixes: bool = False, priority: bool = False):
    cfg: dict = {"num_requests": n, "arrival": {"rate_per_s": rate},
                 "prompt_len": {"dist": "uniform", "low": 50, "high": 700},
                 "output_len": {"dist": "uniform", "low": 20, "high": 400}}
    if prefixes:
        cfg["prefix"] = {"num_groups": 6, "prefix_len": {"dist": "uniform", "low": 64, "high": 400}, "fraction": 0.8}
    if priority:
        cfg["priority"] = {"values": [0, 1, 2]}
    return make_workload("poisson", cfg, np.random.default_rng(seed))


@pytest.mark.parametrize("async_", [True, False])
def test_light_load_is_mostly_macro_stepped_and_identical(async_):
    eng = _pair({"scheduler.async_scheduling": async_}, _load())
    assert eng.planner_declined is None
    assert eng.planner.num_macro_steps > eng.num_steps // 2


@pytest.mark.parametrize("sets, wl", share([
    ({"cache.num_gpu_blocks": 150, "scheduler.max_model_len": 2000}, dict(rate=20.0)),  # retractions, evictions
    ({"scheduler.max_num_seqs": 4}, dict(rate=20.0)),  # a full batch, requests waiting
    ({"sglang.enable_mixed_chunk": True}, dict(rate=10.0)),
    ({"sglang.enable_priority_scheduling": True, "scheduler.max_num_seqs": 6}, dict(rate=20.0, priority=True)),
    ({"sglang.schedule_policy": "lpm", "scheduler.max_num_seqs": 8}, dict(rate=20.0, prefixes=True)),
    ({"cache.enable_prefix_caching": False}, dict(rate=10.0, prefixes=True)),
    ({"client.timeout_s": 3.0, "scheduler.max_num_seqs": 6}, dict(rate=20.0)),  # aborts between runs
    ({"client.max_concurrency": 5}, dict(rate=20.0)),
    ({"sglang.disable_consecutive_prefill_overlap": True}, dict(rate=10.0)),
    ({"scheduler.enable_chunked_prefill": False, "cache.num_gpu_blocks": 200, "scheduler.max_model_len": 1500,
      "scheduler.max_num_batched_tokens": 2048}, dict(rate=20.0)),  # whole prompts into a small pool
    ({"cache.block_size": 1, "cache.num_gpu_blocks": 3000, "scheduler.max_model_len": 1500},
     dict(rate=10.0, prefixes=True)),  # a page per token: a page at every step, evictions inside runs
], [0, 1, 4, 10]))
@pytest.mark.parametrize("async_", [True, False])
def test_pressure_and_sglang_knobs_identical(sets, wl, async_):
    eng = _pair({**sets, "scheduler.async_scheduling": async_}, _load(**wl))
    assert eng.planner.num_macro_steps > 0


@pytest.mark.parametrize("router", slow_unless(["least_outstanding", "round_robin", "prefix_aware"],
                                               ["least_outstanding", "prefix_aware"]))
@pytest.mark.parametrize("async_", [True, False])
def test_cluster_of_sglang_replicas_identical(router, async_):
    """least_outstanding defers the overlap loop's runs (fastpath/deferred.py); round_robin proves
    which arrivals go elsewhere (eager runs past them); prefix_aware reads each replica's radix
    tree, so every arrival ends every replica's run (the tree it reads is the stepped one)."""
    wl = _load(200, 40.0, seed=4, prefixes=True)
    results, clusters = [], []
    for macro in (False, True):
        sim = sim_config_from_dict({"engine": "sglang", "scheduler.async_scheduling": async_, "macro_steps": macro})
        cluster = Cluster(ClusterConfig(replicas=[ReplicaGroup(4, sim)], router=RouterConfig(router),
                                        routing_latency_s=0.001), wl)
        results.append(cluster.run())
        clusters.append(cluster)
    pd.testing.assert_frame_equal(results[0].requests, results[1].requests, check_exact=True)
    pd.testing.assert_frame_equal(results[0].steps, results[1].steps, check_exact=True)
    assert sum(r.engine.planner.num_macro_steps for r in clusters[1].replicas) > 0


def _random_case(seed: int):
    rng = random.Random(seed)
    sets: dict = {"scheduler.async_scheduling": rng.random() < 0.6}
    if rng.random() < 0.5:
        sets.update({"cache.num_gpu_blocks": rng.choice([120, 200, 400, 1000]), "scheduler.max_model_len": 1800})
    for key, p, values in (("cache.block_size", 0.3, [1, 16, 32]), ("scheduler.max_num_seqs", 0.3, [2, 4, 8, 16]),
                           ("scheduler.max_num_batched_tokens", 0.3, [64, 256, 512]),
                           ("cache.enable_prefix_caching", 0.3, [False]),
                           ("sglang.schedule_policy", 0.3, ["lpm", "lof", "random", "dfs-weight"]),
                           ("sglang.enable_mixed_chunk", 0.2, [True]),
                           ("sglang.enable_priority_scheduling", 0.2, [True]),
                           ("client.timeout_s", 0.2, [0.5, 2.0, 5.0]), ("client.max_concurrency", 0.2, [1, 3, 10])):
        if rng.random() < p:
            sets[key] = rng.choice(values)
    wl = make_workload("poisson", {"num_requests": rng.randint(5, 80),
                                   "arrival": {"rate_per_s": rng.choice([0.5, 2.0, 10.0, 100.0])},
                                   "prompt_len": {"dist": "uniform", "low": 1, "high": rng.choice([50, 600, 1500])},
                                   "output_len": {"dist": "uniform", "low": 1, "high": rng.choice([3, 40, 300])},
                                   "priority": {"values": [0, 1, 5, 20]}},
                       np.random.default_rng(seed))
    return sets, wl


@pytest.mark.parametrize("seed", share(range(24), range(8)))
def test_random_configs_identical(seed):
    sets, wl = _random_case(seed)
    try:
        apply_overrides(SimConfig(), sets)
    except InputError:
        pytest.skip("a configuration the engine refuses at start-up")
    _pair(sets, wl)
