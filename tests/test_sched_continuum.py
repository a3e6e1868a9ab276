"""Continuum: pin a non-final turn's KV across the tool call, with a TTL learned from observed gaps."""

from __future__ import annotations

from servesim.scheduler import RequestStatus
from sched_helpers import make_sched, req, step


def run_until_finished(s, r, t0, dt=0.01):
    t = t0
    while not r.is_finished():
        t += dt
        out = s.schedule(now_s=t)
        from sched_helpers import output_for
        s.update_from_output(out, output_for(out), now_s=t)
        s.check_invariants()
    return t


def test_non_final_turn_is_pinned_and_next_turn_hits_it():
    s = make_sched(policy="continuum", block_size=4, num_blocks=50)
    turn1 = req(s, "t1", list(range(20)), max_tokens=4, job_id="job", is_last_step=False)
    s.add_request(turn1, now_s=0.0)
    t = run_until_finished(s, turn1, 0.0)
    assert [p.request.request_id for p in s.policy.pins] == ["t1"]
    held = s.kv_cache_manager.num_blocks_held("t1")
    assert held == 6  # 24 tokens: pinned blocks stay referenced, not free
    # Next turn: the previous prompt + outputs + new user tokens arrive 0.5 s later.
    prompt2 = list(turn1.all_token_ids) + [500, 501, 502, 503]
    turn2 = req(s, "t2", prompt2, max_tokens=2, job_id="job", is_last_step=True)
    s.add_request(turn2, now_s=t + 0.5)
    out = s.schedule(now_s=t + 0.5)
    assert out.scheduled_new_reqs[0].num_computed_tokens == 20  # hit on the pinned prefix
    s.check_invariants()


def test_pin_expires_after_ttl_and_blocks_return():
    s = make_sched(policy="continuum", block_size=4, num_blocks=50, continuum_default_gap_s=0.5)
    r = req(s, "t1", list(range(20)), max_tokens=2, job_id="job", is_last_step=False)
    s.add_request(r, now_s=0.0)
    t = run_until_finished(s, r, 0.0)
    ttl = s.policy.pins[0].unpin_at_s - t
    assert abs(ttl - 1.0) < 1e-9  # twice the 0.5 s default gap
    s.schedule(now_s=t + 0.99)
    assert s.policy.pins
    s.schedule(now_s=t + 1.0)
    assert not s.policy.pins and "t1" not in s.requests
    assert s.kv_cache_manager.block_pool.get_num_free_blocks() == 49
    s.check_invariants()


def test_no_pin_when_predicted_gap_exceeds_threshold_or_last_turn():
    s = make_sched(policy="continuum", continuum_default_gap_s=5.0)  # default threshold 2 s
    a = req(s, "a", 8, max_tokens=1, job_id="j", is_last_step=False)
    b = req(s, "b", 8, max_tokens=1, job_id="k", is_last_step=True)
    s.add_request(a)
    s.add_request(b)
    step(s)
    assert a.is_finished() and b.is_finished() and not s.policy.pins


def test_estimator_learns_per_job_gaps():
    s = make_sched(policy="continuum")
    est = s.policy.estimator
    r1 = req(s, "a1", 4, job_id="j")
    est.request_finished(r1, 10.0)
    est.request_arrives(req(s, "a2", 4, job_id="j"), 10.4)
    est.request_finished(r1, 20.0)
    est.request_arrives(req(s, "a3", 4, job_id="j"), 20.8)
    assert abs(est.predict_gap_s("j") - 0.6) < 1e-9
    assert abs(est.predict_gap_s("unseen") - 0.6) < 1e-9  # falls back to the mean over all jobs


def test_one_pin_per_job_and_preemption_prefers_unpinned_jobs():
    s = make_sched(policy="continuum", block_size=4, num_blocks=30, scheduler_reserve_full_isl=False)
    t1 = req(s, "t1", list(range(12)), max_tokens=1, job_id="A", is_last_step=False)
    s.add_request(t1, now_s=0.0)
    run_until_finished(s, t1, 0.0)
    t2 = req(s, "t2", list(t1.all_token_ids) + [9, 9, 9], max_tokens=1, job_id="A", is_last_step=False)
    s.add_request(t2, now_s=0.1)
    run_until_finished(s, t2, 0.1)
    assert [p.request.request_id for p in s.policy.pins] == ["t2"]  # t2 replaced t1's pin
    # Fill the pool: a turn of pinned job A and an unrelated request compete for blocks.
    a3 = req(s, "a3", list(t2.all_token_ids) + [7] * 4, max_tokens=40, job_id="A")
    other = req(s, "x", 40, max_tokens=40)
    # x is admitted first, so plain FCFS would evict a3 (the tail); Continuum spares the pinned job.
    s.add_request(other, now_s=0.2)
    s.add_request(a3, now_s=0.2)
    preempted = set()
    t = 0.2
    for _ in range(60):
        t += 0.001
        out = s.schedule(now_s=t)
        preempted |= out.preempted_req_ids
        from sched_helpers import output_for
        s.update_from_output(out, output_for(out), now_s=t)
        s.check_invariants()
        if preempted:
            break
    assert preempted == {"x"}
    assert s.requests["x"].status == RequestStatus.PREEMPTED
