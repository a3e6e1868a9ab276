"""Autoscaling pieces alone: policies (exact recommendations), the HPA stabilization, cold-start
arithmetic, the price table, config validation from Python and YAML."""

from __future__ import annotations

from collections import deque

import pytest

from servesim.simulator.cluster import ClusterConfig, ReplicaGroup, cluster_config_from_dict, cluster_config_to_dict
from servesim.simulator.cluster.autoscale import (
    AutoscaleConfig, ColdStartConfig, PolicyConfig, PoolConfig, PoolMetrics, cold_start_of, make_policy,
)
from servesim.simulator.cluster.autoscale.cold_start import replica_weight_bytes
from servesim.simulator.cluster.autoscale.controller import _stabilized
from servesim.simulator.cluster.config import sim_config_from_dict
from servesim.simulator.config import SloConfig
from servesim.simulator.specs.gpu_prices import price_per_gpu_hour, shipped_prices
from servesim.traces.errors import InputError


def _m(**kw) -> PoolMetrics:
    base = dict(now_s=10.0, role="both", num_ready=4, num_starting=0, num_waiting=0, num_outstanding=0, kv_usage=0.0,
                request_rate_per_s=0.0, mean_prompt_len=None, mean_output_len=None, ttft_s=None, itl_s=None,
                slo_attainment=None)
    return PoolMetrics(**{**base, **kw})


SLO = SloConfig(ttft_s=1.0, tpot_s=0.05)


def test_target_utilization_is_the_hpa_formula():
    p = make_policy("target_utilization", {"metric": "outstanding", "target": 10}, "p", SLO)
    assert p.desired(_m(num_outstanding=4 * 25), 4) == 10  # ceil(4 * 25 / 10)
    assert p.desired(_m(num_outstanding=4 * 12), 4) == 5  # ceil(4 * 1.2)
    assert p.desired(_m(num_outstanding=4 * 10.5), 4) == 4  # within tolerance
    assert p.desired(_m(num_outstanding=4 * 3), 4) == 2  # ceil(4 * 0.3) = 2
    assert p.desired(_m(num_outstanding=0), 4) == 0  # the controller clamps to min_replicas
    assert p.desired(_m(num_ready=0), 3) == 3  # nothing to measure: no change


def test_target_utilization_tolerance_boundary():
    p = make_policy("target_utilization", {"metric": "kv_usage", "target": 0.5, "tolerance": 0.2}, "p", SLO)
    assert p.desired(_m(kv_usage=0.6), 4) == 4  # ratio 1.2: at the tolerance, kept
    assert p.desired(_m(kv_usage=0.75), 4) == 6  # ceil(4 * 1.5)


def test_threshold_steps():
    p = make_policy("threshold", {"metric": "queue_depth", "scale_up_above": 2, "scale_down_below": 0.5, "step": 2},
                    "p", SLO)
    assert p.desired(_m(num_waiting=12), 4) == 6  # 3 per replica > 2
    assert p.desired(_m(num_waiting=8), 4) == 4  # 2 per replica: not above
    assert p.desired(_m(num_waiting=1), 4) == 2  # 0.25 < 0.5
    q = make_policy("threshold", {"metric": "ttft", "scale_up_above": 1.0, "scale_down_below": 0.2}, "p", SLO)
    assert q.desired(_m(ttft_s=None), 3) == 3  # no sample: no change
    assert q.desired(_m(ttft_s=1.5), 3) == 4


def test_slo_planner_divides_load_by_capacity_with_corrections():
    p = make_policy("slo_planner", {"prefill_tokens_per_s": 20000, "decode_tokens_per_s": 2000}, "p", SLO)
    m = _m(request_rate_per_s=10.0, mean_prompt_len=1000.0, mean_output_len=200.0)
    assert p.desired(m, 1) == 2  # 10 * 1000 / 20000 + 10 * 200 / 2000 = 1.5
    assert p.desired(_m(role="prefill", request_rate_per_s=10.0, mean_prompt_len=1000.0, mean_output_len=200.0), 1) == 1
    assert p.desired(_m(role="decode", request_rate_per_s=10.0, mean_prompt_len=1000.0, mean_output_len=200.0), 1) == 1
    # observed TTFT 2x its target doubles the prefill need; a fast ITL does not cut the decode need
    slow = _m(request_rate_per_s=10.0, mean_prompt_len=1000.0, mean_output_len=200.0, ttft_s=2.0, itl_s=0.01)
    assert p.desired(slow, 1) == 2  # 0.5 * 2 + 1.0 = 2.0
    assert p.desired(_m(), 3) == 0  # no traffic in the window


@pytest.mark.parametrize("name,params,field", [
    ("treshold", {}, "p.name"),
    ("threshold", {"metric": "queue"}, "autoscale.pools[].policy.params.metric"),
    ("threshold", {"scale_up_above": 1, "scale_down_below": 2}, "autoscale.pools[].policy.params"),
    ("target_utilization", {"target": 0}, "autoscale.pools[].policy.params.target"),
    ("target_utilization", {"bogus": 1}, "p.params"),
    ("slo_planner", {}, "autoscale.pools[].policy.params"),
])
def test_bad_policies_name_the_field(name, params, field):
    with pytest.raises(InputError) as e:
        make_policy(name, params, "p", SLO)
    assert e.value.field == field
    if name == "treshold":
        assert "did you mean 'threshold'" in str(e.value)


def test_stabilization_windows_follow_the_hpa():
    recs: deque = deque()
    # scale-down: the highest recommendation of the last 300 s holds the count
    assert _stabilized(recs, 0.0, 8, 4, 0.0, 300.0) == 8
    assert _stabilized(recs, 15.0, 2, 8, 0.0, 300.0) == 8
    assert _stabilized(recs, 299.0, 2, 8, 0.0, 300.0) == 8
    assert _stabilized(recs, 301.0, 2, 8, 0.0, 300.0) == 2  # the 8 at t=0 left the window
    # scale-up with a window: the lowest recommendation of its window bounds it
    recs = deque()
    assert _stabilized(recs, 0.0, 2, 2, 60.0, 0.0) == 2
    assert _stabilized(recs, 30.0, 6, 2, 60.0, 0.0) == 2
    assert _stabilized(recs, 61.0, 6, 2, 60.0, 0.0) == 6


def test_cold_start_adds_every_term():
    sim = sim_config_from_dict({"hardware": {"model": "llama-3.1-8b", "gpu": "h100", "tp": 2}})
    cfg = ColdStartConfig(provision_s=100.0, image_bytes=8e9, image_pull_bytes_per_s=1e8, container_start_s=5.0,
                          weight_load_bytes_per_s=2e9, compile_s=20.0, graph_capture_s=10.0, warmup_s=3.0)
    c = cold_start_of(cfg, sim)
    wb = replica_weight_bytes(sim)
    assert 15e9 < wb < 17e9  # Llama-3.1-8B in bf16, both TP shards
    assert c.image_pull_s == 80.0
    assert c.weight_load_s == wb / 2e9
    assert c.total_s == 100.0 + 80.0 + 5.0 + wb / 2e9 + 20.0 + 10.0 + 3.0


def test_default_cold_start_is_kaitos_measured_phases():
    c = cold_start_of(ColdStartConfig(), sim_config_from_dict({"hardware": {"model": "llama-3.1-8b", "gpu": "h100"}}))
    assert (c.provision_s, c.image_pull_s, c.container_start_s) == (410.0, 101.0, 105.0)
    assert (c.compile_s, c.graph_capture_s) == (19.37, 15.0)
    assert c.warmup_s == pytest.approx(4.97)
    assert 600 < c.total_s < 700


def test_price_table_and_overrides():
    table = shipped_prices()
    assert table["h100"].usd_per_hour == 4.176 and table["h100"].source and table["h100"].read
    assert price_per_gpu_hour("H100-SXM") == 4.176
    assert price_per_gpu_hour("h100", {"h100": 2.5}) == 2.5
    with pytest.raises(InputError):
        ClusterConfig(gpu_cost_per_hour={"h100": -1})


def _yaml(**autoscale) -> dict:
    return {"base": {"hardware": {"model": "llama-3.1-8b", "gpu": "h100"}},
            "replicas": [{"count": 2, "name": "web"}], "autoscale": autoscale}


def test_yaml_round_trip():
    data = _yaml(interval_s=30, pools=[{"group": "web", "min_replicas": 1, "max_replicas": 4,
                                        "policy": {"name": "threshold", "params": {"metric": "kv_usage",
                                                                                   "scale_up_above": 0.8,
                                                                                   "scale_down_below": 0.2}},
                                        "cold_start": {"provision_s": 0}}])
    cfg = cluster_config_from_dict(data)
    assert cfg.autoscale.interval_s == 30.0 and cfg.autoscale.pools[0].cold_start.provision_s == 0
    assert cfg.autoscale.pools[0].scale_down_stabilization_s == 300.0
    again = cluster_config_from_dict(cluster_config_to_dict(cfg))
    assert again == cfg


@pytest.mark.parametrize("pools,field,words", [
    ([{"group": "wbe", "max_replicas": 4}], "autoscale.pools[0].group", "did you mean 'web'"),
    ([{"group": "web", "max_replicas": 1}], "replicas[0].count", "outside [1, 1]"),
    ([{"group": "web", "min_replicas": 3, "max_replicas": 2}], "autoscale.pools[0].min_replicas", "min_replicas 3"),
    ([{"group": "web", "max_replica": 4}], "autoscale.pools[0].max_replica", "did you mean max_replicas"),
    ([{"group": "web", "policy": "slo_plan"}], "autoscale.pools[0].policy.name", "did you mean 'slo_planner'"),
    ([{"group": "web", "cold_start": {"provision_s": -1}}], "autoscale.pools[0].cold_start.provision_s", "got -1"),
    ([{"group": "web"}, {"group": "web"}], "autoscale.pools[].group", "scaled twice"),
])
def test_bad_autoscale_yaml(pools, field, words):
    with pytest.raises(InputError) as e:
        cluster_config_from_dict(_yaml(pools=pools), "fleet.yaml")
    assert e.value.field == field, e.value
    assert words in str(e.value)
    assert e.value.path == "fleet.yaml"


def test_lockstep_groups_are_not_autoscaled():
    sim = sim_config_from_dict({"hardware": {"model": "llama-3.1-8b", "gpu": "h100"}})
    with pytest.raises(InputError, match="lockstep"):
        ClusterConfig(replicas=[ReplicaGroup(2, sim, lockstep=True)],
                      autoscale=AutoscaleConfig([PoolConfig("both", 1, 4, PolicyConfig("threshold"))]))
