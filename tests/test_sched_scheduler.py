"""Scheduler behaviours documented for vLLM V1, with requests and outputs built by hand."""

from __future__ import annotations

import pytest

from servesim.scheduler import ModelRunnerOutput, RequestStatus
from sched_helpers import make_sched, req, step


def test_chunked_prefill_shares_one_token_budget():
    s = make_sched(max_num_batched_tokens=16, block_size=4)
    s.add_request(req(s, "a", 10))
    s.add_request(req(s, "b", 10))
    out, _ = step(s)
    assert out.num_scheduled_tokens == {"a": 10, "b": 6}  # b gets the rest of the budget
    assert s.requests["b"].is_prefill_chunk and not s.requests["a"].is_prefill_chunk
    out, _ = step(s)
    # Running requests first: a decodes one token, b finishes its prompt.
    assert out.num_scheduled_tokens == {"a": 1, "b": 4}


def test_long_prefill_threshold_caps_each_request():
    s = make_sched(max_num_batched_tokens=64, long_prefill_token_threshold=8)
    s.add_request(req(s, "a", 20))
    s.add_request(req(s, "b", 20))
    out, _ = step(s)
    assert out.num_scheduled_tokens == {"a": 8, "b": 8}


def test_chunked_prefill_off_stops_at_first_prompt_over_budget():
    s = make_sched(max_num_batched_tokens=256, max_model_len=256, enable_chunked_prefill=False)
    s.add_request(req(s, "a", 200))
    s.add_request(req(s, "b", 100))
    out, _ = step(s)
    assert out.num_scheduled_tokens == {"a": 200}  # b (100) no longer fits in the 56 left


def test_prefix_hit_and_new_request_data():
    s = make_sched(block_size=4)
    s.add_request(req(s, "a", list(range(10))))
    step(s)
    s.add_request(req(s, "b", list(range(9)) + [77, 78]))
    out, _ = step(s)
    new = {n.req_id: n for n in out.scheduled_new_reqs}
    assert new["b"].num_computed_tokens == 8  # two full blocks shared with a
    assert out.num_scheduled_tokens["b"] == 3
    assert new["b"].block_ids[0][:2] == s.kv_cache_manager.get_block_ids("a")[0][:2]
    assert s.requests["b"].num_cached_tokens == 8


def test_fcfs_preempts_tail_and_resumes_with_recompute():
    # 8 usable blocks of 4 tokens; two requests of 12 tokens that each grow.
    s = make_sched(num_blocks=9, block_size=4, max_num_batched_tokens=64, scheduler_reserve_full_isl=False,
                   enable_prefix_caching=False)
    s.add_request(req(s, "a", 12, max_tokens=20))
    s.add_request(req(s, "b", 15, max_tokens=20))
    step(s)  # a: 3 blocks, b: 4 blocks -> 1 free
    preempted_at = None
    for i in range(12):
        out, _ = step(s)
        if out.preempted_req_ids:
            preempted_at = i
            break
    assert out.preempted_req_ids == {"b"}  # FCFS pops the tail of running
    b = s.requests["b"]
    assert b.status == RequestStatus.PREEMPTED and b.num_computed_tokens == 0 and b.num_preemptions == 1
    assert preempted_at is not None
    assert not out.scheduled_new_reqs and not out.scheduled_cached_reqs.resumed_req_ids  # no admission
    while b.status != RequestStatus.RUNNING:
        out, _ = step(s)
    cached = out.scheduled_cached_reqs
    assert "b" in cached.resumed_req_ids
    # Prompt and earlier outputs are all recomputed in one go; then one new token is sampled.
    assert out.num_scheduled_tokens["b"] == b.num_computed_tokens == b.num_tokens - 1
    assert b.num_output_tokens >= 2
    assert "b" in cached.all_token_ids  # not scheduled in the previous step: full token ids sent
    sent = cached.all_token_ids["b"]
    # a copy, as vLLM's .copy(): the ids at the schedule (this step's output appended one since)
    assert list(sent) == list(b.all_token_ids)[:-1] and sent is not b.all_token_ids
    assert type(sent) is type(b.all_token_ids)  # in the request's compact form (bytes copied, not boxed ints)


def test_priority_preempts_lowest_priority_and_rolls_back():
    s = make_sched(num_blocks=9, block_size=4, policy="priority", scheduler_reserve_full_isl=False,
                   enable_prefix_caching=False)
    s.add_request(req(s, "low", 12, max_tokens=30, priority=5, arrival_time=0.0))
    s.add_request(req(s, "high", 15, max_tokens=30, priority=0, arrival_time=1.0))
    out, _ = step(s)
    assert list(out.num_scheduled_tokens) == ["high", "low"]  # heap order: priority first
    for _ in range(12):
        out, _ = step(s)
        if out.preempted_req_ids:
            break
    assert out.preempted_req_ids == {"low"}
    assert "low" not in out.num_scheduled_tokens  # its tokens this step were rolled back
    assert s.requests["high"].status == RequestStatus.RUNNING


def test_priority_queue_order_priority_then_arrival_then_id():
    s = make_sched(policy="priority", max_num_seqs=1)
    s.add_request(req(s, "c", 4, priority=1, arrival_time=0.0))
    s.add_request(req(s, "b", 4, priority=0, arrival_time=2.0))
    s.add_request(req(s, "a", 4, priority=0, arrival_time=2.0))
    s.add_request(req(s, "d", 4, priority=0, arrival_time=1.0))
    assert [r.request_id for r in s.waiting] == ["d", "a", "b", "c"]


@pytest.mark.parametrize("kw,expected_status,n_out", [
    ({"max_tokens": 3}, RequestStatus.FINISHED_LENGTH_CAPPED, 3),
    ({"max_tokens": 10, "eos_token_id": 7}, RequestStatus.FINISHED_STOPPED, 1),
    ({"max_tokens": 10, "eos_token_id": 7, "ignore_eos": True}, RequestStatus.FINISHED_LENGTH_CAPPED, 10),
    ({"max_tokens": 10, "eos_token_id": 7, "min_tokens": 4}, RequestStatus.FINISHED_STOPPED, 4),
    ({"max_tokens": 10, "stop_token_ids": (7,)}, RequestStatus.FINISHED_STOPPED, 1),
])
def test_stop_rules(kw, expected_status, n_out):
    s = make_sched()
    r = req(s, "a", 5, **kw)
    s.add_request(r)
    for _ in range(20):
        step(s, default=7)
        if r.is_finished():
            break
    assert r.status == expected_status and r.num_output_tokens == n_out
    if kw.get("stop_token_ids"):
        assert r.stop_reason == 7


def test_max_model_len_stops_request():
    s = make_sched(max_model_len=8)
    r = req(s, "a", 6, max_tokens=100)
    s.add_request(r)
    for _ in range(5):
        step(s)
    assert r.status == RequestStatus.FINISHED_LENGTH_CAPPED and r.num_tokens == 8


def test_prompt_that_can_never_fit_is_ignored():
    s = make_sched(num_blocks=5, block_size=4)  # 16 token slots
    s.add_request(req(s, "huge", 40))
    s.add_request(req(s, "toolong", 300))  # > max_model_len
    s.add_request(req(s, "ok", 4))
    assert not any(r in s.requests for r in ("huge", "toolong"))
    out, eco = step(s)
    assert {o.request_id: o.finish_reason for o in eco.outputs if o.request_id != "ok"} == {
        "huge": "length", "toolong": "length"}
    assert "ok" in out.num_scheduled_tokens


def test_abort_frees_blocks_and_reports_finished_ids():
    s = make_sched()
    s.add_request(req(s, "a", 10))
    s.add_request(req(s, "b", 10))
    step(s)
    free = s.kv_cache_manager.block_pool.get_num_free_blocks()
    assert s.finish_requests("a") == ["a"]
    assert s.finish_requests("a") == []  # already finished
    assert s.kv_cache_manager.block_pool.get_num_free_blocks() == free + 3
    out = s.schedule()
    assert out.finished_req_ids == {"a"}
    s.check_invariants()


def test_spec_decode_rejection_clawback():
    s = make_sched(num_spec_tokens=3)
    r = req(s, "a", 8, max_tokens=50)
    s.add_request(r)
    step(s)
    s.update_draft_token_ids({"a": [11, 12, 13]})
    out = s.schedule()
    assert out.num_scheduled_tokens["a"] == 4 and out.scheduled_spec_decode_tokens["a"] == [11, 12, 13]
    computed_before_update = r.num_computed_tokens
    # Accept one draft: the model returns the accepted draft plus a bonus token.
    eco = s.update_from_output(out, ModelRunnerOutput(["a"], {"a": 0}, [[11, 20]]))
    assert r.num_computed_tokens == computed_before_update - 2  # two rejected drafts clawed back
    assert r.output_token_ids[-2:] == [11, 20]
    spec = eco.scheduler_stats.spec_decoding_stats
    assert (spec.num_drafts, spec.num_draft_tokens, spec.num_accepted_tokens) == (1, 3, 1)
    assert spec.num_accepted_tokens_per_pos == [1, 0, 0]
    s.check_invariants()


def test_lora_budget_skips_extra_adapters():
    s = make_sched(max_loras=1)
    s.add_request(req(s, "a", 4, lora_id=1))
    s.add_request(req(s, "b", 4, lora_id=2))
    s.add_request(req(s, "c", 4, lora_id=1))
    out, _ = step(s)
    assert set(out.num_scheduled_tokens) == {"a", "c"}
    assert [r.request_id for r in s.skipped_waiting] == ["b"]


def test_max_num_seqs_limits_admission():
    s = make_sched(max_num_seqs=2)
    for i in range(3):
        s.add_request(req(s, f"r{i}", 4))
    out, _ = step(s)
    assert list(out.num_scheduled_tokens) == ["r0", "r1"]


def test_cached_request_data_sends_all_tokens_only_when_not_scheduled_before():
    s = make_sched(max_num_batched_tokens=8)
    s.add_request(req(s, "a", 6))
    s.add_request(req(s, "b", 6))
    out, _ = step(s)
    out, _ = step(s)
    cached = out.scheduled_cached_reqs
    assert cached.all_token_ids == {}  # both scheduled in the previous step
    assert cached.num_output_tokens[cached.req_ids.index("a")] == 1


def test_async_scheduler_placeholders_and_skip_ahead():
    s = make_sched(async_scheduling=True)
    r = req(s, "a", 5, max_tokens=2)
    one = req(s, "one", 5, max_tokens=1)
    s.add_request(r)
    s.add_request(one)
    out1 = s.schedule()
    assert r.num_output_placeholders == 1 and r.num_computed_tokens == 5
    out2 = s.schedule()  # scheduled before out1's tokens are known
    # "one" is skipped ahead: the in-flight step already yields its only token. "a" is not: vLLM
    # skips only when sure even if every draft were rejected (one step conservative).
    assert out2.num_scheduled_tokens == {"a": 1} and r.num_output_placeholders == 2
    s.update_from_output(out1, ModelRunnerOutput(["a", "one"], {"a": 0, "one": 1}, [[5], [9]]))
    assert one.status == RequestStatus.FINISHED_LENGTH_CAPPED
    eco = s.update_from_output(out2, ModelRunnerOutput(["a"], {"a": 0}, [[6]]))
    assert r.status == RequestStatus.FINISHED_LENGTH_CAPPED and r.output_token_ids == [5, 6]
    assert eco.finished_req_ids == ["a"] and r.num_output_placeholders == 0
    s.check_invariants()


def test_num_common_prefix_blocks():
    s = make_sched(block_size=4)
    shared = list(range(8))
    s.add_request(req(s, "a", shared + [50, 51]))
    step(s)
    s.add_request(req(s, "b", shared + [60, 61]))
    out, _ = step(s)
    assert out.num_common_prefix_blocks == [2]
