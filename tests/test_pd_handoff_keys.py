"""A P/D hand-off's decode-side Request takes the prefill side's key plan and prompt-block keys
(simulator/cluster/pd_keys.py key_donor, Request.take_prompt_keys) instead of building them: the very
keys the decode side would build itself (checked at every hand-off), whole outputs unchanged, and
no donor where the two sides would key differently."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from servesim import _native
from servesim.scheduler.request import Request
from servesim.simulator.cluster import Cluster, ClusterConfig, PDConfig, ReplicaGroup, RouterConfig, sim_config_from_dict
from servesim.simulator.cluster import pd_keys
from servesim.simulator.request_factory import RequestFactory
from servesim.traces.synthetic import make_workload


def _workload(n: int, seed: int, prefix: bool):
    spec = {
        "num_requests": n, "arrival": {"rate_per_s": 15.0},
        "prompt_len": {"dist": "lognormal", "median": 300, "sigma": 0.6, "max_value": 2000},
        "output_len": {"dist": "lognormal", "median": 40, "sigma": 0.6, "max_value": 200},
    }
    if prefix:  # shared system prompts: a provenance of two runs, and decode-side prefix-cache hits
        spec["prefix"] = {"num_groups": 3, "prefix_len": {"dist": "fixed", "value": 200}, "fraction": 0.7}
    return make_workload("poisson", spec, np.random.default_rng(seed))


def _config(macro: bool = True, prefill_sim: dict | None = None, decode_sim: dict | None = None,
            router: str = "least_kv") -> ClusterConfig:
    def sim(extra):
        return sim_config_from_dict({"macro_steps": macro, **(extra or {})})
    return ClusterConfig(replicas=[ReplicaGroup(2, sim(prefill_sim), role="prefill"),
                                   ReplicaGroup(2, sim(decode_sim), role="decode")],
                         pd=PDConfig(decode_router=RouterConfig(router)), routing_latency_s=0.001)


def _summary(res) -> str:
    from tests.test_pd_macro_steps import _drop_run_only  # how the run went, not what it simulated

    return json.dumps(_drop_run_only(res.summary), sort_keys=True, default=str)


class _Spy:
    """Counts the donors key_donor offers (cluster/pd_keys.py: interpreted in both builds) and, where the
    request factory is interpreted too (a compiled class's method cannot be patched), checks each
    decode-side Request's keys against a fresh build."""

    def __init__(self, monkeypatch) -> None:
        self.num_donors = 0
        self.num_taken = 0
        self.num_checked = 0
        self.factory_patched = _native.scheduler_mode() != _native.COMPILED
        make = RequestFactory.make
        donor_of = pd_keys.key_donor
        spy = self

        def counted_donor(prefill, decode, rid):
            donor = donor_of(prefill, decode, rid)
            spy.num_donors += donor is not None
            return donor

        monkeypatch.setattr(pd_keys, "key_donor", counted_donor)

        def checked_make(factory, spec, now, structured_output=False, resumable=False):
            donated = spec.request_id in factory.key_donors
            req = make(factory, spec, now, structured_output, resumable)
            if donated:
                spy.num_taken += 1
                spy.check(factory, spec, now, req)
            return req

        monkeypatch.setattr(RequestFactory, "make", checked_make)
        self.schedulers: dict[int, object] = {}

    def check(self, factory: RequestFactory, spec, now: float, req: Request) -> None:
        sched = self.schedulers[id(factory)]
        fresh = RequestFactory(factory.executor, factory.keys_from_provenance).make(spec, now)
        fresh.attach_block_hasher(sched.block_hasher, sched.block_size)
        keys = list(req.block_hashes)
        req.attach_block_hasher(sched.block_hasher, sched.block_size)  # what add_request does next
        assert req.block_hashes == fresh.block_hashes == keys
        assert len(keys) == spec.prompt_len // sched.block_size
        assert req.key_root == fresh.key_root is not None
        assert req._key_plan.ends == fresh._key_plan.ends and req._key_plan.bases == fresh._key_plan.bases
        self.num_checked += 1


def _run(cfg: ClusterConfig, wl, spy: _Spy | None = None):
    c = Cluster(cfg, wl)
    if spy is not None:
        spy.schedulers = {id(r.engine.requests_in): r.engine.scheduler for r in c.replicas}
    return c, c.run()


_TIGHT = {"cache.num_gpu_blocks": 500, "scheduler.max_model_len": 2400}
KEY_CASES = {  # (shared system prompts, decode router, both sides' settings)
    "one-run": (False, "least_kv", {}),
    "prefixed": (True, "least_kv", {}),
    # the decode router reads the prefix cache the taken keys fill; requests wait and preempt
    "prefixed-prefix-aware-tight": (True, "prefix_aware", _TIGHT),
    "prefixed-least-outstanding-sync": (True, "least_outstanding", {"scheduler.async_scheduling": False}),
}


@pytest.mark.parametrize("case", list(KEY_CASES))
def test_taken_keys_are_the_ones_the_decode_side_builds(monkeypatch, case):
    """At every hand-off the decode side's Request, as add_request keys it, holds exactly the keys
    and plan a fresh build gives; whole outputs equal those with no donor at all (each side builds
    its own), and equal plain stepping's."""
    prefix, router, sim = KEY_CASES[case]
    wl = _workload(80, seed=5, prefix=prefix)
    spy = _Spy(monkeypatch)
    cluster, res = _run(_config(prefill_sim=sim, decode_sim=sim, router=router), wl, spy)
    assert spy.num_donors == len(wl.requests)  # every hand-off offered its keys
    if spy.factory_patched:
        assert spy.num_taken == spy.num_checked == len(wl.requests)  # and the decode side took them
    if prefix:
        assert res.summary["prefix_cache_hit_tokens"] > 0
    monkeypatch.setattr(pd_keys, "key_donor", lambda prefill, decode, rid: None)
    _, built = _run(_config(prefill_sim=sim, decode_sim=sim, router=router), wl)
    _, plain = _run(_config(macro=False, prefill_sim=sim, decode_sim=sim, router=router), wl)
    for other in (built, plain):
        pd.testing.assert_frame_equal(res.requests, other.requests)
        pd.testing.assert_frame_equal(res.steps, other.steps)
        assert _summary(res) == _summary(other)


@pytest.mark.parametrize("prefill_sim, decode_sim, why", [
    ({"cache.block_size": 32}, {}, "block sizes differ"),
    ({"prefix_cache_keys": "token_ids"}, {}, "the prefill side hashes ids"),
    ({}, {"prefix_cache_keys": "token_ids"}, "the decode side hashes ids"),
    ({}, {"cache.enable_prefix_caching": False}, "the decode side keys nothing"),
], ids=["block-size", "prefill-hashes", "decode-hashes", "decode-no-cache"])
def test_no_donor_where_the_sides_key_differently(monkeypatch, prefill_sim, decode_sim, why):
    wl = _workload(30, seed=2, prefix=True)
    spy = _Spy(monkeypatch)
    _run(_config(prefill_sim=prefill_sim, decode_sim=decode_sim), wl, spy)
    assert spy.num_donors == spy.num_taken == 0, why
