"""Deferred macro-steps (simulator/fastpath/deferred.py): behind least_outstanding, a replica's run is
applied when a request is routed to it or whole at its end. Results stay byte-identical to plain
stepping and to the eager path, at any load, with client deadlines, and with arrivals on a grid."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from servesim.simulator.cluster import Cluster, ClusterConfig, ReplicaGroup, RouterConfig, run_cluster, sim_config_from_dict
from servesim.simulator.cluster.routers import LeastOutstanding
from servesim.simulator.fastpath.deferred import DeferredRuns
from servesim.simulator.fastpath.router_proofs import LeastOutstandingProof
from servesim.traces.synthetic import make_workload
from servesim.traces.workload import RequestSpec, Workload
from inner_loop import share  # tests/inner_loop.py


def _workload(n: int, rate: float, seed: int, output_median: int = 60):
    return make_workload("poisson", {
        "num_requests": n, "arrival": {"rate_per_s": rate},
        "prompt_len": {"dist": "lognormal", "median": 300, "sigma": 0.5, "max_value": 2000},
        "output_len": {"dist": "lognormal", "median": output_median, "sigma": 0.6, "max_value": 400},
    }, np.random.default_rng(seed))


def _config(macro: bool, replicas: int, latency_s: float = 0.001, **sim) -> ClusterConfig:
    cfg = sim_config_from_dict({"macro_steps": macro, **sim})
    return ClusterConfig(replicas=[ReplicaGroup(replicas, cfg)], router=RouterConfig("least_outstanding"),
                         routing_latency_s=latency_s)


def _assert_same(a, b) -> None:
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.steps, b.steps)


def _deferred_counts(cluster: Cluster) -> tuple[int, int]:
    return (sum(r.engine.planner.num_deferred_runs for r in cluster.replicas),
            sum(r.engine.planner.num_deferred_routed for r in cluster.replicas))


@pytest.mark.parametrize("rate,replicas,seed", share([(100.0, 16, 1), (40.0, 4, 2), (400.0, 8, 3)], [1, 2]))
def test_deferred_runs_are_identical_to_plain_stepping(rate, replicas, seed):
    """Light, moderate and overloaded clusters (the last queues requests: waiting heads, refused
    admissions, runs that cannot be deferred); deferred runs were planned and applied at arrivals."""
    wl = _workload(400, rate, seed)
    cluster = Cluster(_config(True, replicas), wl)
    macro = cluster.run()
    planned, routed = _deferred_counts(cluster)
    assert planned > 0 and routed > 0
    # most routed arrivals applied the run through the update due after them (finishing nobody)
    assert sum(r.engine.planner.num_runs_past_arrival for r in cluster.replicas) > routed // 3
    _assert_same(run_cluster(_config(False, replicas), wl), macro)


def test_deferred_runs_match_the_eager_path(monkeypatch):
    """Deferral changes which runs are applied when, never what they do: the eager path (the
    router's arrival proofs only) gives the same results, with more, shorter runs."""
    wl = _workload(300, 100.0, seed=4)
    deferred = Cluster(_config(True, 16), wl)
    res_deferred = deferred.run()
    monkeypatch.setattr(LeastOutstandingProof, "reads_only_load", False)
    eager = Cluster(_config(True, 16), wl)
    res_eager = eager.run()
    assert _deferred_counts(eager) == (0, 0) and _deferred_counts(deferred)[0] > 0
    _assert_same(res_eager, res_deferred)


def test_client_deadlines_bound_deferred_runs():
    """Client timeouts abort requests mid-run: a deferred run stops at the first deadline."""
    wl = _workload(300, 300.0, seed=5, output_median=200)
    cfg = dict(**{"client.timeout_s": 1.5})
    cluster = Cluster(_config(True, 4, **cfg), wl)
    macro = cluster.run()
    assert macro.summary["num_timed_out"] > 0 and _deferred_counts(cluster)[1] > 0
    _assert_same(run_cluster(_config(False, 4, **cfg), wl), macro)


def test_arrivals_on_a_grid_with_no_routing_latency():
    """Arrivals at round times (and at t = 0, where a SimPy delay may need two hops to land
    exactly): plans end before any update that would land on a dispatch time."""
    specs = [RequestSpec(f"g{i}", 0.01 * (i // 2), 200 + 7 * i % 300, 20 + 13 * i % 90) for i in range(300)]
    wl = Workload.from_unsorted(specs, name="grid", source="test")
    _assert_same(run_cluster(_config(False, 6, latency_s=0.0), wl), run_cluster(_config(True, 6, latency_s=0.0), wl))


def test_a_plan_ends_before_an_update_at_a_dispatch_time():
    """ArrivalBounds.first_dispatch_at: the first time at which the clock reads a dispatch. SimPy lands
    a timeout at now + (t - now), which can miss t in the last bit; the cluster knows each landing
    in advance (0.00016189957807444255 then 1.510323792226935 lands at 1.5103237922269352)."""
    prev, t = 0.00016189957807444255, 1.510323792226935
    specs = [RequestSpec("a", prev, 100, 10), RequestSpec("b", t, 100, 10), RequestSpec("c", 3.0, 100, 10)]
    cluster = Cluster(_config(True, 2, latency_s=0.0), Workload.from_unsorted(specs, name="t", source="test"))
    landed = prev + (t - prev)
    assert landed != t and cluster.arrival_bounds.landing_s == [prev, landed, landed + (3.0 - landed)]
    first = cluster.arrival_bounds.first_dispatch_at
    assert first([0.1, 0.2, 0.3]) == 3 and first([]) == 0
    assert first([0.1, landed, 2.0]) == 1
    assert first([0.1, t, 2.0]) == 3  # the trace's time is not where the clock reads it
    res = cluster.run()
    # the clock at every submit: each engine's arrival records it (a routing latency of 0; the
    # records are the replicas' tables once the results are built)
    seen = [float(x) for rr in res.replicas for x in rr.result.metrics.request_columns()["arrival_s"]]
    assert sorted(seen) == cluster.arrival_bounds.landing_s


@pytest.mark.parametrize("router", ["jsq_power_of_two", "session_affinity"])
def test_other_load_only_routers_defer_too(router):
    """jsq_power_of_two reads the loads of the pair it draws, session_affinity the loads for a
    request without a session: their replicas defer runs as well, with identical results."""
    wl = _workload(300, 100.0, seed=6)
    cfg = ClusterConfig(replicas=[ReplicaGroup(12, sim_config_from_dict({}))], router=RouterConfig(router),
                        routing_latency_s=0.001)
    cluster = Cluster(cfg, wl)
    macro = cluster.run()
    assert _deferred_counts(cluster)[1] > 0
    plain = replace(cfg, replicas=[ReplicaGroup(12, sim_config_from_dict({"macro_steps": False}))])
    _assert_same(run_cluster(plain, wl), macro)


def test_round_robin_does_not_defer():
    """round_robin already knows each replica's next arrival (the KV and prefix readers defer:
    tests/test_planned_reads.py)."""
    wl = _workload(200, 100.0, seed=7)
    for router in ("round_robin",):
        cfg = ClusterConfig(replicas=[ReplicaGroup(8, sim_config_from_dict({}))], router=RouterConfig(router),
                            routing_latency_s=0.001)
        cluster = Cluster(cfg, wl)
        cluster.run()
        assert _deferred_counts(cluster) == (0, 0)


def test_a_run_whose_first_update_finishes_requests_is_deferred_too(monkeypatch):
    """The in-flight step's update finishes the requests the async skip-ahead passed over: the
    load the router reads drops at that update's time, not when the run is applied."""
    drops = []

    class Spy(DeferredRuns):  # (a subclass: a compiled object's own methods cannot be patched)
        def plan(self, now, reqs, ctx0, k, load_drop, each, num_joining=0, first=None):
            drops.append(load_drop)
            return super().plan(now, reqs, ctx0, k, load_drop, each, num_joining, first)

    wl = _workload(300, 100.0, seed=8, output_median=30)
    cluster = _with_deferred(Cluster(_config(True, 12), wl), Spy)
    macro = cluster.run()
    assert sum(d > 0 for d in drops) > 5
    _assert_same(run_cluster(_config(False, 12), wl), macro)


_CHOOSE = LeastOutstanding.choose


def _with_deferred(cluster: Cluster, cls: type[DeferredRuns]) -> Cluster:
    """The cluster, each replica's deferred runs handled by a `cls` (a test double) instead."""
    for r in cluster.replicas:
        p = r.engine.planner
        if p is not None:
            double = cls(r.engine, p.clock, p.applier, p.commuting_arrivals)
            double.collides = p.deferred.collides
            p.deferred = double
    return cluster


def _loads_seen(monkeypatch, cfg: ClusterConfig, wl):
    """Every load vector least_outstanding reads, in decision order; the cluster; its result."""
    seen: list[list[int]] = []
    choose = _CHOOSE

    def spy(self, spec, candidates, now_s):
        seen.append([c.engine.num_outstanding for c in candidates])
        return choose(self, spec, candidates, now_s)

    monkeypatch.setattr(LeastOutstanding, "choose", spy)
    cluster = Cluster(cfg, wl)
    return seen, cluster, cluster.run()


@pytest.mark.parametrize("rate,replicas,seed", [(30.0, 4, 11), (120.0, 12, 12)])
def test_deferred_runs_go_through_finishes(monkeypatch, rate, replicas, seed):
    """A deferred run goes on past the updates that finish requests (simulator/fastpath/through.py): the load a
    router reads falls at each finishing update's time, so every decision reads the loads plain
    stepping shows, and the results are identical."""
    wl = _workload(300, rate, seed, output_median=40)
    loads_macro, cluster, macro = _loads_seen(monkeypatch, _config(True, replicas), wl)
    assert sum(r.engine.planner.num_bulk_finishes for r in cluster.replicas) > 50
    assert _deferred_counts(cluster)[0] > 0
    loads_plain, _, plain = _loads_seen(monkeypatch, _config(False, replicas), wl)
    assert loads_macro == loads_plain
    _assert_same(plain, macro)


def test_a_refused_plan_falls_back_to_the_eager_run_without_finishes(monkeypatch):
    """When no deferred plan can be made (an update would land on a dispatch time within two
    steps), the replica runs the eager path, whose router proof reads a constant load: its run
    is planned again without finishes inside. Forcing every plan to be refused must still give
    plain stepping's results."""
    refused = []

    class Refusing(DeferredRuns):
        def plan(self, now, reqs, ctx0, k, load_drop, each, num_joining=0, first=None):
            refused.append(each is not None)
            return False

    wl = _workload(300, 120.0, seed=13, output_median=40)
    cluster = _with_deferred(Cluster(_config(True, 8), wl), Refusing)
    macro = cluster.run()
    assert any(refused)  # some refused plans would have gone through finishes
    assert sum(r.engine.planner.num_bulk_finishes for r in cluster.replicas) == 0
    assert sum(r.engine.planner.num_macro_runs for r in cluster.replicas) > 0
    _assert_same(run_cluster(_config(False, 8), wl), macro)
