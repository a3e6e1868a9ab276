"""Cluster macro-steps past arrivals the router provably sends elsewhere (the router proofs of
simulator/fastpath/router_proofs.py: arrivals_elsewhere, arrivals_unread): results byte-identical to
plain stepping, for the routers whose proofs claim a count and those without a proof."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from servesim.simulator.cluster import Cluster, ClusterConfig, ReplicaGroup, RouterConfig, run_cluster, sim_config_from_dict
from servesim.traces.synthetic import make_workload
from servesim.traces.workload import Workload
from inner_loop import slow_unless  # tests/inner_loop.py


def _workload(n: int, rate: float, seed: int):
    return make_workload("poisson", {
        "num_requests": n, "arrival": {"rate_per_s": rate},
        "prompt_len": {"dist": "lognormal", "median": 300, "sigma": 0.5, "max_value": 2000},
        "output_len": {"dist": "lognormal", "median": 60, "sigma": 0.6, "max_value": 300},
    }, np.random.default_rng(seed))


def _mixed_workload(n: int, rate: float, seed: int):
    """Multi-turn sessions (pinned by session_affinity) interleaved with requests without a session
    (routed by load): both of session_affinity's proofs apply."""
    base = {"num_requests": n, "arrival": {"rate_per_s": rate},
            "prompt_len": {"dist": "lognormal", "median": 300, "sigma": 0.5, "max_value": 2000},
            "output_len": {"dist": "lognormal", "median": 60, "sigma": 0.6, "max_value": 300}}
    sessions = make_workload("sessions", base, np.random.default_rng(seed))
    loose = make_workload("poisson", base, np.random.default_rng(seed + 1))
    specs = list(sessions.requests) + [replace(r, request_id=f"loose-{r.request_id}") for r in loose.requests]
    return Workload.from_unsorted(specs, name="mixed", source="test")


def _config(router: str, async_: bool, macro: bool, replicas: int) -> ClusterConfig:
    sim = sim_config_from_dict({"scheduler.async_scheduling": async_, "macro_steps": macro})
    return ClusterConfig(replicas=[ReplicaGroup(replicas, sim)], router=RouterConfig(router), routing_latency_s=0.001)


def _run(router: str, async_: bool, macro: bool, replicas: int, wl):
    return run_cluster(_config(router, async_, macro, replicas), wl)


@pytest.mark.parametrize("router", slow_unless(["least_outstanding", "round_robin", "jsq_power_of_two", "least_kv"],
                                               ["least_outstanding", "least_kv"]))
@pytest.mark.parametrize("async_", [False, True])
def test_cluster_macro_steps_identical(router, async_):
    wl = _workload(300, 60.0, seed=3)
    plain = _run(router, async_, False, 6, wl)
    macro = _run(router, async_, True, 6, wl)
    pd.testing.assert_frame_equal(plain.requests, macro.requests)
    pd.testing.assert_frame_equal(plain.steps, macro.steps)


@pytest.mark.parametrize("router,fraction", [("least_outstanding", 0.6), ("round_robin", 0.9),
                                             ("session_affinity", 0.75), ("jsq_power_of_two", 0.8)])
def test_runs_cross_arrivals_that_go_elsewhere(router, fraction):
    """With many replicas most arrivals go elsewhere: a replica's runs are not cut by each of them.
    Routers that read only some replicas (round_robin, session_affinity's pinned turns, the pair
    jsq_power_of_two draws) let even a run's first update pass the others' arrivals (0.86, 0.51 and
    0.46 when every arrival bounded it)."""
    wl = _mixed_workload(100, 50.0, seed=5) if router == "session_affinity" else _workload(200, 100.0, seed=5)
    cluster = Cluster(_config(router, True, True, 16), wl)
    res = cluster.run()
    macro = sum(r.engine.planner.num_macro_steps for r in cluster.replicas)
    assert macro > fraction * res.summary["num_steps"]


@pytest.mark.parametrize("async_", [False, True])
def test_session_affinity_macro_steps_identical(async_):
    wl = _mixed_workload(150, 30.0, seed=4)
    plain = _run("session_affinity", async_, False, 6, wl)
    macro = _run("session_affinity", async_, True, 6, wl)
    pd.testing.assert_frame_equal(plain.requests, macro.requests)
    pd.testing.assert_frame_equal(plain.steps, macro.steps)


@pytest.mark.parametrize("router", ["least_outstanding", "least_kv", "prefix_aware"])
def test_deferred_runs_open_with_joins(router):
    """A replica's deferred run opens with the prompt its first schedule completes (a new one, or
    a chunk of one over the token budget: scheduler/bulk/joins.py), read from the plan or applied
    first by the state-reading routers (fastpath/planned_reads.py): identical to stepping."""
    wl = make_workload("poisson", {
        "num_requests": 150, "arrival": {"rate_per_s": 20.0},
        "prompt_len": {"dist": "lognormal", "median": 900, "sigma": 0.9, "max_value": 6000},
        "output_len": {"dist": "lognormal", "median": 60, "sigma": 0.6, "max_value": 300},
    }, np.random.default_rng(11))
    plain = _run(router, True, False, 3, wl)
    cluster = Cluster(_config(router, True, True, 3), wl)
    macro = cluster.run()
    pd.testing.assert_frame_equal(plain.requests, macro.requests)
    pd.testing.assert_frame_equal(plain.steps, macro.steps)
    assert sum(r.engine.planner.num_joined for r in cluster.replicas) > 0.3 * len(wl.requests)
