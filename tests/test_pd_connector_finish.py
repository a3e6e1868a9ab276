"""A P/D scheduler asks its connector whether a finished request's blocks stay (vLLM's delayed
free) from whether it holds a block at all (pd_schedulers.connector_finished, delays_free), not
from its block table: the same answer request_finished gives with the table, for every status and
both sides, with and without blocks."""

from __future__ import annotations

import pytest

from servesim.scheduler.request import RequestStatus
from servesim.simulator.cluster import sim_config_from_dict
from servesim.simulator.cluster.pd_connectors import RemoteDecodeConnector, RemotePrefillConnector
from servesim.simulator.cluster.pd_schedulers import decode_scheduler, prefill_scheduler
from servesim.simulator.startup import resolve_cache
from tests.sched_helpers import req, step


@pytest.mark.parametrize("side", ["prefill", "decode"])
@pytest.mark.parametrize("status", [RequestStatus.FINISHED_LENGTH_CAPPED, RequestStatus.FINISHED_ABORTED,
                                    RequestStatus.FINISHED_STOPPED])
@pytest.mark.parametrize("scheduled", [True, False], ids=["holds-blocks", "no-blocks"])
def test_delays_free_answers_as_request_finished(side, status, scheduled):
    cfg = sim_config_from_dict({"scheduler.async_scheduling": False})
    cache = resolve_cache(cfg)[0]
    if side == "prefill":
        conn = RemoteDecodeConnector()
        sched = prefill_scheduler(cfg, cache, conn)
    else:
        conn = RemotePrefillConnector(lambda r, n: None)
        sched = decode_scheduler(cfg, cache, conn)
    r = req(sched, "a", 100, max_tokens=5)
    sched.add_request(r)
    if scheduled:
        step(sched)  # its prompt's blocks allocated
    r.status = status
    table = sched.kv_cache_manager.get_block_ids("a")
    assert any(table) == scheduled
    expected, _ = conn.request_finished(r, table)
    assert sched._connector_finished(r) == expected
    assert expected == (side == "prefill" and scheduled and status == RequestStatus.FINISHED_LENGTH_CAPPED)
