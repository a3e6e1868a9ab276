"""The tier-aware routing scenario (scenarios/cluster/multiturn_prefix_aware_*.yaml): a synthetic
`workload:` in a cluster file, `--smoke`, and the CPU tiers in the cluster summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servesim.cli import app
from servesim.commands.cluster import load_cluster_workload, load_cluster_yaml
from servesim.simulator.cluster import cluster_config_from_dict, run_cluster
from servesim.traces.errors import InputError

DIR = Path(__file__).resolve().parents[1] / "scenarios" / "cluster"


def _run(name: str, smoke: bool):
    path = DIR / f"multiturn_prefix_aware_{name}.yaml"
    data, wl_spec = load_cluster_yaml(path)
    wl = load_cluster_workload(wl_spec, None, base_dir=path.parent, smoke=smoke)
    return run_cluster(cluster_config_from_dict(data, str(path)), wl)


def test_smoke_runs_the_generator_workload_and_sums_the_tiers():
    res = _run("cpu_tier", smoke=True)
    s = res.summary
    assert s["num_requests"] == 16 and s["num_finished"] == 16
    tiers = [r["kv_offload"] for r in s["replicas"]]
    assert s["kv_offload"]["num_stores"] == sum(t["num_stores"] for t in tiers) > 0
    assert s["kv_offload"]["cpu_query_tokens"] == sum(t["cpu_query_tokens"] for t in tiers)
    assert "kv_offload" not in _run("gpu_only", smoke=True).summary


def test_cluster_cli_smoke(tmp_path):
    out = tmp_path / "run"
    r = CliRunner().invoke(app, ["cluster", str(DIR / "multiturn_prefix_aware_cpu_tier.yaml"), "--smoke",
                                 "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "CPU KV tier:" in r.output and "16 requests" in r.output
    assert json.loads((out / "summary.json").read_text())["kv_offload"]["num_stores"] > 0


def test_a_bad_generator_key_names_the_field():
    with pytest.raises(InputError, match="num_requestz"):
        load_cluster_workload({"generator": "sessions", "num_requestz": 3})


@pytest.mark.slow
def test_pricing_cpu_hits_beats_gpu_only_scoring_on_the_full_scenario():
    priced, blind = _run("cpu_tier", smoke=False).summary, _run("cpu_tier_blind", smoke=False).summary
    assert priced["kv_offload"]["cpu_hit_tokens"] > 2 * blind["kv_offload"]["cpu_hit_tokens"]
    assert priced["ttft_s"]["mean"] < blind["ttft_s"]["mean"]


def test_sglang_host_tiers_draw_requests_and_sum_in_the_summary():
    path = DIR / "multiturn_prefix_aware_cpu_tier.yaml"
    data, wl_spec = load_cluster_yaml(path)
    wl = load_cluster_workload({**wl_spec, "num_requests": 200}, None, base_dir=path.parent)
    base = {k: v for k, v in data["base"].items() if k != "kv_offload"}
    base.update(engine="sglang", sglang={"hicache": {"enable_hierarchical_cache": True, "hicache_ratio": 4.0}})
    runs = {}
    for weight in (0.0, None):
        cfg = cluster_config_from_dict({**data, "base": base, "router": {"name": "prefix_aware",
                                                                        "params": {"cpu_hit_weight": weight}}})
        runs[weight] = run_cluster(cfg, wl)
    blind, priced = runs[0.0], runs[None]
    s = priced.summary
    assert s["hicache"]["host_hit_tokens"] == sum(r["hicache"]["host_hit_tokens"] for r in s["replicas"])
    assert "cpu_prefix" in set(priced.requests.route_reason) and "cpu_prefix" not in set(blind.requests.route_reason)
    assert s["hicache"]["host_hit_tokens"] > blind.summary["hicache"]["host_hit_tokens"]
