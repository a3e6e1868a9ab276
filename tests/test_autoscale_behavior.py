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
