"""Joins on a P/D decode replica (scheduler/bulk/pd.py, "Joins"): a run's first schedule applied by
the bulk path (the batch's decodes in bulk, then the scheduler's own waiting phase admitting the
landed transfers) leaves exactly the state schedule() leaves, and the steps after it are the same;
where a landed request cannot join, or nothing is in flight, no run opens with it. Twin schedulers
driven by hand, as vLLM's tests drive theirs."""

from __future__ import annotations

import pytest

from servesim.scheduler.request import RequestStatus
from servesim.simulator.cluster import sim_config_from_dict
from servesim.simulator.cluster.pd_connectors import RemotePrefillConnector
from servesim.simulator.cluster.pd_schedulers import decode_scheduler
from servesim.simulator.startup import resolve_cache
from tests.sched_helpers import apply_due, decode_output, output_for, req, runs_of, scheduler_state

PROMPTS = {"p1": 70, "p2": 48, "p3": 33}  # handed over from a prefill side (p2: a whole number of blocks)


def _twin(seed_tokens: int = 7):
    """A decode scheduler with three local requests decoding and one step in flight, and three
    handed-over requests parked for their transfers, of which p1 and p2 have landed."""
    cfg = sim_config_from_dict({"scheduler.async_scheduling": True, "cache.num_gpu_blocks": 60,
                                "cache.block_size": 16, "scheduler.max_model_len": 512})
    started: list[str] = []
    conn = RemotePrefillConnector(lambda r, n: started.append(r.request_id))
    sched = decode_scheduler(cfg, resolve_cache(cfg)[0], conn)
    in_flight: list = []
    for rid, n in (("a", 30), ("b", 17), ("c", 5)):
        sched.add_request(req(sched, rid, n, max_tokens=40))
    for _ in range(4):
        out = sched.schedule()
        in_flight.append((out, output_for(out, default=seed_tokens)))
        apply_due(sched, in_flight, 2, out.total_num_scheduled_tokens == 0)
    for rid, n in PROMPTS.items():
        conn.expect(rid)
        sched.add_request(req(sched, rid, n, max_tokens=12))
    out = sched.schedule()  # parks them (blocks reserved, transfers started) and decodes a, b, c
    assert out.num_scheduled_tokens == {"a": 1, "b": 1, "c": 1} and started == list(PROMPTS)
    in_flight.append((out, output_for(out, default=seed_tokens)))
    apply_due(sched, in_flight, 2, False)
    sched.mark_kv_received("p1")
    sched.mark_kv_received("p2")
    return sched, in_flight


def test_a_runs_first_schedule_admits_the_landed_requests_as_schedule_does():
    ref, ref_flight = _twin()
    bulk, bulk_flight = _twin()
    assert scheduler_state(ref) == scheduler_state(bulk)
    ref_out = ref.schedule()
    assert [nr.req_id for nr in ref_out.scheduled_new_reqs] == ["p1", "p2"]

    runs = runs_of(bulk)
    assert runs.decode_run_horizon(64, 1, True) >= 2
    joins = runs.decode_run_joining()
    joining = joins.requests
    assert [r.request_id for r in joining] == ["p1", "p2"]
    assert joins.decode_contexts() == joins.contexts == [PROMPTS["p1"] - 1, PROMPTS["p2"] - 1]
    assert joins.num_new_tokens == [1, 1] and not joins.prompt_tokens()
    batch = runs.decode_run_requests() + joining
    assert [r.request_id for r in batch] == list(ref_out.num_scheduled_tokens)
    handed = set(runs.finished_req_ids())
    eff = runs.schedule_decode_steps(batch, 1, None, ref.now_s)
    assert [r.request_id for r in eff.joined] == ["p1", "p2"] and eff.joined_tokens == [1, 1]
    assert eff.finished == handed == ref_out.finished_req_ids
    assert eff.free_after == [ref.get_num_free_blocks()]
    assert scheduler_state(bulk) == scheduler_state(ref)
    assert ref.requests["p3"].status == RequestStatus.WAITING_FOR_REMOTE_KVS  # passed over, still parked

    # the steps after it: the same decisions, whatever the run's own output object holds
    ref_flight.append((ref_out, output_for(ref_out)))
    bulk_flight.append((runs.decode_step_output(batch), decode_output([r.request_id for r in batch],
                                                                      [7] * len(batch))))
    bulk.mark_kv_received("p3")
    ref.mark_kv_received("p3")
    for sched, flight in ((ref, ref_flight), (bulk, bulk_flight)):
        apply_due(sched, flight, 2, False)
    for _ in range(12):
        outs = []
        for sched, flight in ((ref, ref_flight), (bulk, bulk_flight)):
            out = sched.schedule()
            outs.append((dict(out.num_scheduled_tokens), [nr.req_id for nr in out.scheduled_new_reqs],
                         out.finished_req_ids))
            flight.append((out, output_for(out)))
            apply_due(sched, flight, 2, out.total_num_scheduled_tokens == 0)
        assert outs[0] == outs[1]
    assert scheduler_state(bulk) == scheduler_state(ref)


@pytest.mark.parametrize("why", ["preempted", "waiting", "sync"])
def test_no_run_opens_with_a_request_that_cannot_join(why):
    sched, _flight = _twin()
    runs = runs_of(sched)
    if why == "preempted":  # it would come back as a resumed request, not a new one
        sched.requests["p1"].num_preemptions = 1
    elif why == "waiting":  # a hand-off in `waiting` reserves blocks and starts a transfer
        sched.add_request(req(sched, "w", 40, max_tokens=4))
    num_in_flight = 0 if why == "sync" else 1
    assert runs.decode_run_horizon(64, num_in_flight, True) == 0
