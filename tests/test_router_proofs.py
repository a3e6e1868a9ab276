"""Router proofs (simulator/fastpath/router_proofs.py): registered by router name, built from the
router instance, and exact about the coming decisions. Whole-cluster equality with plain stepping is
in tests/test_cluster_macro_steps.py and tests/test_deferred_runs.py."""

from __future__ import annotations

import numpy as np
import pytest

from servesim.scheduler.registry import UnknownNameError
from servesim.simulator.cluster import Cluster, ClusterConfig, ReplicaGroup, RouterConfig, sim_config_from_dict
from servesim.simulator.cluster.routers import ROUTERS, PowerOfTwo, SessionAffinity, make_router, session_target
from servesim.simulator.fastpath.router_proofs import (
    ROUTER_PROOFS, PowerOfTwoProof, RouterProof, SessionAffinityProof, proof_for,
)
from servesim.traces.workload import RequestSpec
from test_cluster_macro_steps import _workload


class Stub:
    """A candidate whose engine reports a fixed load."""

    def __init__(self, load: int) -> None:
        self.engine = type("E", (), {"num_outstanding": load})()


def test_every_proof_names_a_registered_router():
    assert ROUTER_PROOFS.names() == ["jsq_power_of_two", "least_kv", "least_outstanding", "prefix_aware", "round_robin",
                                     "session_affinity"]
    for name in ROUTER_PROOFS.names():
        assert name in ROUTERS
        proof = proof_for(make_router(name, {}, np.random.default_rng(0)))
        assert proof is not None
        for member in ("reads_all_candidates", "reads_only_load", "reads_planned_state", "reads_prefix_cache", "arrivals_elsewhere",
                       "arrivals_unread"):
            assert hasattr(proof, member), (name, member)  # RouterProof's members


def test_an_unknown_name_gets_the_registrys_did_you_mean():
    with pytest.raises(UnknownNameError, match="did you mean 'least_outstanding'"):
        ROUTER_PROOFS.get("least_outstandin")


def test_routers_without_a_proof_get_none():
    for name in ("vllm_dp",):
        assert name in ROUTERS and name not in ROUTER_PROOFS
        assert proof_for(make_router(name, {}, np.random.default_rng(0))) is None


def test_a_proof_follows_the_name_a_router_was_built_under(monkeypatch):
    """A subclass registered under another name (even through a plain factory, which leaves it the
    parent's class name) gets no proof: its choose() may differ from the parent's."""
    from servesim.simulator.cluster.routers import LeastOutstanding

    ROUTERS.names()  # the built-ins loaded, then a copy to add to (as tests/test_docs_examples.py keeps one)
    monkeypatch.setattr(ROUTERS, "_entries", dict(ROUTERS._entries))

    class Fussy(LeastOutstanding):
        pass

    ROUTERS.add("fussy_least_outstanding", lambda rng: Fussy(rng))
    router = make_router("fussy_least_outstanding")
    assert router.name == "fussy_least_outstanding" and proof_for(router) is None
    assert proof_for(make_router("least_outstanding")) is not None


def test_a_cluster_asks_for_proofs_only_where_replicas_run_macro_steps():
    wl = _workload(20, 10.0, seed=1)

    def proof(macro: bool) -> RouterProof | None:
        sim = sim_config_from_dict({"macro_steps": macro})
        cfg = ClusterConfig(replicas=[ReplicaGroup(3, sim)], router=RouterConfig("least_outstanding"))
        return Cluster(cfg, wl).arrival_bounds.proof

    assert proof(False) is None
    assert proof(True) is not None and proof(True).reads_only_load


def test_session_affinity_proofs():
    """Turns pinned elsewhere are unread; a request without a session ends the unread window, and
    counts as elsewhere only while least_outstanding's proof says the others must receive requests first."""
    sid = {t: next(f"s{i}" for i in range(1000) if session_target(f"s{i}", 3) == t) for t in range(3)}
    seq = [RequestSpec(f"r{i}", float(i), 10, 5, session_id=s)
           for i, s in enumerate([sid[1], sid[2], None, sid[1], sid[0], sid[2]])]

    proof = SessionAffinityProof(SessionAffinity(np.random.default_rng(0)))
    cands = [Stub(3), Stub(3), Stub(3)]
    assert proof.arrivals_unread(0, cands, seq, 0) == 2  # r2 (no session) may read replica 0
    assert proof.arrivals_unread(1, cands, seq, 0) == 0  # r0 is pinned to replica 1
    # Replica 0 at load 3, the others at 3: least_outstanding could pick it for r2 -> 2 elsewhere.
    assert proof.arrivals_elsewhere(0, 3, cands, seq, 0) == 2
    # At load >= 5 the others must take 4 requests first, r2 comes after 2: elsewhere; r4 is pinned here.
    assert proof.arrivals_elsewhere(0, 5, cands, seq, 0) == 4
    assert proof.arrivals_elsewhere(2, 9, cands, seq, 2) == 3  # r5 pinned to 2; r2 needs 14 first


def test_jsq_proof_foresees_the_pairs_the_router_draws():
    """jsq_power_of_two's proof draws the coming pairs from a copy of the router's shared
    Generator; choose() draws the same ones, and the proof refuses to go on if someone else drew
    from the shared Generator in between."""
    cands = [Stub(i) for i in range(8)]
    seq = list(_workload(50, 10.0, seed=1).requests)
    rng = np.random.default_rng(7)
    router = PowerOfTwo(rng)
    proof = PowerOfTwoProof(router)
    k = proof.arrivals_unread(3, cands, seq, 0)
    reference = PowerOfTwo(np.random.default_rng(7))
    picks = [reference.choose(seq[i], cands, 0.0) for i in range(k + 1)]
    assert all(3 not in (int(p.reason[4]), int(p.reason[6])) for p in picks[:k])
    assert k == len(seq) or 3 in (int(picks[k].reason[4]), int(picks[k].reason[6]))
    assert [router.choose(seq[i], cands, 0.0) for i in range(k + 1)] == picks
    proof.arrivals_unread(3, cands, seq, k + 1)  # the decisions made drew what it foresaw
    router.choose(seq[k + 1], cands, 0.0)
    rng.random()  # another reader of the shared Generator
    with pytest.raises(AssertionError, match="shared Generator was drawn from"):
        proof.arrivals_unread(5, cands, seq, k + 2)
