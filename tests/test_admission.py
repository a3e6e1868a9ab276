"""The gateway (simulator/gateway/): admission rules, queuing disciplines, queue timeouts, the cap
on requests in flight, priority mapping; in a replay and a cluster; bad config.

Times are exact: the hand-built inputs use binary-exact numbers (0.25, 0.5, ...)."""

from __future__ import annotations

import pytest
import simpy
from pandas import isna as pd_isna

from servesim.running import run
from servesim.simulator.cluster.cluster import run_cluster
from servesim.simulator.cluster.config import ClusterConfig
from servesim.simulator.config import SimConfig
from servesim.simulator.config_values import build_dataclass
from servesim.simulator.gateway.config import GatewayConfig
from servesim.simulator.gateway.gateway import QUEUE_TIMEOUT, Gateway
from servesim.simulator.gateway.rules import QUEUE_FULL, RATE_LIMITED, TokenBucket
from servesim.simulator.gateway.wiring import GATEWAY_DECLINED
from servesim.traces.errors import InputError
from servesim.traces.workload import RequestSpec, Workload


def _spec(rid: str, t: float = 0.0, tenant: str | None = None, slo_class: str | None = None,
          prompt_len: int = 100, output_len: int = 50) -> RequestSpec:
    return RequestSpec(rid, t, prompt_len, output_len, tenant=tenant, slo_class=slo_class)


class Harness:
    """A Gateway on a bare SimPy clock: dispatches and rejections recorded with their times."""

    def __init__(self, client_timeout_s: float | None = None, **cfg) -> None:
        self.env = simpy.Environment()
        self.dispatched: list[tuple[str, float, int]] = []  # (id, time, priority)
        self.rejected: list[tuple[str, float, str]] = []
        self.gone: list[tuple[str, float]] = []
        self.gw = Gateway(self.env, GatewayConfig(enabled=True, **cfg),
                          lambda spec, sent_s: self.dispatched.append((spec.request_id, self.env.now, spec.priority)),
                          lambda spec, sent_s, why: self.rejected.append((spec.request_id, self.env.now, why)),
                          lambda spec, sent_s: self.gone.append((spec.request_id, self.env.now)), client_timeout_s)

    def at(self, t: float, action) -> None:
        def proc():
            yield self.env.timeout(t)
            action()
        self.env.process(proc())

    def offer_at(self, t: float, *specs: RequestSpec) -> None:
        self.at(t, lambda: [self.gw.offer(s, t) for s in specs])


# --- rules -------------------------------------------------------------------------------------------
def test_queue_limit_sheds_exactly_past_the_cap_and_queue():
    h = Harness(max_in_flight=2, rules=[{"name": "queue_limit", "params": {"max_queued": 3}}])
    h.offer_at(0.0, *[_spec(f"r{i}") for i in range(10)])
    h.env.run()
    assert [d[0] for d in h.dispatched] == ["r0", "r1"]
    assert h.rejected == [(f"r{i}", 0.0, QUEUE_FULL) for i in range(5, 10)]
    assert h.gw.num_queued == 3 and h.gw.max_queued == 3


def test_queue_limit_zero_still_dispatches_while_a_slot_is_free():
    h = Harness(max_in_flight=1, rules=[{"name": "queue_limit", "params": {"max_queued": 0}}])
    h.offer_at(0.0, _spec("a"), _spec("b"))
    h.env.run()
    assert [d[0] for d in h.dispatched] == ["a"] and h.rejected == [("b", 0.0, QUEUE_FULL)]


def test_token_bucket_refill_timing_is_exact():
    rule = TokenBucket({"requests_per_s": 2, "burst_requests": 2}, "gateway.rules[0]")
    s = _spec("x")
    got = [(t, rule.admit(s, t, 0, False)) for t in (0.0, 0.0, 0.0, 0.25, 0.5, 0.5, 1.5, 1.5, 1.5)]
    # full at 2; 0.25 s refills 0.5 (not enough); 0.5 s: 1 (one admitted); by 1.5 s the bucket is full
    # again (2, capped: not 2.0 + 0.0 carried), two admitted, the third refused
    assert got == [(0.0, None), (0.0, None), (0.0, RATE_LIMITED), (0.25, RATE_LIMITED), (0.5, None),
                   (0.5, RATE_LIMITED), (1.5, None), (1.5, None), (1.5, RATE_LIMITED)]


def test_token_bucket_meters_prompt_plus_output_tokens_per_tenant():
    rule = TokenBucket({"tokens_per_s": 100, "burst_tokens": 300}, "gateway.rules[0]")
    a, b = _spec("a", tenant="t1"), _spec("b", tenant="t2")  # 150 tokens each
    assert rule.admit(a, 0.0, 0, False) is None and rule.admit(a, 0.0, 0, False) is None
    assert rule.admit(a, 0.0, 0, False) == RATE_LIMITED  # t1's bucket is empty ...
    assert rule.admit(b, 0.0, 0, False) is None  # ... t2 has its own
    assert rule.admit(a, 1.0, 0, False) == RATE_LIMITED  # 100 refilled < 150
    assert rule.admit(a, 1.5, 0, False) is None  # 150 refilled


def test_token_bucket_for_one_tenant_leaves_the_others_alone():
    rule = TokenBucket({"tenant": "free", "requests_per_s": 1, "burst_requests": 1}, "gateway.rules[0]")
    assert rule.admit(_spec("a", tenant="free"), 0.0, 0, False) is None
    assert rule.admit(_spec("b", tenant="free"), 0.0, 0, False) == RATE_LIMITED
    assert all(rule.admit(_spec(f"p{i}", tenant="premium"), 0.0, 0, False) is None for i in range(5))
    assert rule.admit(_spec("c"), 0.0, 0, False) is None  # no tenant: not "free"


# --- queue, timeouts, slots --------------------------------------------------------------------------
def test_queue_timeout_and_slot_release_times_are_exact():
    h = Harness(max_in_flight=1, queue_timeout_s=1.0)
    h.offer_at(0.0, _spec("a"), _spec("b"), _spec("c"))
    h.at(0.5, lambda: h.gw.done("a"))  # b takes a's slot at 0.5; c waits ...
    h.offer_at(0.75, _spec("d"))
    h.at(1.25, lambda: h.gw.done("b"))  # ... and timed out at 1.0, so d (queued at 0.75) goes at 1.25
    h.env.run()
    assert [(i, t) for i, t, _p in h.dispatched] == [("a", 0.0), ("b", 0.5), ("d", 1.25)]
    assert h.rejected == [("c", 1.0, QUEUE_TIMEOUT)]
    assert h.gw.queue_wait_s == {"a": 0.0, "b": 0.5, "d": 0.5}


def test_a_client_that_gives_up_leaves_the_queue_at_its_deadline():
    h = Harness(client_timeout_s=0.5, max_in_flight=1, queue_timeout_s=2.0)
    h.offer_at(0.0, _spec("a"), _spec("b"))
    h.offer_at(0.25, RequestSpec("c", 0.25, 100, 50, timeout_s=1.0))  # its own timeout wins: gone at 1.25
    h.offer_at(0.25, _spec("d"))  # the clients' 0.5 s: gone at 0.75
    h.at(1.0, lambda: h.gw.done("a"))
    h.env.run()
    assert h.gone == [("b", 0.5), ("d", 0.75)]
    assert [(i, t) for i, t, _p in h.dispatched] == [("a", 0.0), ("c", 1.0)] and h.rejected == []


def test_done_for_an_id_never_dispatched_frees_nothing():
    h = Harness(max_in_flight=1)
    h.offer_at(0.0, _spec("a"), _spec("b"))
    h.at(0.5, lambda: h.gw.done("zzz"))
    h.env.run()
    assert [d[0] for d in h.dispatched] == ["a"] and h.gw.num_queued == 1


def test_fifo_and_wfq_dispatch_orders_are_exact():
    def order(queuing, tenants):
        h = Harness(max_in_flight=1, queuing=queuing, tenants=tenants)
        specs = [_spec("first", tenant="free")] + [_spec(f"f{i}", tenant="free") for i in range(1, 5)] + \
            [_spec(f"p{i}", tenant="premium") for i in (1, 2)]
        h.offer_at(0.0, *specs)
        for k in range(1, 7):
            h.at(float(k), lambda k=k: h.gw.done(h.dispatched[k - 1][0]))
        h.env.run()
        return [(i, t) for i, t, _p in h.dispatched]

    tenants = {"premium": {"weight": 4}, "free": {"weight": 1}}
    assert [i for i, _ in order({"name": "fifo"}, tenants)] == ["first", "f1", "f2", "f3", "f4", "p1", "p2"]
    # SCFQ tags: free 1, 2, 3, 4; premium 0.25, 0.5 (cost 1 / weight): premium first
    assert order({"name": "wfq"}, tenants) == [("first", 0.0), ("p1", 1.0), ("p2", 2.0), ("f1", 3.0), ("f2", 4.0),
                                               ("f3", 5.0), ("f4", 6.0)]


def test_wfq_interleaves_backlogged_tenants_by_weight():
    h = Harness(max_in_flight=1, queuing={"name": "wfq"}, tenants={"a": {"weight": 2}, "b": {"weight": 1}})
    h.offer_at(0.0, _spec("x"), *[_spec(f"a{i}", tenant="a") for i in range(4)],
               *[_spec(f"b{i}", tenant="b") for i in range(2)])
    for k in range(1, 8):
        h.at(float(k), lambda k=k: h.gw.done(h.dispatched[k - 1][0]))
    h.env.run()
    # tags: a 0.5, 1, 1.5, 2; b 1, 2; ties in arrival order (a before b)
    assert [i for i, _t, _p in h.dispatched] == ["x", "a0", "a1", "b0", "a2", "a3", "b1"]


def test_wfq_by_tokens_charges_long_requests_more():
    h = Harness(max_in_flight=1, queuing={"name": "wfq", "params": {"cost": "tokens"}})
    h.offer_at(0.0, _spec("x"), _spec("long", tenant="a", prompt_len=1000), _spec("short", tenant="b"))
    h.at(1.0, lambda: h.gw.done("x"))
    h.env.run()
    assert [i for i, _t, _p in h.dispatched] == ["x", "short"]


def test_priority_mapping_class_wins_over_tenant():
    h = Harness(tenants={"t": {"priority": 5}}, slo_classes={"gold": {"priority": 0}})
    h.offer_at(0.0, _spec("a", tenant="t", slo_class="gold"), _spec("b", tenant="t"), _spec("c"))
    h.env.run()
    assert h.dispatched == [("a", 0.0, 0), ("b", 0.0, 5), ("c", 0.0, 0)]


# --- in a replay and a cluster ----------------------------------------------------------------------
def _cfg(gateway: dict) -> SimConfig:
    return build_dataclass(SimConfig(), {"gateway": {"enabled": True, **gateway}}, "")


def test_replay_burst_counts_match_bench_serve_failed():
    cfg = _cfg({"max_in_flight": 2, "rules": [{"name": "queue_limit", "params": {"max_queued": 3}}]})
    res = run(cfg, Workload([_spec(f"r{i}") for i in range(10)], "burst", "hand"))
    df = res.requests.set_index("request_id")
    assert sorted(df.index[df["status"] == "rejected"]) == [f"r{i}" for i in range(5, 10)]
    assert set(df.loc[[f"r{i}" for i in range(5, 10)], "reject_reason"]) == {QUEUE_FULL}
    assert res.summary["bench_serve"]["failed"] == 5 == res.summary["gateway"]["num_rejected"]
    assert res.summary["bench_serve"]["completed"] == 5
    # r2 and r3 were dispatched the instant r0 and r1 finished, r4 when r2 did (no frontend: engine times)
    waits = res.summary["gateway"]
    assert waits["num_dispatched"] == 5 and waits["max_queued"] == 3
    assert df.loc["r0", "arrival_s"] == 0.0 and df.loc["r2", "first_scheduled_s"] >= df.loc["r0", "finish_s"]
    assert res.summary["fast_path"] == {"used": False, "declined_reason": GATEWAY_DECLINED}


def test_replay_queue_timeout_rejects_at_the_timeout():
    cfg = _cfg({"max_in_flight": 1, "queue_timeout_s": 0.25})
    res = run(cfg, Workload([_spec(f"r{i}") for i in range(3)], "burst", "hand"))
    df = res.requests.set_index("request_id")
    assert list(df["status"]) == ["completed", "rejected", "rejected"]
    assert set(df.loc[["r1", "r2"], "reject_reason"]) == {QUEUE_TIMEOUT}
    assert res.summary["bench_serve"]["failed"] == 2


def test_replay_client_timeout_in_the_queue_counts_as_timed_out():
    cfg = build_dataclass(SimConfig(), {"client": {"timeout_s": 0.25},
                                        "gateway": {"enabled": True, "max_in_flight": 1}}, "")
    res = run(cfg, Workload([_spec(f"r{i}") for i in range(3)], "burst", "hand"))
    df = res.requests.set_index("request_id")
    assert list(df["status"]) == ["timed_out", "timed_out", "timed_out"]  # r0 runs past 0.25 s too
    assert res.summary["gateway"]["num_gone_while_queued"] == 2 and res.summary["num_timed_out"] == 3
    assert res.summary["bench_serve"]["failed"] == 3


def test_runs_without_the_gateway_have_no_gateway_or_class_blocks():
    res = run(SimConfig(), Workload([_spec(f"r{i}", t=0.1 * i) for i in range(4)], "plain", "hand"))
    assert "gateway" not in res.summary and "classes" not in res.summary
    assert res.summary["fast_path"]["used"]


def test_cluster_gateway_rejections_have_rows_without_a_replica():
    cfg = ClusterConfig.from_dict({"replicas": [{"count": 2}], "gateway": {
        "enabled": True, "max_in_flight": 2, "rules": [{"name": "queue_limit", "params": {"max_queued": 1}}]}})
    res = run_cluster(cfg, Workload([_spec(f"r{i}", tenant="a" if i % 2 else "b") for i in range(6)], "b", "hand"))
    df = res.requests.set_index("request_id")
    rejected = sorted(df.index[df["status"] == "rejected"])
    assert rejected == ["r3", "r4", "r5"]
    assert df.loc[rejected, "replica"].isna().all() and df.loc[["r0", "r1", "r2"], "replica"].notna().all()
    assert res.summary["bench_serve"]["failed"] == 3 == res.summary["gateway"]["num_rejected"]
    by_tenant = res.summary["classes"]["by_tenant"]
    assert {t: (v["num_completed"], v["num_rejected"]) for t, v in by_tenant.items()} == {"a": (1, 2), "b": (2, 1)}
    assert all(r["fast_path_declined"] == GATEWAY_DECLINED for r in res.summary["replicas"])


def test_cluster_requests_whose_clients_give_up_in_the_queue_are_timed_out_rows():
    cfg = ClusterConfig.from_dict({"replicas": [{"count": 1}], "gateway": {"enabled": True, "max_in_flight": 1}})
    specs = [_spec("r0"), RequestSpec("r1", 0.0, 100, 50, timeout_s=0.125)]
    res = run_cluster(cfg, Workload(specs, "b", "hand"))
    df = res.requests.set_index("request_id")
    assert df.loc["r1", "status"] == "timed_out" and pd_isna(df.loc["r1", "replica"])
    assert df.loc["r0", "status"] == "completed" and res.summary["bench_serve"]["failed"] == 1


# --- bad config ------------------------------------------------------------------------------------
@pytest.mark.parametrize("gateway, field, words", [
    ({"rules": [{"name": "queue_limt"}]}, "gateway.rules[].name", "did you mean 'queue_limit'"),
    ({"queuing": {"name": "wfqq"}}, "gateway.queuing.name", "did you mean 'wfq'"),
    ({"rules": [{"name": "queue_limit", "params": {"max_queued": -1}}]}, "gateway.rules[0].params.max_queued", ">= 0"),
    ({"rules": [{"name": "queue_limit"}]}, "gateway.rules[0].params.max_queued", "missing"),
    ({"rules": [{"name": "token_bucket", "params": {"requests_per_s": 1}}]},
     "gateway.rules[0].params.burst_requests", "together"),
    ({"rules": [{"name": "token_bucket", "params": {"rate": 1}}]}, "gateway.rules[0].params.rate", "unknown"),
    ({"queuing": {"name": "wfq", "params": {"cost": "bytes"}}}, "gateway.queuing.params.cost", "requests | tokens"),
    ({"max_in_flight": 0}, "gateway.max_in_flight", "integer >= 1"),
    ({"queue_timeout_s": -1.0}, "gateway.queue_timeout_s", "> 0"),
    ({"tenants": {"free": {"weight": 0}}}, "gateway.tenants.free.weight", "> 0"),
    ({"tenants": {"free": {"wieght": 1}}}, "gateway.tenants.free", "weight"),
    ({"slo_classes": {"gold": {"ttft_s": -1}}}, "gateway.slo_classes.gold.ttft_s", "> 0"),
    ({"slo_classes": {"gold": {"priority": 1.5}}}, "gateway.slo_classes.gold.priority", "integer"),
])
def test_bad_gateway_config_is_a_clear_error(gateway, field, words):
    with pytest.raises(InputError) as err:
        build_dataclass(SimConfig(), {"gateway": gateway}, "")
    assert err.value.field == field and words in str(err.value)


def test_cluster_refuses_a_gateway_on_a_replica():
    with pytest.raises(InputError, match="replica has no gateway"):
        ClusterConfig.from_dict({"replicas": [{"count": 1, "sim": {"gateway": {"enabled": True}}}]})


def test_an_engine_its_owner_feeds_refuses_a_gateway():
    from servesim.simulator.closed_loop import ClosedLoopConfig, run_closed_loop

    with pytest.raises(InputError, match="owner submits") as err:
        run_closed_loop(_cfg({}), ClosedLoopConfig(num_clients=1, prompt_len=8, output_len=2))
    assert err.value.field == "gateway.enabled"


def test_gateway_config_round_trips_through_its_dict_form():
    from servesim.simulator.cluster.config import cluster_config_to_dict
    from servesim.simulator.config import to_dict
    from servesim.simulator.config_values import apply_overrides

    gw = {"enabled": True, "max_in_flight": 8, "queue_timeout_s": 2.0, "queuing": {"name": "wfq"},
          "rules": [{"name": "token_bucket", "params": {"tenant": "free", "requests_per_s": 1, "burst_requests": 2}}],
          "tenants": {"free": {"weight": 1}, "premium": {"weight": 4, "priority": 0}},
          "slo_classes": {"gold": {"ttft_s": 0.5, "tpot_s": 0.05, "priority": 0}}}
    cfg = _cfg(gw)
    assert build_dataclass(SimConfig(), to_dict(cfg), "") == cfg
    assert apply_overrides(cfg, {"gateway.max_in_flight": "16"}).gateway.max_in_flight == 16
    ccfg = ClusterConfig.from_dict({"replicas": [{"count": 2}], "gateway": gw})
    assert ClusterConfig.from_dict(cluster_config_to_dict(ccfg)) == ccfg
    plain = ClusterConfig.from_dict({"replicas": [{"count": 2}]})
    assert "gateway" not in cluster_config_to_dict(plain)  # a cluster without one writes what it wrote before
