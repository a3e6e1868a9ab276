"""Cluster macro-steps past arrivals the router provably sends elsewhere (Router.arrivals_elsewhere):
results byte-identical to plain stepping, for the routers that claim a count and those that don't."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from servesim.simulator.cluster import Cluster, ClusterConfig, ReplicaGroup, RouterConfig, run_cluster, sim_config_from_dict
from servesim.traces.synthetic import make_workload


def _workload(n: int, rate: float, seed: int):
    return make_workload("poisson", {
        "num_requests": n, "arrival": {"rate_per_s": rate},
        "prompt_len": {"dist": "lognormal", "median": 300, "sigma": 0.5, "max_value": 2000},
        "output_len": {"dist": "lognormal", "median": 60, "sigma": 0.6, "max_value": 300},
    }, np.random.default_rng(seed))


def _config(router: str, async_: bool, macro: bool, replicas: int) -> ClusterConfig:
    sim = sim_config_from_dict({"scheduler.async_scheduling": async_, "macro_steps": macro})
    return ClusterConfig(replicas=[ReplicaGroup(replicas, sim)], router=RouterConfig(router), routing_latency_s=0.001)


def _run(router: str, async_: bool, macro: bool, replicas: int, wl):
    return run_cluster(_config(router, async_, macro, replicas), wl)


@pytest.mark.parametrize("router", ["least_outstanding", "round_robin", "jsq_power_of_two", "least_kv"])
@pytest.mark.parametrize("async_", [False, True])
def test_cluster_macro_steps_identical(router, async_):
    wl = _workload(300, 60.0, seed=3)
    plain = _run(router, async_, False, 6, wl)
    macro = _run(router, async_, True, 6, wl)
    pd.testing.assert_frame_equal(plain.requests, macro.requests)
    pd.testing.assert_frame_equal(plain.steps, macro.steps)


@pytest.mark.parametrize("router", ["least_outstanding", "round_robin"])
def test_runs_cross_arrivals_that_go_elsewhere(router):
    """With many replicas most arrivals go elsewhere: a replica's runs are not cut by each of them."""
    wl = _workload(200, 100.0, seed=5)
    cluster = Cluster(_config(router, True, True, 16), wl)
    res = cluster.run()
    macro = sum(r.engine.num_macro_steps for r in cluster.replicas)
    assert macro > 0.6 * res.summary["num_steps"]
