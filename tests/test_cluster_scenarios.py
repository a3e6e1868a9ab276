"""The shipped cluster scenarios load, and the prefix-aware router beats round robin on them."""

from __future__ import annotations

from pathlib import Path

import pytest

from servesim.commands.cluster import load_cluster_yaml
from servesim.simulator.cluster import cluster_config_from_dict, run_cluster
from servesim.traces.bundled import load_bundled
from servesim.traces.transforms import request_limit

ROOT = Path(__file__).resolve().parents[1]
FILES = sorted((ROOT / "scenarios" / "cluster").glob("*.yaml"))


def _load(path):
    data, _workload = load_cluster_yaml(path)  # the `workload:` section is read by `servesim cluster`
    return cluster_config_from_dict(data, str(path))


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_cluster_scenarios_load_as_written(path):
    data, _workload = load_cluster_yaml(path)
    cfg = _load(path)
    assert [(g.count, g.role) for g in cfg.replicas] == \
        [(g["count"], g.get("role", "both")) for g in data["replicas"]]
    router = data["router"]
    assert cfg.router.name == (router if isinstance(router, str) else router["name"])
    assert {g.sim.hardware.model for g in cfg.replicas} == {data["base"]["hardware"]["model"]}


@pytest.mark.slow
def test_prefix_aware_beats_round_robin_on_mooncake_scenarios():
    wl = request_limit(load_bundled("mooncake-conversation-5min"), 200)
    d = ROOT / "scenarios" / "cluster"
    pa = run_cluster(_load(d / "mooncake_router_prefix_aware.yaml"), wl).summary
    rr = run_cluster(_load(d / "mooncake_router_round_robin.yaml"), wl).summary
    assert pa["prefix_cache_hit_rate"] > rr["prefix_cache_hit_rate"]
