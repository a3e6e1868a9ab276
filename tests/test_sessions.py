"""Closed-loop session turns (simulator/sessions.py): exact timelines on a single engine and a
cluster, context growth, abandoned sessions, bad input, and runs without turns left as they were."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from servesim.scheduler import CacheConfig, SchedulerConfig
from servesim.simulator.build import build_engine
from servesim.simulator.cluster import ClusterConfig, ReplicaGroup, RouterConfig, run_cluster
from servesim.simulator.config import ClientConfig, CostModelConfig, SimConfig
from servesim.simulator.cost_model.cpu_overhead import CpuOverheadConfig
from servesim.simulator.frontend import FrontendConfig
from servesim.simulator.session_metrics import session_summary, session_table
from servesim.simulator.sessions import TURNS_DECLINED, plan_turns
from servesim.traces.errors import InputError
from servesim.traces.synthetic import make_workload
from servesim.traces.workload import RequestSpec, Workload
import test_sim_engine  # noqa: F401  (registers the test-linear cost model: 5 ms + 1 ms a token)

BLOCK = 4


def cfg(**kw) -> SimConfig:
    return SimConfig(scheduler=SchedulerConfig(max_model_len=512), cache=CacheConfig(block_size=BLOCK, num_gpu_blocks=400),
                     derive_num_gpu_blocks=False,
                     cost_model=CostModelConfig(name="test-linear", cpu_overhead=CpuOverheadConfig.zero()), **kw)


def turn(sid: str, k: int, arrival_s: float, prompt: int, out: int, think_s: float | None = None, last=False,
         parent: str | None = None) -> RequestSpec:
    parent = parent if parent is not None else (f"{sid}-{k - 1}" if k else None)
    return RequestSpec(f"{sid}-{k}", arrival_s, prompt, out, session_id=sid, is_last_turn=last,
                       parent_request_id=parent, think_time_s=think_s if k else None)


def session_workload() -> Workload:
    """Session s: 40-token prompt, answer 4; then +8 new tokens after 0.5 s; then +8 after 0.25 s.
    An unrelated request x arrives at 0.1 s."""
    return Workload.from_unsorted([
        turn("s", 0, 0.0, 40, 4),
        turn("s", 1, 0.5, 40 + 4 + 8, 3, think_s=0.5),
        turn("s", 2, 0.75, 52 + 3 + 8, 3, think_s=0.25, last=True),
        RequestSpec("x", 0.1, 10, 2)], "t", "hand")


def test_turn_arrives_exactly_think_time_after_the_previous_last_token():
    engine = build_engine(cfg(), session_workload())
    engine.run()
    r = engine.metrics.requests
    assert r["s-1"].arrival_s == r["s-0"].finish_s + 0.5  # exact: one timeout of think_time_s from the finish
    assert r["s-2"].arrival_s == r["s-1"].finish_s + 0.25
    assert r["s-0"].finish_s == r["s-0"].token_times_s[-1]
    # test-linear arithmetic: s-0 prefill 5+40 ms, then 3 decode steps of 6 ms -> 0.063
    assert r["s-0"].finish_s == pytest.approx(0.063) and r["s-1"].arrival_s == pytest.approx(0.563)
    assert r["x"].arrival_s == 0.1  # an open-loop request keeps its time
    assert engine.planner_declined == TURNS_DECLINED


def test_later_turn_hits_the_context_the_previous_turn_wrote():
    engine = build_engine(cfg(), session_workload())
    engine.run()
    r = engine.metrics.requests
    # Turn 0 computed KV for its 40 prompt tokens and 3 of its 4 output tokens (the last sampled token
    # has none): 43 tokens -> 10 full blocks. Turn 1 (52 tokens) starts with exactly those ids.
    assert r["s-1"].num_cached_tokens == (40 + 4 - 1) // BLOCK * BLOCK == 40
    assert r["s-2"].num_cached_tokens == (52 + 3 - 1) // BLOCK * BLOCK == 52


def test_context_ids_are_the_previous_prompt_and_answer():
    wl = session_workload()
    t0, t1 = wl.requests[0], wl.requests[2]
    assert t1.request_id == "s-1"
    ids = t1.token_ids()
    assert ids[:44] == t0.token_ids() + t0.output_token_ids() and len(ids) == 52


def test_parent_without_an_answer_ends_its_session():
    too_long = 600  # > max_model_len 512: the frontend rejects it
    wl = Workload.from_unsorted([turn("s", 0, 0.0, too_long, 4), turn("s", 1, 0.1, too_long + 10, 2, think_s=0.1),
                                 turn("s", 2, 0.2, too_long + 20, 2, think_s=0.1, last=True),
                                 RequestSpec("x", 0.0, 8, 2)], "t", "hand")
    engine = build_engine(cfg(), wl)
    engine.run()
    assert set(engine.metrics.requests) == {"s-0", "x"}  # the later turns were never sent
    assert engine.turns.num_abandoned == 2
    summary = session_summary(wl.requests, engine.metrics.columns().requests, engine.turns.num_abandoned)
    assert summary["num_sessions"] == 1 and summary["num_complete"] == 0 and summary["num_turns_abandoned"] == 2


def test_client_timeout_of_a_parent_abandons_its_children():
    wl = Workload.from_unsorted([dataclasses.replace(turn("s", 0, 0.0, 40, 50), timeout_s=0.02),
                                 turn("s", 1, 0.0, 100, 2, think_s=0.0, last=True)], "t", "hand")
    engine = build_engine(cfg(), wl)
    engine.run()
    assert set(engine.metrics.requests) == {"s-0"} and engine.turns.num_abandoned == 1


def test_turn_waits_for_a_client_slot_and_the_frontend_delay():
    fe = FrontendConfig(enabled=True, serial=False)
    engine = build_engine(cfg(frontend=fe, client=ClientConfig(max_concurrency=1)), session_workload())
    res = engine.run()
    r = res.metrics.requests  # token times as the clients see them (the output delay applied)
    assert r["s-1"].arrival_s == r["s-0"].finish_s + 0.5  # think time from when the client has the answer
    assert r["s-2"].arrival_s == r["s-1"].finish_s + 0.25
    assert all(rec.finish_s is not None for rec in r.values())


def test_session_summary_and_table_are_exact():
    engine = build_engine(cfg(), session_workload())
    engine.run()
    wl, table = session_workload(), engine.metrics.columns().requests
    s = session_summary(wl.requests, table)
    r = engine.metrics.requests
    assert s["num_sessions"] == 1 and s["num_complete"] == 1 and s["turns"]["p50"] == 3
    assert s["completion_s"]["p50"] == r["s-2"].finish_s - r["s-0"].arrival_s
    assert s["cache_hit_rate_by_turn"] == {"0": 0.0, "1": 40 / 52, "2": 52 / 63}
    assert s["cache_hit_rate"] == (40 + 52) / (40 + 52 + 63)
    t = session_table(wl.requests, table)
    assert list(t["session_id"]) == ["s"] and int(t["num_turns_finished"][0]) == 3
    assert t["cached_tokens"][0] == 92 and t["prompt_tokens"][0] == 155


# --- cluster -------------------------------------------------------------------------------------


def cluster(router: str, **kw) -> ClusterConfig:
    return ClusterConfig(replicas=[ReplicaGroup(count=2, sim=cfg())], router=RouterConfig(router, {}),
                         routing_latency_s=0.001, **kw)


def test_cluster_turns_follow_the_answer_and_affinity_keeps_the_cache():
    res = run_cluster(cluster("session_affinity"), session_workload())
    df = res.requests.set_index("request_id")
    assert df.loc["s-1", "arrival_s"] == df.loc["s-0", "finish_s"] + 0.5
    assert df.loc["s-2", "arrival_s"] == df.loc["s-1", "finish_s"] + 0.25
    assert df.loc["s-1", "route_time_s"] == df.loc["s-1", "arrival_s"] + 0.001
    assert len(set(df.loc[["s-0", "s-1", "s-2"], "replica"])) == 1
    assert list(df.loc[["s-1", "s-2"], "num_cached_tokens"]) == [40, 52]
    assert res.summary["sessions"]["num_complete"] == 1
    assert all(r.result.planner_declined == TURNS_DECLINED for r in res.replicas)


def test_cluster_round_robin_loses_the_context():
    df = run_cluster(cluster("round_robin"), session_workload()).requests.set_index("request_id")
    # s-0 -> replica 0, x -> 1, s-1 -> 0 (hit), s-2 -> 1 (cold)
    assert list(df.loc[["s-0", "x", "s-1", "s-2"], "replica"]) == [0, 1, 0, 1]
    assert df.loc["s-2", "num_cached_tokens"] == 0


# --- bad input ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("kw, field", [
    ({"parent_request_id": "a"}, "think_time_s"),
    ({"think_time_s": 1.0}, "think_time_s"),
    ({"parent_request_id": "a", "think_time_s": -1.0}, "think_time_s"),
    ({"parent_request_id": "a", "think_time_s": float("nan")}, "think_time_s"),
    ({"parent_request_id": "b", "think_time_s": 1.0}, "parent_request_id"),
    ({"parent_request_id": "a", "think_time_s": 1.0, "session_id": None}, "session_id"),
])
def test_bad_turn_fields(kw, field):
    base = {"session_id": "s", **kw}
    with pytest.raises(InputError) as err:
        RequestSpec("b", 0.0, 4, 1, **base)
    assert err.value.field == field


def test_plan_refuses_a_parent_after_its_turn_and_duplicate_ids():
    a, b = turn("s", 0, 0.0, 8, 1), turn("s", 1, 0.0, 12, 1, think_s=0.0)
    with pytest.raises(InputError, match="later") as err:
        plan_turns([b, a])
    assert err.value.field == "parent_request_id"
    with pytest.raises(InputError, match="twice"):
        plan_turns([a, a, b])


def test_a_turn_whose_parent_was_cut_starts_its_session():
    b = turn("s", 1, 0.7, 12, 1, think_s=0.2)
    plan = plan_turns([b])
    assert plan.first_requests == [b] and plan.num_dependent == 0


# --- runs without closed-loop turns ------------------------------------------------------------------


SESSIONS = {"num_requests": 60, "arrival": {"rate_per_s": 4.0}, "prompt_len": {"dist": "fixed", "value": 64},
            "output_len": {"dist": "fixed", "value": 8},
            "sessions": {"num_turns": {"dist": "fixed", "value": 3}, "user_tokens": 16,
                         "think_time_s": {"dist": "fixed", "value": 0.5}}}


def test_open_loop_sessions_take_the_usual_path():
    wl = make_workload("sessions", SESSIONS, np.random.default_rng(3))
    assert plan_turns(wl.requests) is None
    assert all(r.parent_request_id is None for r in wl.requests)
    engine = build_engine(cfg(), wl)
    assert engine.turns is None and engine.planner_declined is None  # the fast path plans these runs
    # open-loop arrival: a_j + output_j * assumed_s_per_output_token (0.02) + gap
    by_id = {r.request_id: r for r in wl.requests}
    t0, t1 = by_id["synthetic-s0-t0"], by_id["synthetic-s0-t1"]
    assert t1.arrival_time_s == t0.arrival_time_s + 8 * 0.02 + 0.5


def test_generator_closed_loop_links_each_turn_to_the_previous():
    params = {**SESSIONS, "sessions": {**SESSIONS["sessions"], "closed_loop": True}}
    wl = make_workload("sessions", params, np.random.default_rng(3))
    by_id = {r.request_id: r for r in wl.requests}
    t0, t1 = by_id["synthetic-s0-t0"], by_id["synthetic-s0-t1"]
    assert t1.parent_request_id == t0.request_id and t1.think_time_s == 0.5
    assert t1.arrival_time_s == t0.arrival_time_s + 0.5  # the lower bound
    assert t1.prompt_len == t0.prompt_len + t0.output_len + 16
    open_loop = make_workload("sessions", SESSIONS, np.random.default_rng(3))
    # the same sessions and lengths (only the arrival rule, hence the num_requests cut, differs)
    lens = {r.request_id: (r.prompt_len, r.output_len) for r in open_loop.requests}
    common = [r for r in wl.requests if r.request_id in lens]
    assert len(common) > 30 and all(lens[r.request_id] == (r.prompt_len, r.output_len) for r in common)
    res = build_engine(cfg(), wl).run()
    assert all(rec.finish_s is not None for rec in res.metrics.requests.values())


def test_generator_closed_loop_must_be_a_bool():
    params = {**SESSIONS, "sessions": {**SESSIONS["sessions"], "closed_loop": "yes"}}
    with pytest.raises(InputError) as err:
        make_workload("sessions", params, np.random.default_rng(0))
    assert "closed_loop" in str(err.value)


def test_closed_loop_run_equals_an_open_loop_replay_of_its_send_times():
    """The turns' injection changes nothing but when they arrive: replaying the same requests open-loop
    at the send times the closed-loop run recorded (no parent links; the fast path may plan it) gives
    the same requests and steps."""
    params = {**SESSIONS, "num_requests": 40,
              "sessions": {**SESSIONS["sessions"], "closed_loop": True, "tool_call_fraction": 0.5,
                           "tool_call_s": {"dist": "exponential", "mean": 0.05}}}
    wl = make_workload("sessions", params, np.random.default_rng(5))
    closed = build_engine(cfg(), wl).run()
    sent = {rid: rec.arrival_s for rid, rec in closed.metrics.requests.items()}
    replay = Workload.from_unsorted([dataclasses.replace(r, arrival_time_s=sent[r.request_id], parent_request_id=None,
                                                         think_time_s=None) for r in wl.requests], "replay", "test")
    engine = build_engine(cfg(), replay)
    open_loop = engine.run()
    assert engine.turns is None
    a, b = closed.metrics.requests_frame(), open_loop.metrics.requests_frame()
    a = a.set_index("request_id").sort_index()
    b = b.set_index("request_id").sort_index()
    import pandas as pd

    pd.testing.assert_frame_equal(a, b)
    pd.testing.assert_frame_equal(closed.metrics.steps_frame(), open_loop.metrics.steps_frame())


def test_dp_lockstep_ranks_release_turns_too():
    from servesim.simulator.cluster.dp import dp_cluster_config

    from servesim.simulator.config import HardwareConfig

    sim = SimConfig(hardware=HardwareConfig(model="qwen3-30b-a3b", gpu="h100", tp=1),
                    scheduler=SchedulerConfig(async_scheduling=False),
                    cost_model=CostModelConfig(name="roofline", cpu_overhead=CpuOverheadConfig.zero()))
    res = run_cluster(dp_cluster_config(sim, 2, lockstep=True), session_workload())
    df = res.requests.set_index("request_id")
    assert df.loc["s-1", "arrival_s"] == df.loc["s-0", "finish_s"] + 0.5
    assert df.loc["s-2", "arrival_s"] == df.loc["s-1", "finish_s"] + 0.25
    assert df["finish_s"].notna().all()


def test_summary_line_says_what_the_sessions_did():
    from servesim.simulator.session_metrics import session_summary_line

    assert session_summary_line({}) is None
    s = {"sessions": {"num_sessions": 3, "num_complete": 2, "num_turns_abandoned": 1,
                      "completion_s": {"count": 2, "p50": 1.5, "p90": 2.25}, "cache_hit_rate": 0.5}}
    assert session_summary_line(s) == ("sessions 2/3 complete (1 turns never sent: an earlier answer was missing), "
                                       "completion p50 1.50 s, p90 2.25 s; cache hit rate of the turns 50.0 %")
