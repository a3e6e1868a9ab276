"""Cluster of colocated replicas: single-engine equivalence, router determinism, prefix-aware routing."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from servesim.simulator.cluster import (
    Cluster, ClusterConfig, ReplicaGroup, RouterConfig, available_routers, make_router, run_cluster,
    sim_config_from_dict,
)
from servesim.simulator.config import SimConfig
from servesim.simulator.build import build_engine
from servesim.traces.bundled import available_bundled_traces, load_bundled
from servesim.traces.errors import InputError
from servesim.traces.transforms import rate_scale, request_limit
from servesim.traces.workload import RequestSpec, Workload

ROUTING_COLUMNS = ["replica", "route_time_s", "route_reason", "route_score"]


def small_workload(n: int = 40, scale: float = 3.0) -> Workload:
    wl = rate_scale(request_limit(load_bundled(), n), scale)
    # Short outputs keep the decode tail (most of the steps) small.
    reqs = [dataclasses.replace(r, output_len=min(r.output_len, 24)) for r in wl.requests]
    return Workload(reqs, wl.name, wl.source)


def cluster(n: int, router: str = "round_robin", latency: float = 0.0, seed: int = 0, sim: SimConfig | None = None,
            **params) -> ClusterConfig:
    return ClusterConfig(replicas=[ReplicaGroup(count=n, sim=sim or SimConfig())],
                         router=RouterConfig(router, params), routing_latency_s=latency, seed=seed)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_one_replica_reproduces_the_single_engine_exactly(async_scheduling):
    wl = small_workload()
    sim = sim_config_from_dict({"scheduler.async_scheduling": async_scheduling})
    single = build_engine(sim, wl).run()
    res = run_cluster(cluster(1, sim=sim), wl)
    expected = single.metrics.requests_frame()
    got = res.requests.drop(columns=ROUTING_COLUMNS)
    pd.testing.assert_frame_equal(expected, got)
    pd.testing.assert_frame_equal(single.metrics.steps_frame(), res.steps.drop(columns=["replica"]))
    assert res.summary["prefix_cache_hit_rate"] == pytest.approx(single.prefix_hits / single.prefix_queries)
    assert (res.requests["replica"] == 0).all()


@pytest.mark.parametrize("router", ["jsq_power_of_two", "least_kv", "prefix_aware"])
@pytest.mark.slow
def test_routers_are_deterministic_under_a_seed(router):
    wl = small_workload(30)
    runs = [run_cluster(cluster(4, router, latency=0.002, seed=s), wl) for s in (7, 7)]
    a, b = (r.requests for r in runs)
    assert list(a["replica"]) == list(b["replica"])
    assert list(a["route_reason"]) == list(b["route_reason"])
    pd.testing.assert_frame_equal(a, b)


@pytest.mark.slow
def test_power_of_two_depends_on_the_seed_and_records_its_draws():
    wl = small_workload(30)
    seeds = {s: list(run_cluster(cluster(4, "jsq_power_of_two", seed=s), wl).requests["route_reason"]) for s in (1, 2)}
    assert seeds[1] != seeds[2]
    assert all(r.startswith("jsq(") for r in seeds[1])


def test_round_robin_cycles_and_routing_latency_delays_arrival():
    wl = small_workload(12)
    res = run_cluster(cluster(3, latency=0.25), wl)
    assert list(res.requests["replica"]) == [i % 3 for i in range(12)]
    assert (res.requests["route_time_s"] - res.requests["arrival_s"]).to_numpy() == pytest.approx([0.25] * 12)
    # TTFT is measured from the cluster arrival, so it includes the router's delay.
    assert (res.requests["queueing_s"] >= 0.25 - 1e-12).all()
    assert res.summary["cluster"]["requests_per_replica"] == {"both0": 4, "both1": 4, "both2": 4}


@pytest.mark.slow
def test_least_outstanding_spreads_a_simultaneous_burst():
    reqs = [RequestSpec(f"r{i}", 0.0, prompt_len=64, output_len=4) for i in range(8)]
    res = run_cluster(cluster(4, "least_outstanding"), Workload(reqs, "burst", "test"))
    assert sorted(res.requests.groupby("replica").size()) == [2, 2, 2, 2]
    res = run_cluster(cluster(4, "least_kv"), Workload(reqs, "burst", "test"))
    assert sorted(res.requests.groupby("replica").size()) == [2, 2, 2, 2]


def test_session_affinity_keeps_a_session_on_one_replica():
    reqs = [RequestSpec(f"r{i}", 0.1 * i, prompt_len=32, output_len=2, session_id=f"s{i % 3}") for i in range(12)]
    reqs.append(RequestSpec("lone", 2.0, prompt_len=32, output_len=2))
    res = run_cluster(cluster(5, "session_affinity"), Workload(reqs, "sessions", "test"))
    df = res.requests.set_index("request_id")
    for s in range(3):
        assert df.loc[[f"r{i}" for i in range(s, 12, 3)], "replica"].nunique() == 1
    assert df.loc["lone", "route_reason"] == "no_session"


def test_heterogeneous_replicas_each_use_their_own_config():
    wl = small_workload(30)
    cfg = ClusterConfig(replicas=[ReplicaGroup(1, sim_config_from_dict({"hardware.tp": 2}), name="fast"),
                                  ReplicaGroup(1, sim_config_from_dict({"hardware.gpu": "a100-80gb"}), name="slow")])
    res = run_cluster(cfg, wl)
    fast, slow = res.replicas
    assert (fast.name, slow.name) == ("fast0", "slow0")
    assert fast.cfg.hardware.tp == 2 and slow.cfg.hardware.gpu == "a100-80gb"
    assert fast.result.cache.num_gpu_blocks != slow.result.cache.num_gpu_blocks
    # Round robin splits evenly; the faster replica decodes faster.
    assert fast.summary["tpot_s"]["p50"] < slow.summary["tpot_s"]["p50"]
    assert res.summary["cluster"]["num_gpus"] == 3
    assert set(res.steps["replica"]) == {0, 1}


@pytest.mark.slow
def test_prefix_aware_beats_round_robin_on_the_mooncake_sample():
    assert "mooncake-conversation-5min" in available_bundled_traces()
    wl = load_bundled("mooncake-conversation-5min")
    reqs = [dataclasses.replace(r, output_len=min(r.output_len, 4)) for r in wl.requests if r.prompt_len <= 16000]
    wl = Workload(reqs[:160], "mooncake-160", "test")
    sim = sim_config_from_dict({"scheduler.max_model_len": 16384})
    rr = run_cluster(cluster(4, "round_robin", sim=sim), wl)
    pa = run_cluster(cluster(4, "prefix_aware", sim=sim), wl)
    assert pa.summary["prefix_cache_hit_rate"] > rr.summary["prefix_cache_hit_rate"] * 1.2
    assert (pa.requests["route_reason"] == "prefix").any()


def test_prefix_aware_follows_the_cache_until_load_outweighs_it():
    shared = RequestSpec("warm", 0.0, prompt_len=512, output_len=1, prefix_group=1, prefix_len=512)
    later = [RequestSpec(f"hit{i}", 5.0 + i, prompt_len=600, output_len=1, prefix_group=1, prefix_len=512)
             for i in range(3)]
    res = run_cluster(cluster(3, "prefix_aware"), Workload([shared, *later], "prefix", "test"))
    df = res.requests.set_index("request_id")
    home = df.loc["warm", "replica"]
    assert (df.loc[[f"hit{i}" for i in range(3)], "replica"] == home).all()
    assert df.loc["hit0", "route_score"] == pytest.approx(512 / 600)
    with pytest.raises(InputError, match="load_weight"):
        make_router("prefix_aware", {"load_weight": -1})


def test_unknown_router_lists_the_valid_ones():
    with pytest.raises(InputError) as e:
        make_router("fastest")
    for name in available_routers():
        assert name in str(e.value)
    with pytest.raises(InputError, match="bad parameters"):
        make_router("round_robin", {"speed": 2})


def test_duplicate_request_ids_are_refused():
    reqs = [RequestSpec("same", 0.0, 8, 1), RequestSpec("same", 1.0, 8, 1)]
    with pytest.raises(InputError, match="duplicate"):
        run_cluster(cluster(2), Workload(reqs, "dup", "test"))


@pytest.mark.slow
@pytest.mark.parametrize("async_", [False, True])
def test_macro_steps_stay_exact_in_a_cluster(async_):
    wl = small_workload(30)
    sim = sim_config_from_dict({"scheduler.async_scheduling": async_})
    single = build_engine(sim, wl).run()
    res = run_cluster(cluster(1, sim=sim), wl)
    pd.testing.assert_frame_equal(single.metrics.requests_frame(), res.requests.drop(columns=ROUTING_COLUMNS))
    plain_sim = dataclasses.replace(sim, macro_steps=False)
    plain = run_cluster(cluster(3, "least_outstanding", latency=0.001, sim=plain_sim), wl)
    c = Cluster(cluster(3, "least_outstanding", latency=0.001, sim=sim), wl)
    macro = c.run()
    pd.testing.assert_frame_equal(plain.requests, macro.requests, check_exact=True)
    pd.testing.assert_frame_equal(plain.steps, macro.steps, check_exact=True)
    assert sum(r.engine.planner.num_macro_steps for r in c.replicas) > 0  # it did skip stepping


def test_cluster_steps_are_one_frame_each_replica_viewing_its_rows():
    """build_result copies every step once: the cluster frame is built from the replicas' step
    columns, each replica's frame is a view of its rows (equal to a fresh build of its own
    table), and the merged collector's steps_frame() is the cluster's, replica column included
    (its time series is the group's: metrics.timeseries_from_steps)."""
    import numpy as np

    res = run_cluster(cluster(3, "round_robin"), small_workload(30))
    start = 0
    for rr in res.replicas:
        own = rr.result.metrics.tables().steps
        fresh = rr.result.metrics.steps.frame()
        pd.testing.assert_frame_equal(own, fresh)
        rows = res.steps.iloc[start:start + len(fresh)]
        assert (rows["replica"] == rr.index).all()
        assert np.shares_memory(own["start_s"].to_numpy(), res.steps["start_s"].to_numpy())
        start += len(fresh)
    assert start == len(res.steps)
    merged = res.metrics.steps_frame()
    pd.testing.assert_frame_equal(merged, res.steps)


def test_cluster_requests_frame_reuses_the_replicas_gaps():
    import numpy as np

    res = run_cluster(cluster(2, "round_robin"), small_workload(12))
    by_id = {}
    for rr in res.replicas:
        frame = rr.result.metrics.tables().requests
        by_id.update(zip(frame["request_id"], frame["itl_s"]))
    shared = [np.shares_memory(itl, by_id[rid]) for rid, itl in zip(res.requests["request_id"], res.requests["itl_s"])
              if len(itl)]
    assert shared and all(shared)


def test_the_replica_table_is_each_replicas_own_summary():
    """The cluster summary's per-replica brief (metrics.brief_summary) holds exactly the values
    of the replica's full summary, which is built only when read."""
    res = run_cluster(cluster(3, "least_outstanding"), small_workload(30))
    for rr, brief in zip(res.replicas, res.summary["replicas"]):
        assert rr._summary is None  # not built for the cluster summary
        full = rr.summary
        assert brief["num_finished"] == full["num_finished"] and brief["num_rejected"] == full["num_rejected"]
        assert brief["num_steps"] == full["num_steps"] and brief["num_gpu_blocks"] == full["num_gpu_blocks"]
        assert brief["ttft_p50_s"] == full["ttft_s"]["p50"] and brief["tpot_p50_s"] == full["tpot_s"]["p50"]
        for key in ("prefix_cache_hit_rate", "kv_usage_mean", "num_preemptions"):
            assert brief[key] == full[key]
        assert rr.summary is full  # built once
