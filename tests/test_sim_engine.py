"""Simulator: exact timelines for hand-computable scenarios, determinism, outputs and CLI."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from servesim.scheduler import CacheConfig, SchedulerConfig
from servesim.simulator.config import CostModelConfig, SimConfig
from servesim.simulator.cost_model import register_cost_model
from servesim.simulator.cost_model.cpu_overhead import CpuOverheadConfig
from servesim.simulator.engine import Engine
from servesim.traces.workload import RequestSpec, Workload

ROOT = Path(__file__).resolve().parents[1]


class LinearCost:
    """step = 5 ms + 1 ms per scheduled token: easy arithmetic."""

    name = "test-linear"

    def step_time_s(self, shape) -> float:
        return 0.005 + 0.001 * sum(shape.num_new_tokens)


register_cost_model("test-linear")(lambda **kw: LinearCost())


def cfg(num_blocks=100, cpu=CpuOverheadConfig(0.001, 0.0, 0.0), **sched_kw) -> SimConfig:
    return SimConfig(
        # vLLM's start-up check: the pool must hold one max_model_len request.
        scheduler=SchedulerConfig(max_model_len=min(512, num_blocks * 4), **sched_kw),
        cache=CacheConfig(block_size=4, num_gpu_blocks=num_blocks), derive_num_gpu_blocks=False,
        cost_model=CostModelConfig(name="test-linear", cpu_overhead=cpu),
    )


def wl(*specs) -> Workload:
    return Workload(list(specs), name="t", source="test")


def test_one_request_matches_the_arithmetic():
    r = RequestSpec("a", 1.0, prompt_len=10, output_len=3)
    res = Engine(cfg(), wl(r)).run()
    rec = res.metrics.requests["a"]
    # step 1: 1 ms CPU + (5 + 10) ms GPU -> first token at 1.016; steps 2, 3: 1 + 6 ms each.
    assert rec.first_scheduled_s == pytest.approx(1.0)
    assert rec.token_times_s == pytest.approx([1.016, 1.023, 1.030])
    assert rec.finish_s == pytest.approx(1.030)
    df = res.metrics.requests_frame().iloc[0]
    assert df.ttft_s == pytest.approx(0.016) and df.tpot_s == pytest.approx(0.007) and df.e2e_s == pytest.approx(0.030)
    steps = res.metrics.steps_frame()
    assert list(steps.num_prefill_tokens) == [10, 0, 0] and list(steps.num_decode_tokens) == [0, 1, 1]
    assert res.num_steps == 3


def test_engine_sleeps_until_next_arrival():
    a = RequestSpec("a", 0.0, prompt_len=4, output_len=1)
    b = RequestSpec("b", 10.0, prompt_len=4, output_len=1)
    res = Engine(cfg(), wl(a, b)).run()
    assert res.num_steps == 2  # no busy steps between the two arrivals
    assert res.metrics.requests["b"].first_token_s == pytest.approx(10.010)


def test_chunked_prefill_timeline_two_requests():
    a = RequestSpec("a", 0.0, prompt_len=12, output_len=2)
    b = RequestSpec("b", 0.0, prompt_len=12, output_len=1)
    res = Engine(cfg(max_num_batched_tokens=16, max_num_seqs=16), wl(a, b)).run()
    # step 1: a 12 + b 4 tokens (b chunked): 1 + 5 + 16 = 22 ms; a samples.
    # step 2: a 1 + b 8 = 9 tokens: 1 + 5 + 9 = 15 ms; both sample; both done at 37 ms.
    assert res.metrics.requests["a"].token_times_s == pytest.approx([0.022, 0.037])
    assert res.metrics.requests["b"].token_times_s == pytest.approx([0.037])


def test_async_scheduling_hides_cpu_time_behind_the_gpu():
    r = RequestSpec("a", 0.0, prompt_len=4, output_len=4)
    sync = Engine(cfg(), wl(r)).run().metrics.requests["a"].finish_s
    asyn = Engine(cfg(async_scheduling=True), wl(r)).run().metrics.requests["a"].finish_s
    assert asyn < sync


def test_never_fitting_request_is_reported_not_crashing():
    # 20 blocks x 4 = max_model_len 80, but block 0 is the null block: 77 KV slots need all 20.
    big = RequestSpec("big", 0.0, prompt_len=76, output_len=2)
    ok = RequestSpec("ok", 0.0, prompt_len=4, output_len=1)
    res = Engine(cfg(num_blocks=20), wl(big, ok)).run()
    assert res.metrics.requests["big"].reject_reason == "exceeds_kv_pool" and not res.metrics.requests["big"].token_times_s
    assert res.metrics.requests["ok"].token_times_s


def _digest(d: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir()) if p.name != "summary.json"}


@pytest.mark.slow
def test_same_seed_gives_byte_identical_outputs(tmp_path):
    from servesim.api import load_trace, run

    w = load_trace(None, max_requests=60)
    c = dataclasses.replace(SimConfig(), seed=3)
    run(c, w, out_dir=tmp_path / "a")
    run(c, w, out_dir=tmp_path / "b")
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    sa = json.loads((tmp_path / "a/summary.json").read_text())
    sb = json.loads((tmp_path / "b/summary.json").read_text())
    sa.pop("wall_time_s"), sb.pop("wall_time_s"), sa.pop("sim_speedup_x"), sb.pop("sim_speedup_x")
    assert sa == sb
    for key in ("num_requests", "num_finished", "sim_duration_s", "ttft_s", "tpot_s", "itl_s", "e2e_s", "throughput",
                "goodput", "num_preemptions", "prefix_cache_hit_rate", "kv_usage_mean"):
        assert key in sa


@pytest.mark.slow
def test_replay_step_trace_equals_scheduler_step_trace_schema(tmp_path):
    from servesim.api import load_trace, run

    w = load_trace(None, max_requests=20)
    run(SimConfig(), w, out_dir=tmp_path / "o", step_trace=tmp_path / "t.jsonl")
    recs = [json.loads(x) for x in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert recs and list(recs[0]) == ["step", "arrived", "new", "cached", "num_scheduled_tokens",
                                      "total_num_scheduled_tokens", "num_common_prefix_blocks", "preempted",
                                      "finished_req_ids", "num_waiting", "num_running", "num_free_blocks",
                                      "kv_usage", "sampled_token_ids", "finished_after_update", "prefix_cache_stats"]


@pytest.mark.slow
def test_cli_replay_default_and_bad_input(tmp_path):
    exe = [sys.executable, "-m", "servesim", "replay"]
    p = subprocess.run(exe + ["--max-requests", "30", "--out", str(tmp_path / "r")], capture_output=True, text=True,
                       cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert "TTFT" in p.stdout and (tmp_path / "r" / "summary.json").exists()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": -3, "output_length": 2, "hash_ids": [1]}\n')
    p = subprocess.run(exe + [str(bad), "--out", str(tmp_path / "x")], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 2 and "bad.jsonl" in p.stderr and "line 1" in p.stderr
    assert not (tmp_path / "x").exists()


def test_engine_waits_for_a_continuum_pin_to_expire_instead_of_spinning():
    """A waiting request that only fits once a pinned turn's blocks are released: the engine sleeps
    until the pin expires, then runs it."""
    from servesim.simulator.config import SimConfig as _S

    c = dataclasses.replace(cfg(num_blocks=9, policy="continuum", continuum_default_gap_s=0.5))
    c = dataclasses.replace(c, scheduler=dataclasses.replace(c.scheduler, continuum_pin_threshold_s=2.0))
    assert isinstance(c, _S)
    turn = RequestSpec("t1", 0.0, prompt_len=20, output_len=2, session_id="job", is_last_turn=False)
    other = RequestSpec("x", 0.1, prompt_len=24, output_len=1)  # needs 6 blocks: only after the unpin
    res = Engine(c, wl(turn, other)).run()
    t1_done = res.metrics.requests["t1"].finish_s
    x = res.metrics.requests["x"]
    assert x.finish_s is not None
    assert x.first_scheduled_s == pytest.approx(t1_done + 1.0)  # pin TTL = 2 x the 0.5 s default gap
