"""The prompt a prefix-aware router asks every replica about: a LazyTokenIds, its ids built only if
a lookup reads them (scheduler/prefix_lookup.py). A provenance-keyed lookup reads its length
alone; a lookup of hashed ids builds them once, and both answer as with the prompt's ids at hand."""

from __future__ import annotations

from array import array

import numpy as np
import pandas as pd

from servesim.scheduler.lazy_ids import LazyTokenIds
from servesim.simulator.cluster import ClusterConfig, ReplicaGroup, RouterConfig, run_cluster, sim_config_from_dict
from servesim.traces.synthetic import make_workload
from servesim.traces.workload import RequestSpec


def test_lazy_ids_index_and_slice_as_the_built_ids_and_build_once():
    calls = []

    def build():
        calls.append(1)
        return [5, 6, 7, 8]

    ids = LazyTokenIds(4, build)
    assert len(ids) == 4 and not calls  # the length needs no ids
    assert ids[1] == 6 and ids[1:3] == array("i", [6, 7]) and ids[-1] == 8 and list(ids) == [5, 6, 7, 8]
    assert len(calls) == 1


def _workload():
    """Four shared prefixes of 200 tokens on 80 % of the requests: reads hit and miss."""
    return make_workload("poisson", {
        "num_requests": 120, "arrival": {"rate_per_s": 80.0},
        "prompt_len": {"dist": "lognormal", "median": 300, "sigma": 0.5, "max_value": 2000},
        "output_len": {"dist": "lognormal", "median": 40, "sigma": 0.6, "max_value": 200},
        "prefix": {"num_groups": 4, "prefix_len": {"dist": "fixed", "value": 200}, "fraction": 0.8}},
        np.random.default_rng(3))


def _run(keys: str):
    cfg = sim_config_from_dict({"prefix_cache_keys": keys})
    return run_cluster(ClusterConfig(replicas=[ReplicaGroup(4, cfg)], router=RouterConfig("prefix_aware"),
                                     routing_latency_s=0.001), _workload())


def test_provenance_keyed_reads_never_build_a_prompt(monkeypatch):
    """With provenance keys (the default) nothing of a prefix-aware cluster reads a prompt's ids:
    a builder that raises is never called, and the run is the one with ids at hand."""
    with_ids = _run("provenance")

    def refuse(self):
        raise AssertionError(f"{self.request_id}: a prompt's ids were built")

    monkeypatch.setattr(RequestSpec, "token_ids", refuse)
    monkeypatch.setattr(RequestSpec, "token_id_array", refuse)
    unbuilt = _run("provenance")
    pd.testing.assert_frame_equal(with_ids.requests, unbuilt.requests)
    assert with_ids.summary["prefix_cache_hit_rate"] == unbuilt.summary["prefix_cache_hit_rate"] > 0


def test_hashed_ids_are_built_for_the_reads_and_hit_alike():
    """Keyed by their ids' hashes (prefix_cache_keys: token_ids), the reads build each prompt and
    route every request where the provenance keys do."""
    by_ids, by_provenance = _run("token_ids"), _run("provenance")
    pd.testing.assert_series_equal(by_ids.requests["replica"], by_provenance.requests["replica"])
