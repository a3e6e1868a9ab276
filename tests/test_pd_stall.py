"""The P/D schedulers' stall (simulator/cluster/pd_schedulers.py, StallGate): a schedule that ran
nothing with nothing running reports no unfinished work until an outside event (a new request, a
landed transfer, a finished send) opens the gate; each of the four classes, by hand."""

from __future__ import annotations

import pytest

from servesim.scheduler.request import RequestStatus
from servesim.simulator.cluster import sim_config_from_dict
from servesim.simulator.cluster.pd_connectors import RemoteDecodeConnector, RemotePrefillConnector
from servesim.simulator.cluster.pd_schedulers import (
    DecodeAsyncScheduler, DecodeScheduler, PrefillAsyncScheduler, PrefillScheduler, decode_scheduler,
    prefill_scheduler,
)
from servesim.simulator.startup import resolve_cache
from tests.sched_helpers import req, step


def _cfg(async_: bool):
    # 20 blocks of 16 tokens (one is vLLM's null block): two 100-token prompts (7 blocks each) fit, a third does not
    return sim_config_from_dict({"scheduler.async_scheduling": async_, "cache.num_gpu_blocks": 20,
                                 "scheduler.max_model_len": 256})


@pytest.mark.parametrize("async_", [False, True], ids=["sync", "async"])
def test_prefill_side_stalls_on_unsent_kv_until_a_send_finishes(async_):
    cfg = _cfg(async_)
    sched = prefill_scheduler(cfg, resolve_cache(cfg)[0], RemoteDecodeConnector())
    assert type(sched) is (PrefillAsyncScheduler if async_ else PrefillScheduler)
    assert sched.capabilities.decode_runs is None  # prefill steps never macro-step
    for rid in ("a", "b", "c"):
        sched.add_request(req(sched, rid, 100, max_tokens=1))  # prefill plus the first token
    step(sched)  # a and b run and finish by length; c finds no blocks
    assert {r: sched.requests[r].status for r in ("a", "b")} == {"a": RequestStatus.FINISHED_LENGTH_CAPPED,
                                                                  "b": RequestStatus.FINISHED_LENGTH_CAPPED}
    assert sched.get_num_free_blocks() == 19 - 14 and not sched.stalled  # their KV stays until read
    out = sched.schedule()  # nothing fits, nothing runs: the same until an outside event
    assert out.total_num_scheduled_tokens == 0 and sched.stalled
    assert sched.get_num_unfinished_requests() == 1 and not sched.has_unfinished_requests()
    sched.finish_sending("c")  # not finished: no send to report, still stalled
    assert sched.stalled and sched.requests["c"].status == RequestStatus.WAITING
    sched.finish_sending("a")  # a's KV was read: its blocks are freed, the gate opens
    assert not sched.stalled and sched.has_unfinished_requests() and "a" not in sched.requests
    assert sched.get_num_free_blocks() == 19 - 7
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"c": 100} and not sched.stalled


@pytest.mark.parametrize("async_", [False, True], ids=["sync", "async"])
def test_decode_side_stalls_while_every_request_waits_for_its_kv(async_):
    cfg = _cfg(async_)
    started: list[tuple[str, int]] = []
    conn = RemotePrefillConnector(lambda r, n: started.append((r.request_id, n)))
    sched = decode_scheduler(cfg, resolve_cache(cfg)[0], conn)
    assert type(sched) is (DecodeAsyncScheduler if async_ else DecodeScheduler)
    assert sched.capabilities.decode_runs == "pd_decode"
    conn.expect("p")
    sched.add_request(req(sched, "p", 100, max_tokens=4))
    out = sched.schedule()  # blocks reserved, the transfer started, the request parked
    assert started == [("p", 100)] and out.total_num_scheduled_tokens == 0
    assert sched.requests["p"].status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert sched.stalled and not sched.has_unfinished_requests() and sched.get_num_unfinished_requests() == 1
    sched.add_request(req(sched, "q", 20, max_tokens=2))  # a new request opens the gate
    assert not sched.stalled and sched.has_unfinished_requests()
    step(sched)  # q prefills here (not expected from a prefill side: no transfer)
    assert started == [("p", 100)] and not sched.stalled
    while sched.requests.get("q") is not None:
        step(sched)
    sched.schedule()  # only p, parked: stalled again
    assert sched.stalled and not sched.has_unfinished_requests()
    sched.mark_kv_received("p")  # the transfer landed
    assert not sched.stalled and sched.has_unfinished_requests()
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"p": 1}  # the last prompt token is recomputed to sample
