"""Speculative decoding on the fast path (simulator/fastpath/spec_runs.py, scheduler/bulk/spec.py):
runs of verify steps give byte-identical outputs to stepping, and decline what they cannot prove."""

from __future__ import annotations

import json
import random
import zlib

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
from inner_loop import share, slow_unless  # tests/inner_loop.py


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


@pytest.mark.parametrize("sets", share([
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
    {"cost_model.name": "calibrated"},  # no bulk verify pricer: each step priced on its StepShape
    {"cost_model.name": "perturbed", "cost_model.params.base": "roofline",  # bulk prices, scaled
     "cost_model.params.factors": {"prefill": 1.2, "decode": 0.8, "mixed": 1.0}},
    {"hardware.model": "qwen3-30b-a3b", "hardware.tp": 2},  # MoE experts and the all-reduce in each price
], [0, 2, 3, 4, 8]))
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


def _accepted_by_definition(source: TokenSource, req_id: str, k: int, num_drafts: int) -> int:
    """The acceptance model as worker.py's docstring states it: draft i is accepted when
    crc32(b"seed:req_id:k:i") / 2**32 < acceptance[i] and every earlier draft was."""
    n = 0
    for i in range(min(num_drafts, len(source.acceptance))):
        if zlib.crc32(f"{source.seed}:{req_id}:{k}:{i}".encode()) / 2**32 >= source.acceptance[i]:
            break
        n += 1
    return n


def test_accepted_run_is_the_acceptance_model_step_after_step():
    source = TokenSource(seed=11, acceptance=(0.9, 0.4, 0.7))
    for rid in ("r0", "chat-123", "x" * 40):
        for num_drafts in range(4):
            k = 37
            run = source.accepted_run(rid, k, 60, num_drafts, 10**9)
            assert len(run) == 60
            for a in run:
                assert a == _accepted_by_definition(source, rid, k, num_drafts)
                assert a == source.num_accepted(rid, k, num_drafts)
                k += 1 + a
        source.forget(rid)  # the cached prefix register is dropped, and built again alike
        assert source.accepted_run(rid, 37, 60, 3, 10**9) == source.accepted_run(rid, 37, 60, 3, 10**9)
    many = TokenSource(seed=2, acceptance=(0.97,) * 12)  # draft indices of two digits
    for k in (0, 5, 99_990, 999_996):  # from position 0, across digit-count boundaries
        run, at = many.accepted_run("r", k, 40, 12, 10**9), k
        for a in run:
            assert a == _accepted_by_definition(many, "r", at, 12)
            at += 1 + a
    assert any(a >= 10 for a in many.accepted_run("r", 0, 40, 12, 10**9))
    assert TokenSource(0, (1.0, 1.0)).accepted_run("a", 0, 3, 2, 99) == [2, 2, 2]
    assert TokenSource(0, (0.0, 1.0)).accepted_run("a", 0, 3, 2, 99) == [0, 0, 0]
    assert TokenSource(0, (1.0, 1.0)).accepted_run("a", 0, 2, 1, 99) == [1, 1]  # only num_drafts positions
    # no step starts at until_k or later: steps from 0, 3, 6 (each accepts both drafts) then 9
    assert TokenSource(0, (1.0, 1.0)).accepted_run("a", 0, 9, 2, 9) == [2, 2, 2]
    assert TokenSource(0, (1.0, 1.0)).accepted_run("a", 0, 9, 2, 10) == [2, 2, 2, 2]
    assert TokenSource(0, (1.0, 1.0)).accepted_run("a", 12, 9, 2, 10) == []


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


@pytest.mark.parametrize("name,model,tp,params", [
    ("roofline", "llama-3.1-8b", 1, {}),  # dense TP1
    ("roofline", "llama-3.1-70b", 4, {}),  # all-reduce curve
    ("roofline", "qwen3-30b-a3b", 2, {}),  # MoE experts
    ("perturbed", "llama-3.1-8b", 1, {"base": "roofline", "factors": {"prefill": 1.3, "decode": 0.9, "mixed": 1.1}}),
])
def test_verify_prices_are_step_time_s_bit_for_bit(name, model, tp, params):
    """The bulk verify pricer (VerifyRunCostModel) against step_time_s on each exact StepShape:
    contexts far apart (the decodes' skew term must not enter), 1..5 drafts, batches 1..300."""
    from servesim.simulator.cost_model import make_cost_model
    from servesim.simulator.cost_model.base import StepShape

    cm = make_cost_model(name, model=model, gpu="h100", tp=tp, **params)
    rng = random.Random(3)
    for _ in range(25):
        q, n = rng.randint(2, 6), rng.choice([1, 2, rng.randint(3, 300)])
        steps = [[rng.randint(0, 120_000) for _ in range(n)] for _ in range(rng.randint(1, 12))]
        ref = [cm.step_time_s(StepShape((q,) * n, tuple(ctx), n, ())) for ctx in steps]
        assert cm.verify_step_times_s(q, n, [sum(ctx) for ctx in steps]) == ref
    assert cm.verify_step_times_s(1, 4, [100]) is None  # decodes: the decode pricer's shape, not this one


def test_verify_prices_decline_where_step_time_s_takes_another_path():
    """A sliding-window model (Mistral 7B v0.1) prices per layer kind (no dense pricer): no bulk verify prices, and
    the executor says so (the planner then prices each StepShape)."""
    from servesim.simulator.cost_model import make_cost_model

    cm = make_cost_model("roofline", model="mistral-7b-v0.1", gpu="h100", tp=1)
    assert cm.verify_step_times_s(4, 8, [1000, 2000]) is None


def test_executor_verify_prices_add_the_sampler_rows():
    from servesim.simulator.cost_model import make_cost_model
    from servesim.simulator.cost_model.base import StepShape
    from servesim.simulator.executor import SimExecutor
    from servesim.simulator.sampling import SamplerCost

    cm = make_cost_model("roofline", model="llama-3.1-8b", gpu="h100", tp=1)
    sim = SimExecutor(cm, TokenSource(), 3, SamplerCost(1e-6, 3e-7))
    for n in (5, 200):  # below and from 128 rows
        ctx = list(range(100, 100 + 7 * n, 7))
        want = cm.step_time_s(StepShape((4,) * n, tuple(ctx), n, ())) + sim.sampler.seconds(n)
        assert sim.verify_step_times_s(4, n, [sum(ctx)]) == [want]


def _cluster_pair(router: str, async_: bool, n: int = 150, replicas: int = 6):
    """A spec-decode cluster with and without the fast path: requests and steps tables equal.
    Returns the fast path's cluster."""
    import pandas as pd

    from servesim.simulator.cluster import Cluster, ClusterConfig, ReplicaGroup, RouterConfig, run_cluster, \
        sim_config_from_dict
    from test_cluster_macro_steps import _workload as cluster_workload

    def config(macro: bool) -> ClusterConfig:
        sim = sim_config_from_dict({"scheduler.async_scheduling": async_, "macro_steps": macro,
                                    **_spec([0.7, 0.5, 0.6])})
        return ClusterConfig(replicas=[ReplicaGroup(replicas, sim)], router=RouterConfig(router), routing_latency_s=0.001)

    wl = cluster_workload(n, 60.0, seed=3)
    plain = run_cluster(config(False), wl)
    cluster = Cluster(config(True), wl)
    macro = cluster.run()
    pd.testing.assert_frame_equal(plain.requests, macro.requests)
    pd.testing.assert_frame_equal(plain.steps, macro.steps)
    assert plain.summary["num_steps"] == macro.summary["num_steps"]
    return cluster, macro


@pytest.mark.parametrize("router", slow_unless(["least_outstanding", "least_kv", "round_robin", "jsq_power_of_two"],
                                               ["least_kv", "round_robin"]))
@pytest.mark.parametrize("async_", [True, False])
def test_cluster_verify_runs_identical(router, async_):
    """Cluster replicas run verify steps in bulk up to the first arrival their router's proof cannot
    send elsewhere (the load-reading proofs let runs pass arrivals routed elsewhere), ending before
    any finish; whole outputs equal to stepping."""
    cluster, res = _cluster_pair(router, async_)
    planners = [r.engine.planner for r in cluster.replicas]
    assert all(p is not None for p in planners)
    assert sum(p.num_macro_steps for p in planners) > res.summary["num_steps"] // 3
    assert sum(p.num_bulk_finishes for p in planners) == 0  # finishes are stepped: the router reads the load
