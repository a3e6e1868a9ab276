"""Macro-step runs where requests finish mid-run (a single engine's async run goes on through the
finishes of its batch, simulator/fastpath/through.py; elsewhere each finish ends a run and the next one
starts from the update that finishes it): byte-identical to plain stepping at light, moderate
and overloaded load, with a small KV pool, single engine and cluster; and the planning shortcuts
are taken (a single engine's run priced a batch at a time, the tail step after a run taken on
that run's own proof)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from servesim.overrides import apply_overrides
from servesim.simulator.cluster import Cluster, ClusterConfig, ReplicaGroup, RouterConfig, run_cluster, sim_config_from_dict
from servesim.simulator.config import SimConfig
from servesim.simulator.build import build_engine
from servesim.simulator.engine import Engine
from servesim.traces.synthetic import make_workload
from inner_loop import share  # tests/inner_loop.py


def _workload(n: int, rate: float, seed: int, output_median: int = 80):
    # short outputs against a long trace: most runs end because a request of the batch finishes
    return make_workload("poisson", {
        "num_requests": n, "arrival": {"rate_per_s": rate},
        "prompt_len": {"dist": "lognormal", "median": 300, "sigma": 0.5, "max_value": 2000},
        "output_len": {"dist": "lognormal", "median": output_median, "sigma": 0.6, "max_value": 400},
    }, np.random.default_rng(seed))


class _CountingPricer:
    """The engine's cost model, counting calls of its bulk method: one per call of
    executor.decode_step_times_s, the run's pricing (the executor may be a compiled class, whose
    instances are not patched; its cost model is a public attribute)."""

    def __init__(self, engine: Engine):
        self.calls = 0
        self._model = engine.executor.cost_model
        engine.executor.cost_model = self

    def decode_step_times_s(self, ctx, num_steps):
        self.calls += 1
        return self._model.decode_step_times_s(ctx, num_steps)

    def __getattr__(self, name):
        return getattr(self._model, name)


def _assert_same_engine(plain, macro) -> None:
    pd.testing.assert_frame_equal(plain.metrics.requests_frame(), macro.metrics.requests_frame(), check_exact=True)
    pd.testing.assert_frame_equal(plain.metrics.steps_frame(), macro.metrics.steps_frame(), check_exact=True)
    assert (plain.num_steps, plain.prefix_hits, plain.prefix_queries) == (macro.num_steps, macro.prefix_hits,
                                                                         macro.prefix_queries)


@pytest.mark.parametrize("rate,sets", [
    (2.0, {}),  # light: short batches, runs end at finishes and arrivals
    (12.0, {}),  # moderate
    (60.0, {"cache.num_gpu_blocks": 1200, "scheduler.max_model_len": 4096}),  # overloaded: a queue, refused heads, preemptions between runs
])
def test_runs_ending_at_finishes_are_identical_to_stepping(rate, sets):
    wl = _workload(250, rate, seed=7)
    cfg = apply_overrides(SimConfig(), sets)  # async scheduling: vLLM 0.19's default
    assert cfg.scheduler.async_scheduling
    plain = build_engine(dataclasses.replace(cfg, macro_steps=False), wl).run()
    eng = build_engine(dataclasses.replace(cfg, macro_steps=True), wl)
    pricer = _CountingPricer(eng)
    macro = eng.run()
    _assert_same_engine(plain, macro)
    assert eng.planner.num_macro_runs > 0 and eng.planner.num_macro_steps > macro.num_steps // 3
    assert eng.planner.num_bulk_finishes > 0  # runs went on through finishes (fastpath/through.py)
    if rate == 12.0:
        # a single engine prices a run's first 16 steps at once, one call per batch among them
        # (a run through finishes prices each batch on its own): here 470 calls for 181 runs, tail
        # steps included, 201 requests finished inside runs (322 runs before runs went on through
        # finishes)
        assert pricer.calls < 3 * eng.planner.num_macro_runs


@pytest.mark.parametrize("rate,sets", [
    (2.0, {}),  # light: batches of a few requests, most of a run's finishes empty it to one
    (12.0, {}),  # moderate
    (60.0, {"cache.num_gpu_blocks": 1200, "scheduler.max_model_len": 4096}),  # overloaded: finishes only once the queue drains
    (12.0, {"cache.num_gpu_blocks": 300, "scheduler.max_model_len": 4096}),  # a small pool: preemptions, runs bounded by free blocks
    (12.0, {"cache.enable_prefix_caching": False}),
    (20.0, {"client.timeout_s": 2.0, "scheduler.max_num_seqs": 8}),  # client deadlines bound runs; aborts
])
def test_runs_through_finishes_are_identical_to_stepping(rate, sets):
    """A run goes on past the updates that finish requests (the batch shrinks; the finished
    request's blocks freed at its update): requests, step rows, prefix totals and the progress
    callback identical to stepping, and the bulk path counted."""
    wl = _workload(250, rate, seed=3, output_median=40)
    cfg = apply_overrides(SimConfig(), sets)
    seen: dict[bool, list] = {False: [], True: []}
    engines = {m: build_engine(dataclasses.replace(cfg, macro_steps=m), wl,
                         progress=lambda t, done, m=m: seen[m].append((t, done))) for m in (False, True)}
    plain, macro = engines[False].run(), engines[True].run()
    _assert_same_engine(plain, macro)
    assert seen[True] == seen[False] and len(seen[True]) > 2
    eng = engines[True]
    assert eng.planner.num_bulk_finishes > 0 and eng.planner.num_macro_steps > macro.num_steps // 3
    assert eng.planner.num_bulk_finishes <= len(wl.requests)


def test_no_finish_inside_a_run_the_outside_hears_of():
    """With client.max_concurrency a finish frees a client slot (the next send): runs stop at
    finishes as before, and the results are still stepping's."""
    wl = _workload(200, 12.0, seed=5, output_median=40)
    cfg = apply_overrides(SimConfig(), {"client.max_concurrency": 8})
    plain = build_engine(dataclasses.replace(cfg, macro_steps=False), wl).run()
    eng = build_engine(dataclasses.replace(cfg, macro_steps=True), wl)
    macro = eng.run()
    _assert_same_engine(plain, macro)
    assert eng.planner.num_macro_runs > 0 and eng.planner.num_bulk_finishes == 0


def _cluster(macro: bool, router: str, replicas: int) -> ClusterConfig:
    sim = sim_config_from_dict({"macro_steps": macro})
    return ClusterConfig(replicas=[ReplicaGroup(replicas, sim)], router=RouterConfig(router), routing_latency_s=0.001)


@pytest.mark.parametrize("router,rate,replicas", share([
    ("least_outstanding", 40.0, 8),  # deferred runs, applied at routed arrivals or whole at a finish
    ("least_outstanding", 400.0, 4),  # overloaded: queues, runs that cannot be deferred
    ("round_robin", 60.0, 4),  # the eager path: runs cut by the replica's own arrivals, tail steps
], [0]))
def test_cluster_runs_ending_at_finishes_are_identical_to_stepping(router, rate, replicas):
    wl = _workload(300, rate, seed=11)
    cluster = Cluster(_cluster(True, router, replicas), wl)
    macro = cluster.run()
    assert sum(r.engine.planner.num_macro_runs for r in cluster.replicas) > 0
    plain = run_cluster(_cluster(False, router, replicas), wl)
    pd.testing.assert_frame_equal(plain.requests, macro.requests)
    pd.testing.assert_frame_equal(plain.steps, macro.steps)


@pytest.mark.parametrize("split", [1, 5, 16, 23])
def test_a_run_through_finishes_planned_in_two_parts_is_the_run_planned_whole(split):
    """A deferred run grows by planning its next steps from where it ends (the last update's
    time, the GPU free at the last end): every price and time equals planning it whole."""
    import simpy

    engine = build_engine(SimConfig(), env=simpy.Environment(), name="e")
    clock = engine.planner.clock
    ctx0 = [300, 1200, 57, 800, 4000]
    each = [40, 9, 40, 23, 3]  # request i takes the run's first each[i] schedules
    k = 40
    in_flight_end = 0.2561  # the GPU finishes the step in flight when the run is planned
    gpu, (sched_t, ends, upd_t) = clock.plan_through(0.25, ctx0, each, k, float("inf"), 0, in_flight_end)
    assert len(gpu) == len(sched_t) == k
    head_gpu, (s1, e1, u1) = clock.plan_through(0.25, ctx0, each, split, float("inf"), 0, in_flight_end)
    tail_gpu, (s2, e2, u2) = clock.plan_through(u1[-1], ctx0, each, k, float("inf"), split, e1[-1])
    assert head_gpu + tail_gpu == gpu
    assert (s1 + s2, e1 + e2, u1 + u2) == (sched_t, ends, upd_t)
    # the batch shrinks: a step's price reads only the requests still in it
    (alone,) = engine.executor.decode_step_times_s([c + 30 for c, m in zip(ctx0, each) if m > 30], 1)
    assert gpu[30] == alone
