"""The gateway in front of a P/D cluster, closed-loop session turns in a P/D cluster (and behind any
gateway), and turns timed by the frontend's serial event loop: exact timelines on hand-built
workloads, what is still refused, and macro-steps on vs off (whole outputs equal).

Cost model: test-linear (5 ms + 1 ms a token a step; tests/test_sim_engine.py), no CPU overhead."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from servesim.simulator.build import build_engine
from servesim.simulator.cluster import ClusterConfig, ReplicaGroup, RouterConfig, run_cluster
from servesim.simulator.cluster.cluster import Cluster
from servesim.simulator.cluster.config import PDConfig
from servesim.simulator.frontend import FrontendConfig
from servesim.simulator.gateway.config import GatewayConfig
from servesim.simulator.gateway.gateway import QUEUE_TIMEOUT
from servesim.simulator.gateway.rules import QUEUE_FULL
from servesim.simulator.gateway.wiring import GATEWAY_DECLINED
from servesim.simulator.sessions import TURNS_DECLINED
from servesim.traces.errors import InputError
from servesim.traces.synthetic import make_workload
from servesim.traces.workload import RequestSpec, Workload
from test_sessions import cfg, session_workload, turn

LATENCY_S = 0.001  # routing latency of every cluster here


def pd_cluster(sim=None, decode_sim=None, gateway: GatewayConfig | None = None, **kw) -> ClusterConfig:
    sim = sim if sim is not None else cfg()
    return ClusterConfig(replicas=[ReplicaGroup(count=1, role="prefill", sim=sim),
                                   ReplicaGroup(count=1, role="decode", sim=decode_sim if decode_sim is not None else sim)],
                         pd=PDConfig(), routing_latency_s=LATENCY_S,
                         gateway=gateway if gateway is not None else GatewayConfig(), **kw)


def colocated(sim=None, gateway: GatewayConfig | None = None, count: int = 1) -> ClusterConfig:
    return ClusterConfig(replicas=[ReplicaGroup(count=count, sim=sim if sim is not None else cfg())],
                         router=RouterConfig("round_robin", {}), routing_latency_s=LATENCY_S,
                         gateway=gateway if gateway is not None else GatewayConfig())


def gw(**kw) -> GatewayConfig:
    return GatewayConfig(enabled=True, **kw)


# --- (a) the gateway in front of P/D -----------------------------------------------------------------
def test_pd_gateway_slot_frees_at_the_decode_finish_not_the_prefill_finish():
    specs = [RequestSpec("r0", 0.0, 40, 4), RequestSpec("r1", 0.0, 40, 4)]
    res = run_cluster(pd_cluster(gateway=gw(max_in_flight=1)), Workload(specs, "t", "hand"))
    df = res.requests.set_index("request_id")
    # r0 reaches the gateway after the routing latency and is dispatched at once; its prompt is done
    # on the prefill replica 5 + 40 ms later, but r1 waits for r0's last token on the decode side.
    assert df.loc["r0", "route_time_s"] == LATENCY_S
    prefill_done_s = df.loc["r0", "route_time_s"] + df.loc["r0", "prefill_s"]
    assert prefill_done_s == pytest.approx(LATENCY_S + 0.045)
    assert df.loc["r1", "route_time_s"] == df.loc["r0", "finish_s"] > prefill_done_s
    g = res.summary["gateway"]
    assert g["num_dispatched"] == 2 and g["max_queued"] == 1
    assert g["queue_wait_s"]["count"] == 2
    assert g["queue_wait_s"]["mean"] == pytest.approx((df.loc["r0", "finish_s"] - LATENCY_S) / 2, abs=1e-12)
    assert list(df["status"]) == ["completed", "completed"]
    assert df.loc["r1", "prefill_queue_s"] >= df.loc["r0", "finish_s"]  # the gateway's wait is in the TTFT


def test_pd_gateway_burst_sheds_exactly_and_counts_like_bench_serve():
    gateway = gw(max_in_flight=2, rules=[{"name": "queue_limit", "params": {"max_queued": 1}}])
    specs = [RequestSpec(f"r{i}", 0.0, 40, 4, tenant="a" if i % 2 else "b") for i in range(6)]
    res = run_cluster(pd_cluster(gateway=gateway), Workload(specs, "burst", "hand"))
    df = res.requests.set_index("request_id")
    rejected = sorted(df.index[df["status"] == "rejected"])
    assert rejected == ["r3", "r4", "r5"] and set(df.loc[rejected, "reject_reason"]) == {QUEUE_FULL}
    assert df.loc[rejected, ["prefill_replica", "decode_replica"]].isna().all().all()
    assert df.loc[rejected, "route_time_s"].isna().all() and (df.loc[rejected, "kv_bytes"] == 0).all()
    assert (df.loc[["r0", "r1", "r2"], "prefill_replica"] == 0).all()
    assert (df.loc[["r0", "r1", "r2"], "decode_replica"] == 1).all()
    assert res.summary["bench_serve"]["failed"] == 3 == res.summary["gateway"]["num_rejected"]
    assert res.summary["bench_serve"]["completed"] == 3
    by_tenant = res.summary["classes"]["by_tenant"]
    assert {t: (v["num_completed"], v["num_rejected"]) for t, v in by_tenant.items()} == {"a": (1, 2), "b": (2, 1)}
    assert by_tenant["a"]["bench_serve"]["failed"] == 2
    assert res.summary["pd"]["ttft_breakdown_s"]["prefill_s"]["count"] == 3
    declined = {r["role"]: r["fast_path_declined"] for r in res.summary["replicas"]}
    assert declined["prefill"] == GATEWAY_DECLINED and "gateway" in declined["decode"]


def test_pd_gateway_queue_timeout_and_client_give_up():
    long_s = RequestSpec("r0", 0.0, 40, 300)  # 45 ms + 300 decode steps: past both deadlines
    specs = [long_s, RequestSpec("r1", 0.0, 40, 4), RequestSpec("r2", 0.0, 40, 4, timeout_s=0.125)]
    res = run_cluster(pd_cluster(gateway=gw(max_in_flight=1, queue_timeout_s=0.25)), Workload(specs, "t", "hand"))
    df = res.requests.set_index("request_id")
    assert df.loc["r0", "status"] == "completed"
    assert df.loc["r1", "status"] == "rejected" and df.loc["r1", "reject_reason"] == QUEUE_TIMEOUT
    assert df.loc["r2", "status"] == "timed_out" and pd.isna(df.loc["r2", "prefill_replica"])
    g = res.summary["gateway"]
    assert g["rejected_by_reason"] == {QUEUE_TIMEOUT: 1} and g["num_gone_while_queued"] == 1
    assert res.summary["bench_serve"]["failed"] == 2


def test_pd_gateway_priority_reaches_both_sides():
    seen: dict[str, list[tuple[str, int]]] = {"prefill": [], "decode": []}
    gateway = gw(slo_classes={"gold": {"ttft_s": 1.0, "tpot_s": 1.0, "priority": -3}})
    c = Cluster(pd_cluster(gateway=gateway), Workload([RequestSpec("r0", 0.0, 40, 4, slo_class="gold")], "t", "hand"))
    # Each side's Request as its scheduler queues it (the policy is interpreted in both builds;
    # the P/D engines and schedulers are compiled classes, whose methods cannot be patched).
    for r in c.replicas:
        policy = r.engine.scheduler.policy
        on_arrival = policy.on_arrival

        def spy(request, now_s, _on_arrival=on_arrival, _role=r.role):
            seen[_role].append((request.request_id, request.priority))
            _on_arrival(request, now_s)
        policy.on_arrival = spy
    c.run()
    assert seen == {"prefill": [("r0", -3)], "decode": [("r0", -3)]}


# --- (b) closed-loop session turns in P/D, and behind a gateway ----------------------------------------
def test_pd_turns_follow_the_decode_side_answer():
    res = run_cluster(pd_cluster(), session_workload())
    df = res.requests.set_index("request_id")
    assert df.loc["s-1", "arrival_s"] == df.loc["s-0", "finish_s"] + 0.5
    assert df.loc["s-2", "arrival_s"] == df.loc["s-1", "finish_s"] + 0.25
    assert df.loc["s-1", "route_time_s"] == df.loc["s-1", "arrival_s"] + LATENCY_S
    # the decode side's answer, well after the prompt was done on the prefill side
    assert df.loc["s-0", "finish_s"] > df.loc["s-0", "route_time_s"] + df.loc["s-0", "prefill_s"]
    assert res.summary["sessions"]["num_complete"] == 1 and df["status"].eq("completed").all()
    declined = {r["role"]: r["fast_path_declined"] for r in res.summary["replicas"]}
    assert declined["prefill"] == TURNS_DECLINED and "session turns" in declined["decode"]


@pytest.mark.parametrize("side", ["prefill", "decode"])
def test_pd_parent_without_an_answer_abandons_its_session(side):
    """The prompt too long for the prefill side (rejected there, no decode), or prompt + answer too
    long for the decode side (rejected after the prefill): either way no answer, no later turn."""
    small = dataclasses.replace(cfg(), scheduler=dataclasses.replace(cfg().scheduler, max_model_len=48))
    wl = Workload.from_unsorted([turn("s", 0, 0.0, 40, 10), turn("s", 1, 0.1, 60, 2, think_s=0.1),
                                 turn("s", 2, 0.2, 70, 2, think_s=0.1, last=True), RequestSpec("x", 0.0, 8, 2)],
                                "t", "hand")
    c = pd_cluster(sim=small if side == "prefill" else cfg(), decode_sim=small)
    if side == "prefill":  # 40 + 10 > 48: the prefill side's admission rejects it as the decode side would
        wl = Workload.from_unsorted([dataclasses.replace(s, prompt_len=s.prompt_len + 10) if s.session_id else s
                                     for s in wl.requests], "t", "hand")
    res = run_cluster(c, wl)
    df = res.requests.set_index("request_id")
    assert sorted(df.index) == ["s-0", "x"] and df.loc["s-0", "status"] == "rejected"
    assert df.loc["x", "status"] == "completed"
    assert pd.isna(df.loc["s-0", "decode_replica"]) == (side == "prefill")
    assert res.summary["sessions"]["num_turns_abandoned"] == 2


@pytest.mark.parametrize("pd_mode", [False, True])
def test_a_turn_waits_in_the_gateway_for_the_slot_it_needs(pd_mode):
    """max_in_flight 1: L (sent at 0.125, 200 tokens out) holds the slot when s-1 is sent; s-1 is
    sent think time after its parent's answer and dispatched the instant L is done."""
    wl = Workload.from_unsorted([turn("s", 0, 0.0, 40, 4), turn("s", 1, 0.5, 52, 3, think_s=0.5, last=True),
                                 RequestSpec("L", 0.125, 16, 200)], "t", "hand")
    c = pd_cluster(gateway=gw(max_in_flight=1)) if pd_mode else colocated(gateway=gw(max_in_flight=1))
    res = run_cluster(c, wl)
    df = res.requests.set_index("request_id")
    assert df.loc["s-1", "arrival_s"] == df.loc["s-0", "finish_s"] + 0.5
    assert df.loc["L", "finish_s"] > df.loc["s-1", "arrival_s"] + LATENCY_S  # L still runs when s-1 comes
    assert df.loc["s-1", "route_time_s"] == df.loc["L", "finish_s"]
    g = res.summary["gateway"]
    assert g["num_offered"] == 3 and g["num_dispatched"] == 3 and g["max_queued"] == 1
    assert res.summary["sessions"]["num_complete"] == 1


@pytest.mark.parametrize("pd_mode", [False, True])
def test_a_turn_the_gateway_times_out_abandons_the_rest_of_its_session(pd_mode):
    wl = Workload.from_unsorted([turn("s", 0, 0.0, 40, 4), turn("s", 1, 0.5, 52, 3, think_s=0.5),
                                 turn("s", 2, 0.8, 63, 3, think_s=0.25, last=True),
                                 RequestSpec("L", 0.125, 16, 400)], "t", "hand")
    gateway = gw(max_in_flight=1, queue_timeout_s=0.25)
    res = run_cluster(pd_cluster(gateway=gateway) if pd_mode else colocated(gateway=gateway), wl)
    df = res.requests.set_index("request_id")
    assert sorted(df.index) == ["L", "s-0", "s-1"]
    assert df.loc["s-1", "status"] == "rejected" and df.loc["s-1", "reject_reason"] == QUEUE_TIMEOUT
    assert res.summary["sessions"]["num_turns_abandoned"] == 1
    assert res.summary["gateway"]["num_offered"] == 3 and res.summary["bench_serve"]["failed"] == 1


def test_replay_turns_go_through_its_gateway():
    wl = Workload.from_unsorted([turn("s", 0, 0.0, 40, 4), turn("s", 1, 0.5, 52, 3, think_s=0.5, last=True),
                                 RequestSpec("L", 0.125, 16, 200)], "t", "hand")
    engine = build_engine(dataclasses.replace(cfg(), gateway=gw(max_in_flight=1)), wl)
    r = engine.run().metrics.requests
    assert r["s-1"].arrival_s == r["s-0"].finish_s + 0.5
    assert r["s-1"].first_scheduled_s == r["L"].finish_s  # dispatched the instant L is done
    assert engine.gateway.num_offered == 3 and engine.gateway.queue_wait_s["s-1"] > 0


# --- (c) turns timed by the frontend's serial event loop ------------------------------------------------
SERIAL = FrontendConfig(enabled=True, serial=True, http_s=0.01)


def test_serial_loop_delivers_the_answer_a_turn_waits_for():
    """s-0: intake 10 ms (loop) + 0.24 ms (tokenizer) + 0.5 ms hop, then 45 ms prefill and three 6 ms
    decode steps: the engine finishes at 0.07374. Its output job reaches the loop at 0.07424, which
    y's intake (0.07 .. 0.08) holds: the client has the answer at 0.08 + 0.15 ms, and s-1 is sent
    0.5 s after that."""
    wl = Workload.from_unsorted([turn("s", 0, 0.0, 40, 4), turn("s", 1, 0.5, 52, 3, think_s=0.5, last=True),
                                 RequestSpec("y", 0.07, 8, 2)], "t", "hand")
    engine = build_engine(cfg(frontend=SERIAL), wl)
    r = engine.run().metrics.requests
    assert r["s-0"].finish_s == pytest.approx(0.08015, abs=1e-12)
    assert r["s-1"].arrival_s == r["s-0"].finish_s + 0.5
    assert engine.planner_declined == TURNS_DECLINED
    alone = build_engine(cfg(frontend=SERIAL), Workload.from_unsorted(
        [s for s in wl.requests if s.request_id != "y"], "t", "hand")).run().metrics.requests
    assert alone["s-0"].finish_s == pytest.approx(0.07374 + 0.0005 + 0.00015, abs=1e-12)  # an idle loop
    assert alone["s-1"].arrival_s == alone["s-0"].finish_s + 0.5


def test_serial_loop_with_a_client_concurrency_cap():
    from servesim.simulator.config import ClientConfig

    engine = build_engine(cfg(frontend=SERIAL, client=ClientConfig(max_concurrency=1)), session_workload())
    r = engine.run().metrics.requests
    assert r["s-1"].arrival_s == r["s-0"].finish_s + 0.5 and r["s-2"].arrival_s == r["s-1"].finish_s + 0.25
    assert all(rec.finish_s is not None for rec in r.values())


def test_serial_loop_on_cluster_replicas_times_the_turns():
    """Colocated: the replica's loop carries the answer (routed at 1 ms, engine finish 1 + 63 ms,
    then the hop and one request's output service); P/D: the decode replica's loop."""
    res = run_cluster(colocated(sim=cfg(frontend=SERIAL), count=2), session_workload())
    df = res.requests.set_index("request_id")
    assert df.loc["s-0", "finish_s"] == pytest.approx(0.064 + 0.0005 + 0.00015, abs=1e-12)
    assert df.loc["s-1", "arrival_s"] == df.loc["s-0", "finish_s"] + 0.5
    assert df.loc["s-2", "arrival_s"] == df.loc["s-1", "finish_s"] + 0.25
    plain = run_cluster(pd_cluster(), session_workload()).requests.set_index("request_id")
    res = run_cluster(pd_cluster(decode_sim=cfg(frontend=SERIAL)), session_workload())
    df = res.requests.set_index("request_id")
    assert df.loc["s-0", "finish_s"] == pytest.approx(plain.loc["s-0", "finish_s"] + 0.0005 + 0.00015, abs=1e-12)
    assert df.loc["s-1", "arrival_s"] == df.loc["s-0", "finish_s"] + 0.5
    assert df.loc["s-2", "arrival_s"] == df.loc["s-1", "finish_s"] + 0.25


# --- what is still refused ----------------------------------------------------------------------------
def test_a_pd_replica_has_no_gateway_of_its_own():
    with pytest.raises(InputError, match="no gateway of its own") as err:
        ClusterConfig.from_dict({"replicas": [{"role": "prefill"}, {"role": "decode", "sim": {"gateway": {"enabled": True}}}],
                                 "pd": {}, "gateway": {"enabled": True}})
    assert err.value.field == "replicas[1].sim.gateway.enabled"


def test_pd_turn_whose_parent_comes_later_is_refused():
    a, b = turn("s", 0, 0.0, 8, 1), turn("s", 1, 0.0, 12, 1, think_s=0.0)
    with pytest.raises(InputError, match="later") as err:
        Cluster(pd_cluster(gateway=gw(max_in_flight=1)), Workload([b, a], "t", "hand"))
    assert err.value.field == "parent_request_id"


def test_serial_must_be_a_bool():
    with pytest.raises(InputError) as err:
        build_engine(cfg(frontend=FrontendConfig(enabled=True, serial="yes")), session_workload())
    assert err.value.field == "frontend.serial"


# --- macro-steps on vs off: whole outputs equal -----------------------------------------------------------
def _sessions(n: int = 30, seed: int = 4) -> Workload:
    return make_workload("sessions", {
        "num_requests": n, "arrival": {"rate_per_s": 8.0}, "prompt_len": {"dist": "fixed", "value": 64},
        "output_len": {"dist": "uniform", "low": 4, "high": 40},
        "sessions": {"num_turns": {"dist": "fixed", "value": 3}, "user_tokens": 16, "closed_loop": True,
                     "think_time_s": {"dist": "exponential", "mean": 0.2}}}, np.random.default_rng(seed))


def _burst(n: int = 40) -> Workload:
    rng = np.random.default_rng(2)
    return Workload([RequestSpec(f"r{i}", float(i // 8) * 0.4, int(rng.integers(20, 200)), int(rng.integers(4, 60)),
                                 tenant="a" if i % 3 else "b", timeout_s=0.35 if i % 5 == 4 else None)
                     for i in range(n)], "burst", "hand")


def _summary_text(summary: dict) -> str:
    drop = {"wall_time_s", "sim_speedup_x", "fast_path_declined"}

    def clean(x):
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items() if k not in drop}
        return [clean(v) for v in x] if isinstance(x, list) else x
    return json.dumps(clean(summary), sort_keys=True, default=str)


def _macro(c: ClusterConfig, on: bool) -> ClusterConfig:
    return dataclasses.replace(c, replicas=[dataclasses.replace(g, sim=dataclasses.replace(g.sim, macro_steps=on))
                                            for g in c.replicas])


GATEWAY = gw(max_in_flight=6, queue_timeout_s=0.5, rules=[{"name": "queue_limit", "params": {"max_queued": 8}}],
             queuing={"name": "wfq"}, tenants={"a": {"weight": 2}, "b": {"weight": 1}})
COMBOS = {
    "pd-gateway": (lambda: pd_cluster(gateway=GATEWAY), _burst),
    "pd-turns": (lambda: pd_cluster(), _sessions),
    "pd-gateway-turns": (lambda: pd_cluster(gateway=gw(max_in_flight=4)), _sessions),
    "colocated-gateway-turns": (lambda: colocated(gateway=gw(max_in_flight=4), count=2), _sessions),
    "colocated-serial-turns": (lambda: colocated(sim=cfg(frontend=SERIAL), count=2), _sessions),
    "pd-serial-turns": (lambda: pd_cluster(decode_sim=cfg(frontend=SERIAL)), _sessions),
}


@pytest.mark.parametrize("combo", list(COMBOS))
def test_macro_steps_on_and_off_give_the_same_outputs(combo):
    make_cfg, make_wl = COMBOS[combo]
    wl = make_wl()
    off, on = (run_cluster(_macro(make_cfg(), m), wl) for m in (False, True))
    pd.testing.assert_frame_equal(off.requests, on.requests, check_exact=True)
    pd.testing.assert_frame_equal(off.steps, on.steps, check_exact=True)
    assert _summary_text(off.summary) == _summary_text(on.summary)
    assert all(r["fast_path_declined"] for r in on.summary["replicas"])  # every replica stepped, saying why


def test_replay_serial_turns_macro_steps_on_and_off_give_the_same_outputs():
    wl = _sessions()
    off, on = (build_engine(cfg(frontend=SERIAL, macro_steps=m), wl).run() for m in (False, True))
    pd.testing.assert_frame_equal(off.metrics.requests_frame(), on.metrics.requests_frame(), check_exact=True)
    pd.testing.assert_frame_equal(off.metrics.steps_frame(), on.metrics.steps_frame(), check_exact=True)
    assert on.planner_declined == TURNS_DECLINED


# --- replicas an autoscaler adds mid-run ------------------------------------------------------------------
def test_replicas_added_mid_run_free_gateway_slots_and_release_turns():
    """A replica that becomes ready mid-run is hooked like the first ones: its finishes free the
    gateway's slots (else the queue would never drain) and release the turns; it steps."""
    from test_autoscale_timeline import _scripted

    base = _scripted([(0, 1), (2, 3)])
    c = dataclasses.replace(base, gateway=gw(max_in_flight=2))
    wl = Workload([RequestSpec(f"r{i}", 0.1 + i * 0.2, 200, 200) for i in range(40)], "steady", "test")
    cluster = Cluster(c, wl)
    res = cluster.run()
    df = res.requests
    assert len(cluster.replicas) == 3 and (df["replica"] > 0).sum() > 0  # the added ones served some
    assert df["status"].eq("completed").all() and res.summary["gateway"]["num_dispatched"] == 40
    assert all(r.engine.planner is None for r in cluster.replicas)
    assert {r["fast_path_declined"] for r in res.summary["replicas"]} == {GATEWAY_DECLINED}
