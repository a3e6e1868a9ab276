"""Cluster macro-steps past arrivals the router provably sends elsewhere (Router.arrivals_elsewhere,
Router.arrivals_unread): results byte-identical to plain stepping, for the routers that claim a count
and those that don't."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from servesim.simulator.cluster import Cluster, ClusterConfig, ReplicaGroup, RouterConfig, run_cluster, sim_config_from_dict
from servesim.traces.synthetic import make_workload
from servesim.traces.workload import Workload


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


@pytest.mark.parametrize("router", ["least_outstanding", "round_robin", "jsq_power_of_two", "least_kv"])
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


def test_session_affinity_proofs():
    """Turns pinned elsewhere are unread; a request without a session ends the unread window, and
    counts as elsewhere only while least_outstanding's proof says the others must receive requests first."""
    from servesim.simulator.cluster.routers import SessionAffinity, _session_target
    from servesim.traces.workload import RequestSpec

    sid = {t: next(f"s{i}" for i in range(1000) if _session_target(f"s{i}", 3) == t) for t in range(3)}
    seq = [RequestSpec(f"r{i}", float(i), 10, 5, session_id=s)
           for i, s in enumerate([sid[1], sid[2], None, sid[1], sid[0], sid[2]])]

    class Stub:  # a candidate whose engine reports a fixed load
        def __init__(self, load):
            self.engine = type("E", (), {"num_outstanding": load})()

    router = SessionAffinity(np.random.default_rng(0))
    cands = [Stub(3), Stub(3), Stub(3)]
    assert router.arrivals_unread(0, cands, seq, 0) == 2  # r2 (no session) may read replica 0
    assert router.arrivals_unread(1, cands, seq, 0) == 0  # r0 is pinned to replica 1
    # Replica 0 at load 3, the others at 3: least_outstanding could pick it for r2 -> 2 elsewhere.
    assert router.arrivals_elsewhere(0, 3, cands, seq, 0) == 2
    # At load >= 5 the others must take 4 requests first, r2 comes after 2: elsewhere; r4 is pinned here.
    assert router.arrivals_elsewhere(0, 5, cands, seq, 0) == 4
    assert router.arrivals_elsewhere(2, 9, cands, seq, 2) == 3  # r5 pinned to 2; r2 needs 14 first


def test_jsq_foresees_the_pairs_it_draws():
    """jsq_power_of_two's proof draws the coming pairs from a copy of the shared Generator; choose()
    draws the same ones, and refuses to go on if someone else drew in between."""
    from servesim.simulator.cluster.routers import PowerOfTwo

    class Stub:
        def __init__(self, load):
            self.engine = type("E", (), {"num_outstanding": load})()

    cands = [Stub(i) for i in range(8)]
    seq = list(_workload(50, 10.0, seed=1).requests)
    rng = np.random.default_rng(7)
    router = PowerOfTwo(rng)
    k = router.arrivals_unread(3, cands, seq, 0)
    reference = PowerOfTwo(np.random.default_rng(7))
    picks = [reference.choose(seq[i], cands, 0.0) for i in range(k + 1)]
    assert all(3 not in (int(p.reason[4]), int(p.reason[6])) for p in picks[:k])
    assert k == len(seq) or 3 in (int(picks[k].reason[4]), int(picks[k].reason[6]))
    assert [router.choose(seq[i], cands, 0.0) for i in range(k + 1)] == picks
    router.arrivals_unread(3, cands, seq, k + 1)
    rng.random()  # another reader of the shared Generator
    with pytest.raises(AssertionError):
        router.choose(seq[k + 1], cands, 0.0)
