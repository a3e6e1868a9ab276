"""Cluster and plan configs (YAML mirror, clear errors), the capacity search, and the two CLI commands."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from servesim.simulator.cluster import ClusterConfig, cluster_config_from_dict, cluster_config_to_dict
from servesim.simulator.cluster.plan import mark_frontier, plan_config_from_dict, search
from servesim.traces.bundled import load_bundled
from servesim.traces.errors import InputError
from servesim.traces.transforms import rate_scale, request_limit

ROOT = Path(__file__).resolve().parents[1]

EXAMPLE = {
    "base": {"hardware": {"model": "llama-3.1-8b"}, "scheduler": {"max_num_seqs": 64}},
    "replicas": [{"count": 2, "name": "big", "sim": {"hardware.tp": 2}},
                 {"count": 1, "sim": {"hardware": {"gpu": "a100-80gb"}, "cache.num_gpu_blocks": 500,
                                      "scheduler.max_model_len": 8000}}],
    "router": {"name": "prefix_aware", "params": {"load_weight": 0.5}},
    "routing_latency_s": 0.001,
    "slo": {"ttft_s": 1.0, "tpot_s": 0.05},
    "seed": 3,
}


def test_yaml_mirror_round_trips_and_merges_base_with_overrides():
    cfg = cluster_config_from_dict(yaml.safe_load(yaml.safe_dump(EXAMPLE)))
    big, small = cfg.replicas
    assert big.sim.hardware.tp == 2 and big.sim.scheduler.max_num_seqs == 64
    assert big.sim.scheduler.max_model_len is None  # SimConfig's own default (the model's) survives the merge
    assert small.sim.scheduler.max_model_len == 8000
    assert small.sim.hardware.gpu == "a100-80gb" and small.sim.cache.num_gpu_blocks == 500
    assert small.sim.derive_num_gpu_blocks is False  # as with --set cache.num_gpu_blocks
    assert cfg.num_replicas == 3 and cfg.num_gpus == 5
    again = cluster_config_from_dict(yaml.safe_load(yaml.safe_dump(cluster_config_to_dict(cfg))))
    assert again == cfg


def test_pd_section_parses_yaml_exponents():
    cfg = cluster_config_from_dict(yaml.safe_load("""
replicas: [{count: 1, role: prefill}, {count: 3, role: decode}]
pd: {link: {bandwidth_bytes_per_s: 25.0e9, sharing: lanes, lanes: 8}, decode_router: least_kv}
"""))
    assert cfg.pd.link.bandwidth_bytes_per_s == 25e9 and cfg.pd.decode_router.name == "least_kv"


@pytest.mark.parametrize("data, field, text", [
    ({"replicas": []}, "replicas", "non-empty"),
    ({"replicas": [{"count": 0}]}, "replicas[0].count", "got 0"),
    ({"replicas": [{"count": 1, "sim": {"hardwre": {"tp": 2}}}]}, "replicas[0].sim.hardwre", "did you mean hardware"),
    ({"replicas": [{"sim": {"hardware.tp": "two"}}]}, "replicas[0].sim.hardware.tp", "expected int"),
    ({"replicas": [{"sim": {"scheduler.max_num_seqs": 0}}]}, "replicas[0].sim.scheduler", "max_num_seqs"),
    ({"replicas": [{"role": "prefill"}]}, "replicas[].role", "need a pd section"),
    ({"replicas": [{"role": "prefill"}], "pd": {}}, "replicas[].role", "prefill and decode"),
    ({"replicas": [{"role": "leader"}]}, "replicas[0].role", "unknown role"),
    ({"replicas": [{}], "routing_latency_s": -1}, "routing_latency_s", "got -1"),
    ({"replicas": [{}], "routers": "x"}, "routers", "did you mean router"),
    ({"replicas": [{"role": "prefill"}, {"role": "decode"}], "pd": {"link": {"sharing": "tdma"}}},
     "pd.link.sharing", "fair, lanes"),
    ({"replicas": [{"role": "prefill"}, {"role": "decode", "sim": {"hardware.model": "mistral-7b"}}], "pd": {}},
     "replicas[].sim", "one model"),
])
def test_bad_cluster_configs_name_the_field(data, field, text):
    with pytest.raises(InputError) as e:
        cluster_config_from_dict(data, "c.yaml")
    assert e.value.field == field and text in str(e.value) and "c.yaml" in str(e.value)


def test_unknown_router_fails_when_the_cluster_is_built():
    from servesim.simulator.cluster import Cluster

    cfg = ClusterConfig.from_dict({"replicas": [{}], "router": "nearest"})
    with pytest.raises(InputError, match="round_robin"):
        Cluster(cfg, request_limit(load_bundled(), 1))


PLAN = {
    "cluster": {"router": "least_outstanding", "slo": {"ttft_s": 0.3, "tpot_s": 0.03}},
    "search": {"tp": [1], "colocated": {"min": 1, "max": 3}, "pd": {"ratios": [[1, 1]], "max_scale": 2},
               "goodput_threshold": 0.9},
    "gpu_cost_per_hour": {"H100": 2.0},
}


@pytest.mark.slow
def test_plan_search_stops_each_shape_at_its_first_size_meeting_the_slo():
    plan = plan_config_from_dict(PLAN)
    assert plan.gpu_cost_per_hour == {"h100": 2.0}
    wl = rate_scale(request_limit(load_bundled(), 60), 6.0)
    df = search(plan, wl)
    for _, g in df.groupby("shape"):
        meets = list(g["meets_slo"])
        assert not any(meets[:-1])  # nothing evaluated after the first success
    col = df[df["kind"] == "colocated"]
    assert list(col["size"]) == list(range(1, len(col) + 1))
    assert (df["cost"] == 2.0 * df["num_gpus"]).all()
    best = df[df["best"]]
    assert len(best) == 1 and best.iloc[0]["meets_slo"]
    assert best.iloc[0]["cost"] == df[df["meets_slo"]]["cost"].min()


def test_plan_searches_pipeline_stages_and_prices_every_gpu():
    from servesim.simulator.cluster.plan import candidate_config, cost_per_hour

    plan = plan_config_from_dict({**PLAN, "search": {"tp": [1, 2], "pp": [1, 3], "colocated": {"min": 1, "max": 2},
                                                     "pd": {"ratios": [[1, 2]]}}})
    shapes = plan.search.shapes()
    assert [(s.kind, s.tp, s.pp) for s in shapes] == [
        ("colocated", 1, 1), ("colocated", 1, 3), ("colocated", 2, 1), ("colocated", 2, 3),
        ("pd", 1, 1), ("pd", 1, 3), ("pd", 2, 1), ("pd", 2, 3)]
    assert shapes[3].label == "colocated tp2 pp3" and shapes[2].label == "colocated tp2"
    cfg = candidate_config(plan, shapes[7], 2)  # P1:D2 x2, tp2 pp3: 6 replicas of 6 GPUs
    assert {(g.sim.hardware.tp, g.sim.hardware.pp) for g in cfg.replicas} == {(2, 3)}
    assert cfg.num_gpus == 36 and cost_per_hour(plan, cfg) == 72.0


def test_frontier_keeps_points_no_cheaper_point_beats():
    df = pd.DataFrame({"cost": [1, 2, 2, 3, 4], "goodput_fraction": [0.2, 0.5, 0.4, 0.5, 0.95],
                       "meets_slo": [False, False, False, False, True], "error": [None] * 5})
    out = mark_frontier(df, 0.9)
    assert list(out["frontier"]) == [True, True, False, False, True]
    assert list(out["best"]) == [False, False, False, False, True]


@pytest.mark.parametrize("data, field", [
    ({"search": {"tp": [0]}}, "search.tp"),
    ({"search": {"pp": [1, True]}}, "search.pp"),
    ({"search": {"pp": 2}}, "search.pp"),
    ({"search": {"colocated": {"min": 3, "max": 1}}}, "search.colocated"),
    ({"search": {"pd": {"ratios": [[1]]}}}, "search.pd.ratios"),
    ({"search": {"goodput_threshold": 1.5}}, "search.goodput_threshold"),
    ({"cluster": {"replicas": [{}]}}, "cluster"),
    ({"cluster": {"router": {"nam": "x"}}}, "router.nam"),
    ({"gpu_cost_per_hour": {"h100": -1}}, "gpu_cost_per_hour"),
    ({"serch": {}}, "serch"),
])
def test_bad_plan_configs_name_the_field(data, field):
    with pytest.raises(InputError) as e:
        plan_config_from_dict(data)
    assert e.value.field == field


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "servesim", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.slow
def test_cluster_and_plan_commands_write_their_outputs(tmp_path):
    cfg = tmp_path / "pd.yaml"
    cfg.write_text(yaml.safe_dump({
        "workload": {"trace": "sharegpt-300", "max_requests": 20},
        "replicas": [{"count": 1, "role": "prefill"}, {"count": 1, "role": "decode"}], "pd": {}}))
    r = _cli("cluster", str(cfg), "--out", str(tmp_path / "run"), "--rate-scale", "2")
    assert r.returncode == 0, r.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["num_finished"] == 20 and "ttft_breakdown_s" in summary["pd"]
    req = pd.read_parquet(tmp_path / "run" / "requests.parquet")
    assert {"prefill_replica", "decode_replica", "transfer_s"} <= set(req.columns)
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({**PLAN, "workload": {"max_requests": 20},
                                    "search": {"colocated": {"min": 1, "max": 2}}}))
    r = _cli("plan", str(plan), "--out", str(tmp_path / "plan"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "plan" / "frontier.png").stat().st_size > 0
    assert "cheapest" in r.stdout or "meets" in r.stderr
    assert len(pd.read_csv(tmp_path / "plan" / "plan.csv")) >= 1
    bad = tmp_path / "bad.yaml"
    bad.write_text("replicas: [{count: 1}]\nrouter: nearest\n")
    r = _cli("cluster", str(bad), "--out", str(tmp_path / "x"))
    assert r.returncode == 2 and "nearest" in r.stderr and "round_robin" in r.stderr


def test_a_model_config_json_is_found_next_to_the_cluster_file(tmp_path, monkeypatch):
    """hardware.model naming a config.json relative to the cluster YAML resolves there, wherever
    the command runs (as a scenario's trace does); model names stay names."""
    (tmp_path / "cfgs" / "m").mkdir(parents=True)
    (tmp_path / "cfgs" / "m" / "config.json").write_text(json.dumps({
        "model_type": "llama", "num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 512, "vocab_size": 1000, "max_position_embeddings": 4096}))
    path = tmp_path / "cfgs" / "cluster.yaml"
    path.write_text(yaml.safe_dump({"base": {"hardware": {"model": "m/config.json"}},
                                    "replicas": [{"count": 1}, {"count": 1, "sim": {"hardware.model": "llama-3.1-8b"}}]}))
    monkeypatch.chdir(tmp_path)
    first, second = ClusterConfig.from_yaml(path).replicas
    assert first.sim.hardware.model == str((tmp_path / "cfgs" / "m" / "config.json").resolve())
    assert second.sim.hardware.model == "llama-3.1-8b"


def test_a_plan_template_finds_its_model_config_json_too(tmp_path, monkeypatch):
    from servesim.simulator.cluster.plan import PlanConfig

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({
        "model_type": "llama", "num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 512, "vocab_size": 1000, "max_position_embeddings": 4096}))
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump({"cluster": {"base": {"hardware.model": "m", "hardware.gpu": "h100"}},
                                    "search": {"tp": [1]}}))
    monkeypatch.chdir(ROOT)
    plan = PlanConfig.from_yaml(path)
    assert plan.cluster["base"]["hardware"]["model"] == str((tmp_path / "m").resolve())


def test_a_fitted_cost_model_file_is_found_next_to_the_cluster_file(tmp_path, monkeypatch):
    import gzip

    from servesim.simulator.cost_model.calibrated import __file__ as calibrated_init

    fit = Path(calibrated_init).parent / "llama-3.1-8b__h100__tp1.json.gz"
    (tmp_path / "m.json").write_bytes(gzip.decompress(fit.read_bytes()))
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump({"base": {"cost_model": {"name": "profiled", "params": {"path": "m.json"}}},
                                    "replicas": [{"count": 1}]}))
    monkeypatch.chdir(ROOT)
    (group,) = ClusterConfig.from_yaml(path).replicas
    assert group.sim.cost_model.params["path"] == str((tmp_path / "m.json").resolve())
    assert group.sim.cost_model.name == "profiled"
