"""Liveness and admission: the known hangs (issue 13's reproducers r1..r6) as tests, start-up
refusals with vLLM's reasons, rejected requests reported loudly, and the watchdog's diagnosis."""

from __future__ import annotations

import math

import pytest

from servesim.scheduler import CacheConfig, ModelRunnerOutput, Request, SamplingParams, SchedulerConfig, make_scheduler
from servesim.scheduler.sglang import SGLangConfig, SGLangScheduler
from servesim.api import run
from servesim.overrides import apply_overrides
from servesim.simulator.config import SimConfig
from servesim.simulator.engine import Engine
from servesim.simulator.liveness import Admission, StallError
from servesim.simulator.summary import rejection_warning
from servesim.traces.errors import InputError
from servesim.traces.workload import RequestSpec, Workload

SMALL = {"scheduler.max_model_len": 64, "scheduler.max_num_batched_tokens": 16, "scheduler.max_num_seqs": 4}


def _wl(*specs) -> Workload:
    return Workload([RequestSpec(*s) for s in specs], "t", "t")


def _sync_step(s, check: bool = True):
    so = s.schedule()
    if check:
        s.check_invariants()
    ids = list(so.num_scheduled_tokens)
    sampled = [[] if s.requests[r].is_prefill_chunk else [7] for r in ids]
    s.update_from_output(so, ModelRunnerOutput(ids, {r: i for i, r in enumerate(ids)}, sampled))
    if check:
        s.check_invariants()
    return so


# --- r1: a prompt exactly max_model_len long ---------------------------------------------------------
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_r1_prompt_of_max_model_len_is_rejected_and_the_run_finishes(engine):
    cfg = apply_overrides(SimConfig(), {**SMALL, "engine": engine})
    res = run(cfg, _wl(("a", 0.0, 64, 4), ("b", 0.0, 65, 4), ("c", 0.0, 63, 4), ("d", 0.0, 63, 1)))
    rows = res.requests.set_index("request_id")
    assert rows.loc["a", "status"] == "rejected" and rows.loc["a", "reject_reason"] == "no_room_to_generate"
    assert rows.loc["b", "reject_reason"] == "prompt_exceeds_max_model_len"
    assert math.isnan(rows.loc["a", "e2e_s"]) and math.isnan(rows.loc["a", "ttft_s"])  # empty, never zero
    s = res.summary
    if engine == "sglang":  # SGLang's own input-length check keeps a margin of a few tokens
        assert rows.loc["c", "reject_reason"] == "no_room_to_generate"
        assert rows.loc["d", "reject_reason"] == "no_room_to_generate"
        assert (s["num_completed"], s["num_rejected"], s["e2e_s"]["count"]) == (0, 4, 0)
        return
    # 63 + 4 > 64: vLLM's API server answers 400 (prompt + max_tokens beyond the context)
    assert rows.loc["c", "status"] == "rejected" and rows.loc["c", "reject_reason"] == "exceeds_max_model_len"
    assert rows.loc["d", "status"] == "completed" and rows.loc["d", "output_len"] == 1  # 63 + 1 fits exactly
    assert (s["num_completed"], s["num_rejected"]) == (1, 3)
    assert s["rejected_by_reason"] == {"exceeds_max_model_len": 1, "no_room_to_generate": 1,
                                       "prompt_exceeds_max_model_len": 1}
    assert s["e2e_s"]["count"] == 1  # rejected requests stay out of percentiles
    assert s["bench_serve"]["failed"] == 3  # counted as failures, as vllm bench serve counts a 400


def test_rejection_warning_names_count_reasons_and_first_ids():
    res = run(apply_overrides(SimConfig(), SMALL), _wl(("a", 0.0, 64, 4), ("c", 0.0, 10, 4)))
    msg = rejection_warning(res.requests)
    assert "1 of 2 requests were rejected" in msg and "no_room_to_generate: 1" in msg and "first ids: a" in msg


# --- r2: a KV pool smaller than one request -------------------------------------------------------
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_r2_pool_smaller_than_max_model_len_is_refused_at_start_up(engine):
    with pytest.raises(InputError) as e:
        apply_overrides(SimConfig(), {"engine": engine, "cache.num_gpu_blocks": 5, "cache.block_size": 16})
    assert e.value.field == "cache.num_gpu_blocks"
    assert "To serve at least one request with the model's max seq len (131072)" in str(e.value)
    assert "estimated maximum model length is 80" in str(e.value)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_r2_request_larger_than_the_pool_is_rejected_not_hung(engine):
    # The pool passes vLLM's start-up check (5 blocks x 16 = 80 tokens) but block 0 is the null
    # block: a request that needs all 5 can never be scheduled to the end.
    cfg = apply_overrides(SimConfig(), {"engine": engine, "cache.num_gpu_blocks": 5, "cache.block_size": 16,
                                        "scheduler.max_model_len": 80, "scheduler.max_num_batched_tokens": 16,
                                        "scheduler.max_num_seqs": 4})
    res = run(cfg, _wl(("big", 0.0, 32, 48), ("ok", 0.0, 20, 5), ("huge", 0.0, 70, 5)))
    rows = res.requests.set_index("request_id")
    assert rows.loc["ok", "status"] == "completed"
    if engine == "sglang":  # SGLang clamps max_new_tokens to what the pool holds; refuses what cannot fit
        assert rows.loc["big", "status"] == "completed" and 0 < rows.loc["big", "output_len"] < 48
        assert rows.loc["huge", "reject_reason"] == "exceeds_kv_pool"
    else:
        assert rows.loc["big", "reject_reason"] == "exceeds_kv_pool"
        assert rows.loc["huge", "reject_reason"] == "exceeds_kv_pool"


def test_admission_rules():
    adm = Admission(max_model_len=64, block_size=16, usable_blocks=3, extra_slots=0)
    assert adm.reject_reason(65, 1) == "prompt_exceeds_max_model_len"
    assert adm.reject_reason(64, 1) == "no_room_to_generate"
    assert adm.reject_reason(40, 10) == "exceeds_kv_pool"  # 49 KV slots (the last token has none) > 3 x 16
    assert adm.reject_reason(40, 9) is None  # 48 slots: exactly 3 blocks
    assert adm.reject_reason(10, 1000) == "exceeds_max_model_len"  # vLLM's API server: 400
    assert adm.reject_reason(10, 54) == "exceeds_kv_pool"  # 63 slots: 4 blocks > 3
    roomy = Admission(max_model_len=64, block_size=16, usable_blocks=4, extra_slots=0)
    assert roomy.reject_reason(10, 54) is None and roomy.reject_reason(10, 55) == "exceeds_max_model_len"
    sglang = Admission(max_model_len=64, block_size=16, usable_blocks=1, extra_slots=0, pool_rule=False)
    assert sglang.reject_reason(10, 1000) is None  # SGLang clamps max_new_tokens itself
    # a sliding-window layout whose window covers the whole request holds every block (fuzz finding)
    window = Admission.of(SchedulerConfig(max_num_seqs=6, max_num_batched_tokens=84, max_model_len=26,
                                          enable_chunked_prefill=False),
                          CacheConfig(block_size=2, num_gpu_blocks=13, sliding_window=33))
    assert window.reject_reason(21, 5) == "exceeds_kv_pool" and window.reject_reason(9, 5) is None
    hybrid = Admission(max_model_len=64, block_size=16, usable_blocks=5, extra_slots=0, window_blocks=2)
    assert hybrid.blocks_needed(48) == 3 + 2 and hybrid.reject_reason(40, 9) is None
    assert hybrid.reject_reason(40, 10) == "exceeds_kv_pool"


# --- r3: priority + tied arrivals + long-prefill threshold + reserve_full_isl off ---------------------
def _r3_sched(arrivals):
    s = make_scheduler(SchedulerConfig(max_num_seqs=3, max_num_batched_tokens=16, max_model_len=256, policy="priority",
                                       long_prefill_token_threshold=3, scheduler_reserve_full_isl=False),
                       CacheConfig(block_size=16, num_gpu_blocks=23, enable_prefix_caching=False))
    for i, (n, t) in enumerate(zip([226, 240, 142], arrivals)):
        s.add_request(Request(f"r{i}", [i * 1000 + k for k in range(n)], SamplingParams(max_tokens=8, ignore_eos=True),
                              arrival_time=t), now_s=t)
    return s


def test_r3b_scheduler_keeps_vllms_tie_rule():
    """vLLM's own behaviour, kept on purpose: with tied arrivals the three prompts preempt each
    other; with distinct arrivals they finish. The engine's watchdog handles the first case."""
    tied = _r3_sched([0.0, 0.0, 0.0])
    preemptions = sum(len(_sync_step(tied, check=False).preempted_req_ids) for _ in range(3000))
    assert tied.has_unfinished_requests() and preemptions > 20
    spread = _r3_sched([0.0, 0.1, 0.2])
    for _ in range(3000):
        _sync_step(spread)
        if not spread.has_unfinished_requests():
            break
    assert not spread.has_unfinished_requests()


def _r3_livelock(liveness: dict):
    """Reproducer r3's livelock (priority preemption with a 23-block pool) and its workload."""
    cfg = apply_overrides(SimConfig(), {
        "scheduler.policy": "priority", "cache.num_gpu_blocks": 23, "cache.block_size": 16,
        "cache.enable_prefix_caching": False, "scheduler.max_num_batched_tokens": 16, "scheduler.max_num_seqs": 3,
        "scheduler.max_model_len": 256, "scheduler.long_prefill_token_threshold": 3,
        "scheduler.scheduler_reserve_full_isl": False, **liveness})
    return cfg, _wl(*[(f"r{i}", 0.0, n, 8) for i, n in enumerate([226, 240, 142])])


def test_r3c_engine_watchdog_stops_the_livelock_with_a_diagnosis():
    cfg, wl = _r3_livelock({"liveness.max_steps_without_progress": 2000})
    with pytest.raises(StallError) as e:
        Engine(cfg, wl).run()
    msg = str(e.value)
    assert "no progress for 2001 steps" in msg and "r0 (" in msg and "r1 (" in msg
    assert "preemptions since the last progress" in msg and "liveness.max_steps_without_progress=2000" in msg


def test_watchdog_simulated_seconds_limit():
    cfg, wl = _r3_livelock({"liveness.max_sim_s_without_progress": 2.0})
    with pytest.raises(StallError, match=r"liveness.max_sim_s_without_progress=2"):
        Engine(cfg, wl).run()


def test_watchdog_limits_are_validated():
    for key, value in (("liveness.max_steps_without_progress", 0), ("liveness.max_sim_s_without_progress", 0.0)):
        with pytest.raises(InputError, match="liveness"):
            apply_overrides(SimConfig(), {key: value})


# --- r4: SGLang budget below one page ---------------------------------------------------------------
def test_r4_sglang_budget_below_page_is_refused():
    with pytest.raises(InputError) as e:  # issue 13's r4 config as it was (max_num_seqs 256: no vLLM rule here)
        apply_overrides(SimConfig(), {"engine": "sglang", "scheduler.max_num_batched_tokens": 8})
    assert e.value.field == "scheduler.max_num_batched_tokens" and "below one KV page (16 tokens)" in str(e.value)
    with pytest.raises(ValueError, match="chunked_prefill_size"):
        SGLangConfig(chunked_prefill_size=8, page_size=16, enable_chunked_prefill=True)


# --- r5: SGLang batch_is_full with nothing running ----------------------------------------------
def test_r5_sglang_priority_preemption_leaves_no_stale_batch_is_full():
    cfg = SGLangConfig(schedule_policy="fcfs", max_running_requests=1, chunked_prefill_size=2,
                       enable_chunked_prefill=True, page_size=2, max_total_tokens=78, enable_radix_cache=False,
                       overlap_schedule=False, seed=1, enable_mixed_chunk=True, enable_priority_scheduling=True,
                       priority_scheduling_preemption_threshold=1)
    s = SGLangScheduler(cfg, max_model_len=64)
    s.add_request(Request("low", [23], SamplingParams(max_tokens=2), priority=4))
    _sync_step(s)
    s.add_request(Request("high", [18], SamplingParams(max_tokens=1), priority=0))
    for _ in range(12):  # check_invariants() after every step: it used to fail at step 2
        _sync_step(s)
    assert not s.has_unfinished_requests()


# --- r6: min_tokens ---------------------------------------------------------------------------------
def test_r6_min_tokens_above_max_tokens_is_refused_like_vllm():
    with pytest.raises(ValueError, match="min_tokens must be less than or equal to max_tokens=1, got 5"):
        SamplingParams(max_tokens=1, min_tokens=5)


def test_r6_min_tokens_never_overrides_max_model_len():
    s = make_scheduler(SchedulerConfig(max_model_len=16, max_num_batched_tokens=64), CacheConfig(block_size=4,
                                                                                                 num_gpu_blocks=64))
    r = Request("a", list(range(12)), SamplingParams(max_tokens=100, min_tokens=10))
    s.add_request(r)
    for _ in range(50):
        _sync_step(s)
        if not s.has_unfinished_requests():
            break
    assert not s.has_unfinished_requests() and r.num_tokens == 16 and r.get_finished_reason() == "length"


# --- one validation path: --set, YAML, Python API -------------------------------------------------
@pytest.mark.parametrize("sets,field,allowed", [
    ({"cache.num_gpu_blocks": 100}, "cache.num_gpu_blocks", ">= 8192"),
    ({"cache.num_gpu_blocks": 10}, "cache.num_gpu_blocks", ">= 8192"),
    ({"scheduler.max_num_batched_tokens": 8}, "scheduler.max_num_batched_tokens", ">= 256"),
    ({"scheduler.max_model_len": 200_000}, "scheduler.max_model_len", "<= 131072"),
    ({"scheduler.enable_chunked_prefill": False, "scheduler.max_model_len": 4096}, "scheduler.max_num_batched_tokens",
     "4096"),
])
def test_start_up_refusals_name_the_field_and_what_is_allowed(sets, field, allowed):
    with pytest.raises(InputError) as e:
        apply_overrides(SimConfig(), sets)
    assert e.value.field == field and allowed in str(e.value)


def test_overrides_apply_at_once_so_key_order_does_not_matter():
    a = apply_overrides(SimConfig(), {"cache.num_gpu_blocks": 600, "scheduler.max_model_len": 8192})
    b = apply_overrides(SimConfig(), {"scheduler.max_model_len": 8192, "cache.num_gpu_blocks": 600})
    assert a == b and not a.derive_num_gpu_blocks


def test_python_api_validates_like_the_cli():
    from dataclasses import replace

    with pytest.raises(InputError, match="max_num_seqs"):
        SimConfig(scheduler=SchedulerConfig(max_num_seqs=256, max_num_batched_tokens=8, max_model_len=None))
    with pytest.raises(InputError, match="cache.num_gpu_blocks"):
        replace(SimConfig(), cache=CacheConfig(num_gpu_blocks=100), derive_num_gpu_blocks=False)


def test_default_max_model_len_comes_from_the_model():
    from servesim.simulator.startup import resolve_max_model_len

    assert SimConfig().scheduler.max_model_len is None
    assert resolve_max_model_len(SimConfig()) == 131072  # llama-3.1-8b's max_position_embeddings
    cfg = apply_overrides(SimConfig(), {"hardware.model": "llama-3-8b"})
    assert resolve_max_model_len(cfg) == 8192
    assert Engine(cfg, _wl(("a", 0.0, 10, 2))).cfg.scheduler.max_model_len == 8192


# --- clusters: each replica has the watchdog; rejections are merged and counted -----------------------
LIVELOCK = {"scheduler.policy": "priority", "cache.num_gpu_blocks": 23, "cache.block_size": 16,
            "cache.enable_prefix_caching": False, "scheduler.max_num_batched_tokens": 16, "scheduler.max_num_seqs": 3,
            "scheduler.max_model_len": 256, "scheduler.long_prefill_token_threshold": 3,
            "scheduler.scheduler_reserve_full_isl": False, "liveness.max_steps_without_progress": 2000}


def test_cluster_replica_watchdog_names_the_replica_and_requests():
    from servesim.simulator.cluster import ClusterConfig, ReplicaGroup, RouterConfig, run_cluster

    cfg = ClusterConfig(replicas=[ReplicaGroup(count=2, sim=apply_overrides(SimConfig(), LIVELOCK))],
                        router=RouterConfig("round_robin", {}))
    wl = _wl(*[(f"r{i}", 0.0, n, 8) for i, n in enumerate([226, 100, 240, 100, 142])])
    with pytest.raises(StallError, match=r"both0: no progress .* r0 \(") as e:
        run_cluster(cfg, wl)
    assert "liveness watchdog stopped the run" in str(e.value)


def test_cluster_counts_rejections():
    from servesim.simulator.cluster import ClusterConfig, ReplicaGroup, RouterConfig, run_cluster

    cfg = ClusterConfig(replicas=[ReplicaGroup(count=2, sim=apply_overrides(SimConfig(), SMALL))],
                        router=RouterConfig("round_robin", {}))
    res = run_cluster(cfg, _wl(("a", 0.0, 64, 4), ("b", 0.0, 10, 4), ("c", 0.1, 70, 4), ("d", 0.1, 12, 3)))
    assert res.summary["num_rejected"] == 2 and res.summary["num_completed"] == 2
    assert res.summary["rejected_by_reason"] == {"no_room_to_generate": 1, "prompt_exceeds_max_model_len": 1}
    assert set(res.requests.loc[res.requests["status"] == "rejected", "request_id"]) == {"a", "c"}
    assert sum(r["num_rejected"] for r in res.summary["replicas"]) == 2


# --- the CLI: refusals exit non-zero with the field named, nothing written ----------------------------
@pytest.mark.parametrize("args,needle", [
    (["replay", "--set", "cache.num_gpu_blocks=10"], "cache.num_gpu_blocks"),
    (["replay", "--set", "scheduler.max_num_batched_tokens=8"], "scheduler.max_num_batched_tokens"),
    (["step-trace", "WL", "--out", "OUT", "--num-blocks", "3"], "--num-blocks"),
])
@pytest.mark.slow
def test_cli_refuses_what_vllm_refuses(tmp_path, args, needle):
    import os
    import subprocess
    import sys
    from pathlib import Path

    wl = tmp_path / "wl.jsonl"
    wl.write_text('{"request_id": "a", "arrival_step": 0, "prompt_token_ids": [1, 2, 3], "max_tokens": 2}\n')
    args = [str(wl) if a == "WL" else str(tmp_path / "out.jsonl") if a == "OUT" else a for a in args]
    if args[0] == "replay":
        args += ["--out", str(tmp_path / "run")]
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-m", "servesim", *args], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(root)}, timeout=120)
    assert proc.returncode == 2 and needle in proc.stderr and "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wl.jsonl"]  # nothing written


def test_safety_net_an_engine_that_can_never_wake_stops_with_a_diagnosis():
    """Without admission (bypassed here), r1's prompt reaches the scheduler, which can never
    schedule its last prompt token: SimPy runs out of events and the engine says so."""
    cfg = apply_overrides(SimConfig(), SMALL)
    eng = Engine(cfg, _wl(("a", 0.0, 64, 4)))
    eng.admission = Admission(max_model_len=10**9, block_size=16, usable_blocks=10**9, extra_slots=0)
    with pytest.raises(StallError, match=r"nothing left that could wake it.*a \(WAITING|nothing left that could wake "
                                         r"it.*a \(RUNNING"):
        eng.run()
