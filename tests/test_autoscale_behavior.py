"""The HPA's rate limits (autoscale/behavior.py): exact bounds per Kubernetes' formulas, periods
counted from earlier decisions, select policies, validation, and a cluster run whose scale-up the
limits pace (events at the times the parameters imply)."""

from __future__ import annotations

import pytest

from servesim.simulator.cluster import ClusterConfig, ReplicaGroup, RouterConfig, cluster_config_from_dict, run_cluster
from servesim.simulator.cluster.autoscale import AutoscaleConfig, PolicyConfig, PoolConfig
from servesim.simulator.cluster.autoscale.behavior import ScaleEvents, rate_limited
from servesim.simulator.cluster.autoscale.config import K8S_SCALE_UP_POLICIES, ScalingPolicy
from servesim.traces.errors import InputError


def _pool(**kw) -> PoolConfig:
    return PoolConfig("both", kw.pop("min_replicas", 1), kw.pop("max_replicas", 100), **kw)


def test_kubernetes_defaults_double_or_add_four_per_15_s():
    pc, ev = _pool(), ScaleEvents()
    assert pc.scale_up_policies == K8S_SCALE_UP_POLICIES and pc.scale_up_select_policy == "max"
    assert rate_limited(pc, ev, 0.0, 50, 2) == 6  # max(ceil(2 * 2), 2 + 4)
    assert rate_limited(pc, ev, 10.0, 50, 6) == 6  # the period (15 s) still holds +4: it starts at 2
    assert rate_limited(pc, ev, 15.0, 50, 6) == 12  # the t=0 event is not after 15 - 15: start 6
    assert rate_limited(pc, ev, 30.0, 50, 12) == 24
    assert rate_limited(pc, ev, 45.0, 20, 24) == 20  # going down: 100 % per 15 s bounds nothing
    assert rate_limited(pc, ev, 60.0, 0, 20) == 1  # ... down to min_replicas


def test_select_min_and_disabled():
    ev = ScaleEvents()
    assert rate_limited(_pool(scale_up_select_policy="min"), ev, 0.0, 50, 2) == 4  # min(4, 6)
    assert rate_limited(_pool(scale_up_select_policy="disabled"), ScaleEvents(), 0.0, 50, 2) == 2
    assert rate_limited(_pool(scale_down_select_policy="disabled"), ScaleEvents(), 0.0, 1, 9) == 9


def test_scale_down_pods_and_percent_truncation():
    pods = _pool(scale_down_policies=[{"type": "pods", "value": 2, "period_s": 60}])
    ev = ScaleEvents()
    assert rate_limited(pods, ev, 0.0, 1, 10) == 8
    assert rate_limited(pods, ev, 30.0, 1, 8) == 8  # the period started at 10: 10 - 2 = 8
    assert rate_limited(pods, ev, 60.0, 1, 8) == 6  # the t=0 event is not strictly after 60 - 60
    half = _pool(scale_down_policies=[{"type": "percent", "value": 50, "period_s": 15}])
    assert rate_limited(half, ScaleEvents(), 0.0, 1, 7) == 3  # int(7 * 0.5) truncates
    assert rate_limited(half, ScaleEvents(), 0.0, 5, 7) == 5  # desired within the bound


def test_no_policies_no_limit_and_min_max_stay_outer_bounds():
    free = _pool(scale_up_policies=[], scale_down_policies=[], max_replicas=40, min_replicas=3)
    assert rate_limited(free, ScaleEvents(), 0.0, 90, 2) == 40
    assert rate_limited(free, ScaleEvents(), 0.0, 0, 30) == 3


@pytest.mark.parametrize("key,value,field,words", [
    ("scale_up_policies", [{"type": "pod", "value": 2, "period_s": 15}], "scale_up_policies[0].type", "did you mean 'pods'"),
    ("scale_up_policies", [{"type": "pods", "value": 0, "period_s": 15}], "scale_up_policies[0].value", ">= 1"),
    ("scale_down_policies", [{"type": "pods", "value": 1, "period_s": 2000}], "scale_down_policies[0].period_s",
     "1800"),
    ("scale_down_policies", [{"type": "pods", "value": 1}], "scale_down_policies[0]", "period_s"),
    ("scale_up_select_policy", "maximum", "scale_up_select_policy", "did you mean 'max'"),
])
def test_bad_behavior_names_the_field(key, value, field, words):
    data = {"base": {"hardware": {"model": "llama-3.1-8b", "gpu": "h100"}}, "replicas": [{"count": 2, "name": "web"}],
            "autoscale": {"pools": [{"group": "web", key: value}]}}
    with pytest.raises(InputError) as e:
        cluster_config_from_dict(data, "fleet.yaml")
    assert e.value.field.endswith(field) and words in str(e.value) and e.value.path == "fleet.yaml", e.value


def test_a_cluster_scales_up_one_replica_a_minute_under_a_pods_policy():
    from test_autoscale_timeline import COLD, _sim, _steady

    pool = PoolConfig("both", 1, 4, PolicyConfig("test_scripted", {"script": [(0, 1), (2, 4)]}),
                      scale_down_stabilization_s=0.0, cold_start=COLD,
                      scale_up_policies=[ScalingPolicy("pods", 1, 60.0)])
    cfg = ClusterConfig(replicas=[ReplicaGroup(1, _sim())], router=RouterConfig("round_robin"),
                        autoscale=AutoscaleConfig([pool], interval_s=30.0, window_s=60.0))
    res = run_cluster(cfg, _steady(40, 5.0))  # arrivals until ~195 s: decisions at 30, 60, ..., 180
    starts = res.tables["scale_events"]
    starts = list(starts[starts["event"] == "cold_start"]["time_s"])
    assert starts == [30.0, 90.0, 150.0]  # +1, then the next once the 30 s event is no longer after now - 60
    tl = res.tables["scale_timeline"]
    assert list(tl["stabilized"][:3]) == [4, 4, 4] and list(tl["target"][:6]) == [2, 2, 3, 3, 4, 4]
    assert res.summary["num_finished"] == 40


def _to_zero(macro: bool = True):
    from test_autoscale_timeline import COLD, _sim

    pool = PoolConfig("both", 0, 2, PolicyConfig("target_utilization", {"metric": "outstanding", "target": 4}),
                      scale_down_stabilization_s=0.0, cold_start=COLD)
    return ClusterConfig(replicas=[ReplicaGroup(1, _sim(macro))], router=RouterConfig("round_robin"),
                         autoscale=AutoscaleConfig([pool], interval_s=10.0, window_s=10.0))


def test_scale_to_zero_is_exact_on_the_fast_path():
    import pandas as pd

    from servesim.traces.workload import RequestSpec, Workload

    specs = [RequestSpec(f"r{i}", t, 300, 150) for i, t in enumerate([0.1, 0.4, 31.0, 31.5, 32.0, 75.0, 75.2])]
    wl = Workload(specs, "gaps", "test")
    fast, slow = run_cluster(_to_zero(True), wl), run_cluster(_to_zero(False), wl)
    pd.testing.assert_frame_equal(fast.requests, slow.requests)
    pd.testing.assert_frame_equal(fast.steps, slow.steps)
    assert fast.summary["autoscale"]["activator"]["num_held"] >= 2 and fast.summary["num_finished"] == 7


def test_scale_to_zero_holds_requests_until_a_replica_is_ready():
    """Idle: the last replica drains and the pool sits at zero (no GPU-time); a request that comes
    meanwhile is held, the next decision asks for one replica (activation), and the held requests
    are routed the moment it is ready, in arrival order; nothing is lost."""
    from test_autoscale_timeline import COLD

    from servesim.simulator.cluster.autoscale.cold_start import cold_start_of
    from servesim.traces.workload import RequestSpec, Workload

    cfg = _to_zero()
    specs = [RequestSpec(f"a{i}", 0.1 * i, 100, 20) for i in range(3)] + \
        [RequestSpec("b0", 33.0, 100, 20), RequestSpec("b1", 35.0, 100, 20)]
    res = run_cluster(cfg, Workload(specs, "idle gap", "test"))
    ev = res.tables["scale_events"]
    rows = list(ev[["time_s", "event", "replica"]].itertuples(index=False, name=None))
    ready_s = 40.0 + cold_start_of(COLD, cfg.replicas[0].sim).total_s
    assert rows == [(10.0, "drain", "both0"), (10.0, "removed", "both0"), (40.0, "cold_start", "both1"),
                    (ready_s, "ready", "both1")], rows
    req = res.requests.set_index("request_id")
    assert list(req.loc[["b0", "b1"], "route_time_s"]) == [ready_s, ready_s]
    assert req.loc["b0", "ttft_s"] > ready_s - 33.0  # held time is part of TTFT
    assert res.summary["num_finished"] == 5
    assert res.summary["autoscale"]["activator"] == {"num_held": 2, "num_releases": 1}
    tl = res.tables["scale_timeline"]
    assert list(tl["num_ready"][:4]) == [0, 0, 0, 0] and list(tl["num_waiting"][:4]) == [0, 0, 0, 2]


def test_scale_to_zero_needs_the_only_front_group():
    from test_autoscale_timeline import _sim

    with pytest.raises(InputError, match="only when it is the one group"):
        ClusterConfig(replicas=[ReplicaGroup(1, _sim(), name="a"), ReplicaGroup(1, _sim(), name="b")],
                      autoscale=AutoscaleConfig([PoolConfig("a", 0, 2)]))
