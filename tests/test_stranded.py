"""One request never stops the whole run: a request the scheduler can never admit (the stranded
head, SchedulerInterface.stranded_request) is aborted with its reason and the run goes on
(liveness.stranded_requests "abort", the default), or waited on as vLLM 0.19.1 does ("wait": the
watchdog stops the run and names it). Reject reasons come from the rule that failed."""

from __future__ import annotations

import math

import pytest

from servesim.api import run
from servesim.overrides import apply_overrides
from servesim.scheduler import CacheConfig, Request, SamplingParams, SchedulerConfig, make_scheduler
from servesim.scheduler.interface import STRANDED_REASONS, StrandedRequest
from servesim.scheduler.sglang import SGLangConfig, SGLangScheduler
from servesim.simulator.config import SimConfig
from servesim.simulator.engine import Engine
from servesim.simulator.liveness import REJECT_REASONS, Admission, StallError
from servesim.traces.errors import InputError
from servesim.traces.workload import RequestSpec, Workload

# The fuzzer's finding (tests/fuzz_driver.py --seed 90210), shrunk to two requests: a hybrid
# (full + sliding-window) model, the priority policy, full-ISL admission. q10 is preempted after 6
# output tokens; to come back it must recompute 39 tokens, counted in both groups: 78 blocks > 77.
HYBRID = {"scheduler.policy": "priority", "scheduler.max_num_seqs": 5, "scheduler.max_num_batched_tokens": 7,
          "scheduler.max_model_len": 42, "cache.block_size": 1, "cache.num_gpu_blocks": 78,
          "cache.attention": "hybrid", "cache.sliding_window": 21}


def _wl(*specs) -> Workload:
    return Workload([RequestSpec(*s) for s in specs], "t", "t")


def _hybrid_wl(*extra) -> Workload:
    return _wl(("q9", 0.195, 4, 13), ("q10", 0.195, 33, 9), *extra)


def test_stranded_hybrid_request_is_aborted_and_the_run_finishes(caplog):
    res = run(apply_overrides(SimConfig(), HYBRID), _hybrid_wl(("q11", 0.5, 10, 5), ("q12", 0.5, 30, 3)))
    rows = res.requests.set_index("request_id")
    assert rows.loc["q10", "status"] == "aborted" and rows.loc["q10", "reject_reason"] == "stranded_kv_pool"
    assert rows.loc["q10", "finish_reason"] == "abort" and rows.loc["q10", "output_len"] == 6  # what it streamed
    assert rows.loc["q10", "num_preemptions"] == 1 and math.isnan(rows.loc["q10", "e2e_s"])
    assert list(rows["status"]) == ["completed", "aborted", "completed", "completed"]
    s = res.summary
    assert (s["num_completed"], s["num_aborted"], s["num_rejected"]) == (3, 1, 0)
    assert s["aborted_by_reason"] == {"stranded_kv_pool": 1}
    assert s["e2e_s"]["count"] == 3 and s["bench_serve"]["failed"] == 1
    assert ("request q10 aborted (stranded_kv_pool): it can never be admitted: 78 KV blocks to admit its 39 tokens "
            "(full-ISL check, every group), the whole pool has 77") in caplog.text


def test_wait_keeps_vllms_stall_and_the_diagnosis_names_the_stranded_request():
    cfg = apply_overrides(SimConfig(), {**HYBRID, "liveness.stranded_requests": "wait"})
    with pytest.raises(StallError) as e:
        Engine(cfg, _hybrid_wl()).run()
    msg = str(e.value)
    assert "q10 (PREEMPTED, 0/39 tokens computed, 6 output, preempted 1x)" in msg
    assert "q10 can never be admitted (kv_pool: 78 KV blocks" in msg and "as in vLLM 0.19.1" in msg


def test_stranded_requests_setting_is_validated():
    with pytest.raises(InputError) as e:
        apply_overrides(SimConfig(), {"liveness.stranded_requests": "stall"})
    assert e.value.field == "liveness.stranded_requests" and "'abort' or 'wait'" in str(e.value)


def test_the_stranded_abort_is_the_same_with_async_scheduling_and_in_fcfs_order_there_is_none():
    asyn = run(apply_overrides(SimConfig(), {**HYBRID, "scheduler.async_scheduling": True}), _hybrid_wl())
    assert asyn.requests.set_index("request_id").loc["q10", "reject_reason"] == "stranded_kv_pool"
    fcfs = run(apply_overrides(SimConfig(), {**HYBRID, "scheduler.policy": "fcfs"}), _hybrid_wl())
    assert fcfs.summary["num_completed"] == 2 and fcfs.summary["num_aborted"] == 0  # no preemption there


# --- the contract, on hand-built schedulers ---------------------------------------------------------
def _sched(num_blocks: int, **sched_kw):
    sc = SchedulerConfig(**{"max_num_seqs": 4, "max_num_batched_tokens": 64, "max_model_len": 64, **sched_kw})
    return make_scheduler(sc, CacheConfig(block_size=4, num_gpu_blocks=num_blocks, enable_prefix_caching=False))


def test_contract_members_and_reasons():
    assert STRANDED_REASONS == ("kv_pool", "token_budget")
    sg = _sglang(4000)
    sg.add_request(Request("a", list(range(10)), SamplingParams(max_tokens=4)))
    assert sg.stranded_request() is None  # SGLang refuses or aborts such requests itself


def test_no_stranded_head_while_the_pool_is_held_or_nothing_waits():
    s = _sched(num_blocks=9)  # 8 usable blocks of 4 tokens
    assert s.stranded_request() is None  # nothing waits
    s.add_request(Request("a", list(range(20)), SamplingParams(max_tokens=4)))
    assert s.stranded_request() is None  # 5 blocks fit the empty pool
    s.schedule()
    s.add_request(Request("b", list(range(100, 125)), SamplingParams(max_tokens=4)))
    assert s.stranded_request() is None  # a runs: it holds KV and will free it


def test_a_head_the_empty_pool_cannot_hold_is_stranded():
    s = _sched(num_blocks=9)
    req = Request("a", list(range(20)), SamplingParams(max_tokens=30))
    s.add_request(req)
    req.append_output_token_ids(list(range(13)))  # as if it ran and was preempted: 33 tokens to recompute
    got = s.stranded_request()
    assert got == StrandedRequest("a", "kv_pool", "9 KV blocks to admit its 33 tokens (full-ISL check, every "
                                               "group), the whole pool has 8")
    assert s.get_num_free_blocks() == 8 and s.stranded_request() == got  # asking changes nothing


def test_without_full_isl_the_first_chunk_decides():
    s = _sched(num_blocks=9, scheduler_reserve_full_isl=False, max_num_batched_tokens=16)
    req = Request("a", list(range(20)), SamplingParams(max_tokens=30))
    s.add_request(req)
    req.append_output_token_ids(list(range(13)))
    assert s.stranded_request() is None  # a first chunk of 16 tokens fits: chunks go on as blocks free up


def test_token_budget_reason_with_chunked_prefill_off():
    s = _sched(num_blocks=40, enable_chunked_prefill=False)
    req = Request("a", list(range(60)), SamplingParams(max_tokens=4))
    s.add_request(req)
    req.append_output_token_ids([1, 2, 3, 4, 5])  # 65 tokens to recompute in one step of 64
    assert s.stranded_request() == StrandedRequest(
        "a", "token_budget", "65 tokens to compute in one step (chunked prefill off), the step budget is 64")


# --- reject reasons: each from the rule that failed ---------------------------------------------------
def test_every_reject_reason_from_its_own_rule():
    adm = Admission(max_model_len=64, block_size=16, usable_blocks=3, extra_slots=0)
    got = {adm.reject_reason(65, 1), adm.reject_reason(64, 1), adm.reject_reason(60, 5), adm.reject_reason(40, 10)}
    assert got == set(REJECT_REASONS)


def test_a_pool_bound_scheduler_refusal_is_exceeds_kv_pool_not_no_room_to_generate():
    """The mislabel reproducer: a hybrid prompt of 39 tokens (max_model_len 42) passes admission but the
    scheduler refuses it (39 + 39 blocks > 77): the reason is the pool."""
    res = run(apply_overrides(SimConfig(), HYBRID), _wl(("a", 0.0, 39, 2), ("b", 0.0, 5, 2)))
    rows = res.requests.set_index("request_id")
    assert rows.loc["a", "status"] == "rejected" and rows.loc["a", "reject_reason"] == "exceeds_kv_pool"
    assert rows.loc["b", "status"] == "completed"


def test_the_scheduler_names_its_refusals():
    s = _sched(num_blocks=9)
    s.add_request(Request("big", list(range(40)), SamplingParams(max_tokens=1)))  # 10 blocks > 8
    s.add_request(Request("long", list(range(70)), SamplingParams(max_tokens=1)))  # > max_model_len
    assert [(o.request_id, o.reject_reason) for o in s.take_ignored_outputs()] == [
        ("big", "exceeds_kv_pool"), ("long", "prompt_exceeds_max_model_len")]


def _sglang(max_total_tokens: int) -> SGLangScheduler:
    cfg = SGLangConfig(max_running_requests=4, chunked_prefill_size=16, enable_chunked_prefill=True, page_size=4,
                       max_total_tokens=max_total_tokens, enable_radix_cache=False, overlap_schedule=False, seed=1)
    return SGLangScheduler(cfg, max_model_len=64)


@pytest.mark.parametrize("max_total_tokens,prompt,reason", [
    (4000, 60, "no_room_to_generate"),  # the context (64 - 1, less SGLang's margin of 5) is the bound
    (60, 55, "exceeds_kv_pool"),  # max_req_len comes from the pool (59): 55 >= 59 - 5
    (60, 53, "exceeds_kv_pool"),  # within max_req_len, but its 56 paged tokens leave no page to decode into
])
def test_sglang_refusal_reasons(max_total_tokens, prompt, reason):
    s = _sglang(max_total_tokens)
    s.add_request(Request("a", list(range(prompt)), SamplingParams(max_tokens=4)))
    assert [(o.request_id, o.reject_reason) for o in s.take_ignored_outputs()] == [("a", reason)]


# --- prompt + output_len beyond max_model_len: vLLM's API server answers 400 ---------------------------
def test_output_len_beyond_the_context_is_rejected_and_counted_as_a_failure():
    cfg = apply_overrides(SimConfig(), {"scheduler.max_model_len": 2048})
    res = run(cfg, _wl(("huge", 0.0, 100, 100_000_000), ("edge", 0.0, 100, 1948), ("ok", 0.0, 100, 10)))
    rows = res.requests.set_index("request_id")
    assert rows.loc["huge", "status"] == "rejected" and rows.loc["huge", "reject_reason"] == "exceeds_max_model_len"
    assert rows.loc["edge", "status"] == "completed" and rows.loc["edge", "output_len"] == 1948  # exactly fits
    assert res.summary["bench_serve"]["failed"] == 1
    assert res.summary["num_completed"] == 2
