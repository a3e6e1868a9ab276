"""Parks on a P/D decode replica (scheduler/bulk/pd.py, "Parks"): the schedule after a hand-off,
applied by the bulk path (the batch's decodes in bulk, then the scheduler's own waiting phase
reserving the hand-offs' blocks and parking them, behind any landed request that joins), leaves
exactly the state schedule() leaves, starts the same transfers in the same order, and the steps
after it are the same; the run goes on past it, passing the parked requests over. Where a waiting
request is not a new hand-off, nothing is in flight, or the parks' whole prompts do not fit beside
the run's decodes, no run opens. Twin schedulers driven by hand, as vLLM's tests drive theirs; the
whole engine (runs applied at their time, the rest deferred) against stepping at the end."""

from __future__ import annotations

import pytest

from servesim.scheduler.request import RequestStatus
from servesim.simulator.cluster import sim_config_from_dict
from servesim.simulator.cluster.pd_connectors import RemotePrefillConnector
from servesim.simulator.cluster.pd_schedulers import decode_scheduler
from servesim.simulator.startup import resolve_cache
from tests.sched_helpers import apply_due, decode_output, output_for, req, runs_of, scheduler_state


def _twin(num_blocks: int = 60, landed: tuple[str, ...] = ()):
    """A decode scheduler with three local requests decoding and one step in flight; `landed`:
    hand-offs parked earlier whose transfers have landed. Returns it, its in-flight steps, its
    connector and the transfers it started."""
    cfg = sim_config_from_dict({"scheduler.async_scheduling": True, "cache.num_gpu_blocks": num_blocks,
                                "cache.block_size": 16, "scheduler.max_model_len": 512})
    started: list[tuple[str, int]] = []
    conn = RemotePrefillConnector(lambda r, n: started.append((r.request_id, n)))
    sched = decode_scheduler(cfg, resolve_cache(cfg)[0], conn)
    in_flight: list = []
    for rid, n in (("a", 30), ("b", 17), ("c", 5)):
        sched.add_request(req(sched, rid, n, max_tokens=40))
    for _ in range(4):
        out = sched.schedule()
        in_flight.append((out, output_for(out)))
        apply_due(sched, in_flight, 2, out.total_num_scheduled_tokens == 0)
    for rid in landed:
        conn.expect(rid)
        sched.add_request(req(sched, rid, 40, max_tokens=12))
    if landed:
        out = sched.schedule()  # parks them
        in_flight.append((out, output_for(out)))
        apply_due(sched, in_flight, 2, False)
        for rid in landed:
            sched.mark_kv_received(rid)
    return sched, in_flight, conn, started


def _hand_over(sched, conn, prompts: dict[str, int]) -> None:
    for rid, n in prompts.items():
        conn.expect(rid)
        sched.add_request(req(sched, rid, n, max_tokens=12))


def _park_step_twins(prompts: dict[str, int], num_blocks: int = 60, landed: tuple[str, ...] = ()):
    """The reference's schedule() and the bulk twin's one-schedule run after the same hand-offs:
    both schedulers, their in-flight steps, the reference's output and each one's transfers."""
    ref, ref_flight, ref_conn, ref_started = _twin(num_blocks, landed)
    bulk, bulk_flight, bulk_conn, bulk_started = _twin(num_blocks, landed)
    _hand_over(ref, ref_conn, prompts)
    _hand_over(bulk, bulk_conn, prompts)
    assert scheduler_state(ref) == scheduler_state(bulk)
    ref_started.clear()
    bulk_started.clear()
    ref_out = ref.schedule()

    runs = runs_of(bulk)
    assert runs.decode_run_horizon(64, 1, True) >= 2
    joins = runs.decode_run_joining()
    assert [r.request_id for r in joins.parks] == list(prompts)
    batch = runs.decode_run_requests() + joins.requests
    assert [r.request_id for r in batch] == list(ref_out.num_scheduled_tokens)
    handed = set(runs.finished_req_ids())
    eff = runs.schedule_decode_steps(batch, 1, None, ref.now_s)
    assert [r.request_id for r in eff.joined] == [r.request_id for r in joins.requests] == list(landed)
    assert eff.joined_tokens == [1] * len(landed)
    assert eff.finished == handed == ref_out.finished_req_ids
    assert eff.free_after == [ref.get_num_free_blocks()]
    assert bulk_started == ref_started
    assert scheduler_state(bulk) == scheduler_state(ref)
    ref_flight.append((ref_out, output_for(ref_out)))
    bulk_flight.append((runs.decode_step_output(batch, eff.joined_tokens),
                        decode_output([r.request_id for r in batch], [7] * len(batch))))
    return (ref, ref_flight, ref_started), (bulk, bulk_flight, bulk_started)


def _same_steps_after(ref_side, bulk_side, landed: tuple[str, ...]) -> None:
    """The steps after it, stepped by both: the same decisions."""
    (ref, ref_flight, ref_started), (bulk, bulk_flight, bulk_started) = ref_side, bulk_side
    for sched, flight in ((ref, ref_flight), (bulk, bulk_flight)):
        apply_due(sched, flight, 2, False)
        for rid in landed:
            sched.mark_kv_received(rid)
    for _ in range(14):
        outs = []
        for sched, flight in ((ref, ref_flight), (bulk, bulk_flight)):
            out = sched.schedule()
            outs.append((dict(out.num_scheduled_tokens), [nr.req_id for nr in out.scheduled_new_reqs],
                         out.finished_req_ids))
            flight.append((out, output_for(out)))
            apply_due(sched, flight, 2, out.total_num_scheduled_tokens == 0)
        assert outs[0] == outs[1]
    assert bulk_started == ref_started
    assert scheduler_state(bulk) == scheduler_state(ref)


def test_the_schedule_after_hand_offs_parks_them_as_schedule_does():
    prompts = {"h1": 70, "h2": 48}
    ref_side, bulk_side = _park_step_twins(prompts)
    ref, _, ref_started = ref_side
    assert ref_started == [("h1", 70), ("h2", 48)]  # no local hit: every prompt token crosses
    assert all(ref.requests[rid].status == RequestStatus.WAITING_FOR_REMOTE_KVS for rid in prompts)
    _same_steps_after(ref_side, bulk_side, ("h1", "h2"))


def test_landed_requests_join_the_schedule_that_parks_new_hand_offs():
    ref_side, bulk_side = _park_step_twins({"h1": 33}, landed=("p1", "p2"))
    ref = ref_side[0]
    assert ref.requests["p1"].status == ref.requests["p2"].status == RequestStatus.RUNNING
    assert ref.requests["h1"].status == RequestStatus.WAITING_FOR_REMOTE_KVS
    _same_steps_after(ref_side, bulk_side, ("h1",))


def test_no_run_opens_where_the_parks_whole_prompts_do_not_fit():
    # the smallest pool a 512-token request takes: h1's 19 blocks fit, h2's 10 do not then, and
    # schedule() leaves h2 waiting (a later schedule parks it): not a run's plain schedule
    sched, _flight, conn, started = _twin(num_blocks=32)
    _hand_over(sched, conn, {"h1": 300, "h2": 150})
    assert runs_of(sched).decode_run_horizon(64, 1, True) == 0
    sched.schedule()
    assert [rid for rid, _ in started] == ["h1"] and [r.request_id for r in sched.waiting] == ["h2"]


@pytest.mark.parametrize("why", ["preempted", "not_new", "sync", "priority"])
def test_no_run_parks_what_the_waiting_phase_could_schedule(why):
    sched, _flight, conn, _started = _twin()
    runs = runs_of(sched)
    _hand_over(sched, conn, {"h1": 40})
    h1 = sched.requests["h1"]
    if why == "preempted":  # it comes back computing locally (one transfer per request)
        h1.num_preemptions = 1
    elif why == "not_new":
        h1.num_computed_tokens = 16
    elif why == "priority":
        sched.scheduler_config.policy = "priority"
    num_in_flight = 0 if why == "sync" else 1
    assert runs.decode_run_horizon(64, num_in_flight, True) == 0


def test_a_waiting_request_that_is_scheduled_tokens_fails_the_park_loudly():
    # Every hand-off is expected by the connector (PDHandoffs expects it before the submit); one
    # that is not is computed locally, which a park schedule must not hide.
    sched, _flight, _conn, _started = _twin()
    sched.add_request(req(sched, "x", 20, max_tokens=4))
    runs = runs_of(sched)
    assert runs.decode_run_horizon(64, 1, True) >= 2
    with pytest.raises(AssertionError, match="admitted"):
        runs.schedule_decode_steps(runs.decode_run_requests(), 1, None, sched.now_s)
