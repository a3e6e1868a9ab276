"""SGLangScheduler.finish_requests: aborts from outside (clients giving up), by hand."""

from __future__ import annotations

from servesim.scheduler import ModelRunnerOutput, RequestStatus
from test_sglang_scheduler import make_sched, req, step


def test_abort_waiting_decoding_and_chunked_requests_frees_their_memory():
    sched = make_sched(chunked_prefill_size=64, max_running_requests=2)
    sched.add_request(req("dec", 10, max_tokens=50))
    step(sched)  # dec prefilled, now decoding
    sched.add_request(req("chunk", 150, max_tokens=5))
    sched.add_request(req("wait", 10, max_tokens=5))
    step(sched)  # chunk's first 64 tokens; max_running_requests=2 keeps "wait" queued
    assert sched.chunked_req is not None and sched.chunked_req.request_id == "chunk"
    done = sched.finish_requests(["wait", "chunk", "dec", "dec", "nope"], RequestStatus.FINISHED_ABORTED)
    assert done == ["wait", "chunk", "dec"]  # repeated and unknown ids are ignored
    sched.check_invariants()
    assert not sched.has_unfinished_requests() and sched.chunked_req is None
    so = sched.schedule()
    sched.check_invariants()
    assert so.total_num_scheduled_tokens == 0
    # Nothing is held: every used page is only in the radix cache (evictable).
    assert sched.kv_cache_manager.available_and_evictable() == 1000


def test_a_step_in_flight_drops_the_output_of_an_aborted_request():
    sched = make_sched()
    sched.add_request(req("a", 10, max_tokens=50))
    sched.add_request(req("b", 10, max_tokens=50))
    so = sched.schedule()
    assert sched.finish_requests("a") == ["a"]
    ids = list(so.num_scheduled_tokens)
    eco = sched.update_from_output(so, ModelRunnerOutput(ids, {r: i for i, r in enumerate(ids)}, [[7]] * len(ids)))
    sched.check_invariants()
    assert [o.request_id for o in eco.outputs] == ["b"]
    assert sched.requests.keys() == {"b"}
