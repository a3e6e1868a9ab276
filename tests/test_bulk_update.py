"""A step's update applied in bulk (DecodeRuns.update_sampled_step, RunApplier.apply_update): the
scheduler's state and statistics equal update_from_output's, a declined update changes nothing, and
whole replays with the planner (which applies every update it proves simple in bulk) are
byte-identical to plain stepping."""

from __future__ import annotations

import pytest

from servesim.scheduler import ModelRunnerOutput
from servesim.scheduler.bulk import decode_runs_for
from sched_helpers import make_sched, req  # tests/sched_helpers.py
from test_cluster_macro_steps import _workload  # poisson arrivals, ~300-token prompts, ~60-token outputs
from test_macro_steps import _pair  # a config with and without macro-steps: outputs compared


def _state(sched) -> tuple:
    """Everything an update may change, per request and for the KV pool."""
    kv = sched.kv_cache_manager
    per_request = tuple(
        (r.request_id, r.status, r.num_tokens, list(r.output_token_ids), r.num_computed_tokens,
         r.num_output_placeholders, len(r.block_hashes), tuple(map(tuple, kv.get_block_ids(r.request_id))))
        for r in sched.requests.values())
    pool = kv.block_pool
    return per_request, pool.get_num_free_blocks(), pool.get_num_cached_blocks(), sched.now_s


def _stats(stats) -> tuple:
    ps = stats.prefix_cache_stats
    return (stats.num_running_reqs, stats.num_waiting_reqs, stats.kv_cache_usage,
            (ps.requests, ps.queries, ps.hits, ps.preempted_requests, ps.reset))


def _twin_schedulers(async_scheduling: bool, num_requests: int, max_tokens: int, **kw):
    """Two schedulers brought to the same state: requests admitted and decoded a few steps (the
    async loop keeps one step in flight). Returns both and each one's in-flight step."""
    out = []
    for _ in range(2):
        sched = make_sched(num_blocks=200, block_size=4, async_scheduling=async_scheduling)
        for i in range(num_requests):
            sched.add_request(req(sched, f"r{i}", 9 + 3 * i, max_tokens=max_tokens, **kw))
        in_flight = []
        for _step in range(5):
            so = sched.schedule()
            ids = list(so.num_scheduled_tokens)
            mro = ModelRunnerOutput(ids, {r: i for i, r in enumerate(ids)},
                                    [[] if sched.requests[r].num_computed_tokens < sched.requests[r].num_tokens
                                      else [100 + i] for i, r in enumerate(ids)])
            in_flight.append((so, mro))
            if len(in_flight) == (2 if async_scheduling else 1):
                sched.update_from_output(*in_flight.pop(0))
        sched.check_invariants()
        out.append((sched, in_flight[0] if in_flight else None))
    return out


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_bulk_update_equals_update_from_output(async_scheduling):
    (ref, ref_step), (bulk, bulk_step) = _twin_schedulers(async_scheduling, 6, max_tokens=50)
    if ref_step is None:  # sync: schedule the next step now, on both
        ref_step = (ref.schedule(), None)
        bulk_step = (bulk.schedule(), None)
        ids = list(ref_step[0].num_scheduled_tokens)
        mro = ModelRunnerOutput(ids, {r: i for i, r in enumerate(ids)}, [[200 + i] for i in range(len(ids))])
        ref_step, bulk_step = (ref_step[0], mro), (bulk_step[0], mro)
    assert _state(ref) == _state(bulk)
    eco = ref.update_from_output(*ref_step, now_s=3.5)
    update = decode_runs_for(bulk).update_sampled_step(*bulk_step, now_s=3.5)
    assert update is not None
    assert update.req_ids == [o.request_id for o in eco.outputs] and len(update.req_ids) == 6
    assert _state(ref) == _state(bulk)
    assert _stats(eco.scheduler_stats) == _stats(update.stats)
    bulk.check_invariants()


@pytest.mark.parametrize("kw,max_tokens", [
    ({}, 5),  # someone's token reaches max_tokens: the update finishes it
    ({"eos_token_id": 2, "ignore_eos": False}, 50),  # an EOS rule: the token is read
    ({"stop_token_ids": (5,)}, 50),
])
def test_bulk_update_declines_what_could_stop_and_changes_nothing(kw, max_tokens):
    (sched, step), _ = _twin_schedulers(True, 4, max_tokens=max_tokens, **kw)
    before = _state(sched)
    assert decode_runs_for(sched).update_sampled_step(*step, now_s=9.0) is None
    assert _state(sched) == before


@pytest.mark.parametrize("rate,sets", [
    (12.0, {}),
    (12.0, {"scheduler.async_scheduling": False}),
    (60.0, {"cache.num_gpu_blocks": 300, "scheduler.max_model_len": 4096}),  # preemptions, a queue
])
def test_replays_with_bulk_updates_are_identical_to_stepping(rate, sets):
    """Requests, step rows and prefix totals of a replay equal plain stepping's (_pair)."""
    wl = _workload(200, rate, seed=17)
    _plain, _macro, eng = _pair(sets, wl)
    # most stepped updates are simple (an admitting step's, a run's last step's)
    assert eng.planner.num_bulk_updates > len(wl.requests) // 2
