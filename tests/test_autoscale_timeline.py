"""Autoscaled cluster runs: events at the times the parameters imply (hand-built arrivals, a
scripted policy), every request counted through scale-downs, P/D pools, cost over the replica
timeline, and the fast path's exactness under autoscaling (macro-steps on vs off)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from servesim.simulator.cluster import Cluster, ClusterConfig, PDConfig, ReplicaGroup, RouterConfig, run_cluster
from servesim.simulator.cluster.autoscale import AutoscaleConfig, ColdStartConfig, PolicyConfig, PoolConfig
from servesim.simulator.cluster.autoscale.cold_start import cold_start_of
from servesim.simulator.cluster.autoscale.policies import POLICIES, PoolMetrics, register_policy
from servesim.simulator.cluster.config import sim_config_from_dict
from servesim.traces.workload import RequestSpec, Workload

if "test_scripted" not in POLICIES.names():
    @register_policy("test_scripted")
    class Scripted:
        """The count a script gives for the decision's time: [(from_s, count), ...]."""

        def __init__(self, slo, script):
            self.script = [tuple(s) for s in script]

        def desired(self, m: PoolMetrics, current: int) -> int:
            return [c for t, c in self.script if m.now_s >= t][-1]


COLD = ColdStartConfig(provision_s=2.0, image_bytes=0.0, container_start_s=0.0, weight_load_bytes_per_s=64e9,
                       compile_s=0.0, graph_capture_s=0.0, warmup_s=0.0)


def _sim(macro: bool = True, async_: bool = True):
    return sim_config_from_dict({"hardware": {"model": "llama-3.1-8b", "gpu": "h100"}, "macro_steps": macro,
                                 "scheduler.async_scheduling": async_})


def _steady(n: int, gap_s: float, output_len: int = 200, start_s: float = 0.1) -> Workload:
    specs = [RequestSpec(f"r{i}", start_s + i * gap_s, 200, output_len) for i in range(n)]
    return Workload(specs, "steady", "test")


def _scripted(script, cold=COLD, count=1, max_replicas=3, macro=True, async_=True, router="round_robin"):
    pool = PoolConfig("both", 1, max_replicas, PolicyConfig("test_scripted", {"script": script}),
                      scale_down_stabilization_s=0.0, cold_start=cold)
    return ClusterConfig(replicas=[ReplicaGroup(count, _sim(macro, async_))], router=RouterConfig(router),
                         autoscale=AutoscaleConfig([pool], interval_s=1.0, window_s=2.0))


def test_events_at_the_times_the_parameters_imply():
    cfg = _scripted([(0, 1), (2, 3), (8, 1)])
    wl = _steady(60, 0.2)
    res = run_cluster(cfg, wl)
    ev = res.tables["scale_events"]
    cold = cold_start_of(COLD, cfg.replicas[0].sim)
    assert cold.total_s == 2.0 + cold.weight_bytes / 64e9
    ready_s = 2.0 + cold.total_s
    head = list(ev[["time_s", "event", "replica"]].itertuples(index=False, name=None))[:4]
    assert head == [(2.0, "cold_start", "both1"), (2.0, "cold_start", "both2"),
                    (ready_s, "ready", "both1"), (ready_s, "ready", "both2")]
    drains = ev[ev["event"] == "drain"]
    assert list(drains["time_s"]) == [8.0, 8.0]
    req = res.requests
    names = {r["name"]: i for i, r in enumerate(res.summary["replicas"])}
    for name in drains["replica"]:
        served = req[req["replica"] == names[name]]
        removed = ev[(ev["event"] == "removed") & (ev["replica"] == name)]["time_s"].item()
        assert removed == max(served["finish_s"].max(), 8.0)  # it finished what it held, then left
    # every request finished, each routed only to a replica ready and not draining at that moment
    assert res.summary["num_finished"] == len(wl.requests) == len(req)
    life = res.tables["replica_lifetimes"].set_index("replica_index")
    for route_s, idx in zip(req["route_time_s"], req["replica"]):
        lt = life.loc[idx]
        assert lt["ready_s"] <= route_s and (pd.isna(lt["drain_s"]) or route_s < lt["drain_s"])
    tl = res.tables["scale_timeline"]
    assert list(tl["time_s"][:9]) == [float(k) for k in range(1, 10)]
    assert list(tl["num_ready"][:9]) == [1, 1, 1, 1, 3, 3, 3, 1, 1]
    assert list(tl["num_starting"][:4]) == [0, 2, 2, 2]


def test_scale_down_cancels_starting_replicas_first():
    slow = ColdStartConfig(provision_s=10.0, image_bytes=0.0, container_start_s=0.0, compile_s=0.0,
                           graph_capture_s=0.0, warmup_s=0.0)
    res = run_cluster(_scripted([(0, 1), (2, 3), (4, 2), (5, 1)], cold=slow), _steady(40, 0.2))
    ev = list(res.tables["scale_events"][["time_s", "event", "replica"]].itertuples(index=False, name=None))
    assert ev == [(2.0, "cold_start", "both1"), (2.0, "cold_start", "both2"), (4.0, "cancelled", "both2"),
                  (5.0, "cancelled", "both1")]
    assert res.summary["autoscale"]["num_ready"] == 0
    # billed: the fleet's one replica over the run, plus 2 s and 3 s of the cancelled starts
    end = res.summary["sim_duration_s"]
    assert res.summary["cost"]["gpu_hours"] == pytest.approx((end + 2.0 + 3.0) / 3600)
    assert res.summary["cost"]["usd"] == pytest.approx((end + 5.0) / 3600 * 4.176)


def test_no_request_lost_when_draining_busy_replicas():
    """Long requests on every replica when two of three are drained: all finish where they are."""
    cold = ColdStartConfig(provision_s=0.5, image_bytes=0.0, container_start_s=0.0, compile_s=0.0,
                           graph_capture_s=0.0, warmup_s=0.0)
    wl = _steady(90, 0.1, output_len=600)
    res = run_cluster(_scripted([(0, 3), (3, 1)], cold=cold, count=3, router="least_outstanding"), wl)
    drains = res.tables["scale_events"].query("event == 'drain'")
    assert len(drains) == 2 and (drains["num_outstanding"] > 0).all()
    assert res.summary["num_finished"] == 90 and res.requests["finish_s"].notna().all()
    assert res.summary["autoscale"]["num_removed"] == 2


def test_pd_pools_scale_separately_and_lose_nothing():
    sim = _sim()
    script = {"script": [(0, 1), (2, 2), (6, 1)]}
    pools = [PoolConfig(role, 1, 2, PolicyConfig("test_scripted", script), scale_down_stabilization_s=0.0,
                        cold_start=COLD) for role in ("prefill", "decode")]
    cfg = ClusterConfig(replicas=[ReplicaGroup(1, sim, role="prefill"), ReplicaGroup(1, sim, role="decode")],
                        pd=PDConfig(), autoscale=AutoscaleConfig(pools, interval_s=1.0))
    res = run_cluster(cfg, _steady(50, 0.2, output_len=300))
    ev = res.tables["scale_events"]
    assert set(ev.query("event == 'ready'")["replica"]) == {"prefill1", "decode1"}
    drains = ev.query("event == 'drain' and time_s == 6.0")
    assert len(drains) == 2 and drains["num_outstanding"].max() > 0  # drained while busy
    assert res.summary["num_finished"] == 50 and res.requests["finish_s"].notna().all()
    # a drained P/D replica is removed at the first decision that finds it holding nothing
    req, index = res.requests, {r["name"]: i for i, r in enumerate(res.summary["replicas"])}
    for name in drains["replica"]:
        removed = ev.query("event == 'removed' and replica == @name")["time_s"].item()
        col = "decode_replica" if name.startswith("decode") else "prefill_replica"
        mine = req[req[col] == index[name]]
        last = mine["finish_s"].max() if col == "decode_replica" else (mine["arrival_s"] + mine["prefill_queue_s"]
                                                                        + mine["prefill_s"] + mine["transfer_s"]).max()
        assert removed == math.ceil(max(last, 7.0))  # checked from the decision after the drain (6 s) on


def test_fixed_fleet_cost_is_gpus_times_duration():
    sim = sim_config_from_dict({"hardware": {"model": "llama-3.1-8b", "gpu": "h100", "tp": 2}})
    res = run_cluster(ClusterConfig(replicas=[ReplicaGroup(3, sim)], gpu_cost_per_hour={"h100": 2.0}),
                      _steady(30, 0.1))
    c, end = res.summary["cost"], res.summary["sim_duration_s"]
    assert c["gpu_hours"] == pytest.approx(6 * end / 3600)
    assert c["usd"] == pytest.approx(12.0 * end / 3600)
    assert c["usd_per_day"] == pytest.approx(12.0 * 24)
    tokens = int(res.requests["prompt_len"].sum() + res.requests["output_len"].sum())
    assert c["usd_per_million_tokens"] == pytest.approx(c["usd"] / tokens * 1e6)
    assert "autoscale" not in res.summary and res.tables == {}


@pytest.mark.parametrize("router,async_", [
    ("least_kv", True), ("round_robin", True), ("least_outstanding", True),
    pytest.param("least_kv", False, marks=pytest.mark.slow),
    pytest.param("round_robin", False, marks=pytest.mark.slow),
    pytest.param("least_outstanding", False, marks=pytest.mark.slow),
    pytest.param("jsq_power_of_two", True, marks=pytest.mark.slow),
])
def test_macro_steps_exact_under_autoscaling(router, async_):
    """Decisions read replica state between dispatches: runs stop at each decision, so the
    results are identical to stepping every step."""
    policy = PolicyConfig("target_utilization", {"metric": "outstanding", "target": 6})
    busy = _steady(300, 0.04, output_len=120).requests  # 0.1 .. 12.06 s: scale up
    quiet = [RequestSpec(f"q{i}", 16.0 + 0.5 * i, 200, 60) for i in range(20)]  # 16 .. 25.5 s: scale down
    wl = Workload(busy + quiet, "busy-then-quiet", "test")

    def run(macro):
        pool = PoolConfig("both", 1, 4, policy, scale_down_stabilization_s=2.0, cold_start=COLD)
        cfg = ClusterConfig(replicas=[ReplicaGroup(1, _sim(macro, async_))], router=RouterConfig(router),
                            autoscale=AutoscaleConfig([pool], interval_s=0.5, window_s=2.0))
        cluster = Cluster(cfg, wl)
        return cluster, cluster.run()

    (_, plain), (cluster, macro) = run(False), run(True)
    assert sum(r.engine.planner.num_macro_steps for r in cluster.replicas) > 100  # runs did happen
    assert plain.summary["autoscale"]["num_ready"] >= 1 and plain.summary["autoscale"]["num_drained"] >= 1
    pd.testing.assert_frame_equal(plain.requests, macro.requests)
    pd.testing.assert_frame_equal(plain.steps, macro.steps)
    pd.testing.assert_frame_equal(plain.tables["scale_timeline"], macro.tables["scale_timeline"])
    assert sum(r.result.planner_declined is None for r in macro.replicas) == len(macro.replicas)


def test_result_folder_has_the_autoscaling_files(tmp_path):
    from servesim.simulator.cluster import write_cluster_results

    res = run_cluster(_scripted([(0, 1), (2, 2), (6, 1)]), _steady(40, 0.2))
    out = write_cluster_results(tmp_path / "run", res, {"name": "steady"})
    events = pd.read_csv(out / "scale_events.csv")
    assert list(events["event"]) == ["cold_start", "ready", "drain", "removed"]
    assert len(pd.read_csv(out / "scale_timeline.csv")) == res.summary["autoscale"]["num_decisions"]
    assert set(pd.read_csv(out / "replica_lifetimes.csv")["replica"]) == {"both0", "both1"}
    import json

    summary = json.loads((out / "summary.json").read_text())
    assert summary["cost"]["gpu_hours"] > 0 and summary["autoscale"]["num_removed"] == 1
