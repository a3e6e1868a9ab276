"""The "sglang" engine end to end through simulator.engine.Engine, and how it differs from vLLM."""

from __future__ import annotations

import dataclasses
from functools import lru_cache

import pytest

from servesim.scheduler import CacheConfig, SchedulerConfig
from servesim.scheduler.sglang import SGLangConfig, SGLangScheduler
from servesim.api import load_trace
from servesim.simulator.config import SimConfig
from servesim.simulator.build import attach_planner
from servesim.simulator.engine import Engine
from servesim.simulator.scheduler_kinds import available_engines, make_engine_scheduler
from servesim.simulator.scheduler_kinds.sglang import map_sglang_config
from servesim.traces.errors import InputError


if "sglang" in {f.name for f in dataclasses.fields(SimConfig)}:
    SimConfigWithSGLang = SimConfig
else:
    @dataclasses.dataclass
    class SimConfigWithSGLang(SimConfig):
        """SimConfig plus the optional `sglang` field the engine factory looks for."""

        sglang: SGLangConfig | None = None


class CheckedEngine(Engine):
    """Checks the scheduler's invariants after every step (once its output is applied) and after
    every run of decode steps applied in bulk (macro-steps: its planner is wrapped)."""

    def apply_output(self, *args, **kw):
        super().apply_output(*args, **kw)
        self.scheduler.check_invariants()


class CheckedPlanner:
    """A RunPlanner that checks the scheduler's invariants after every run it applies."""

    def __init__(self, inner, scheduler):
        self.inner, self.scheduler = inner, scheduler

    def advance(self, now, in_flight):
        delays = self.inner.advance(now, in_flight)
        self.scheduler.check_invariants()
        return delays

    def __getattr__(self, name):
        return getattr(self.inner, name)


def checked_engine(cfg, wl) -> CheckedEngine:
    eng = attach_planner(CheckedEngine(cfg, wl))
    if eng.planner is not None:
        eng.set_planner(CheckedPlanner(eng.planner, eng.scheduler), None)
    return eng


@lru_cache(maxsize=1)
def trace():
    return load_trace(None, max_requests=50)


def cfg(engine: str, num_blocks: int = 3000, async_scheduling: bool = False, sglang: SGLangConfig | None = None):
    return SimConfigWithSGLang(
        # max_model_len within the pool: vLLM's start-up check (simulator/startup.py)
        engine=engine, scheduler=SchedulerConfig(max_model_len=min(8192, num_blocks * 16),
                                                 async_scheduling=async_scheduling),
        cache=CacheConfig(block_size=16, num_gpu_blocks=num_blocks), derive_num_gpu_blocks=False, sglang=sglang)


@lru_cache(maxsize=None)
def run(engine: str, num_blocks: int = 3000, async_scheduling: bool = False, mixed: bool = False,
        checked: bool = True):
    sglang = SGLangConfig(enable_mixed_chunk=True) if mixed else None
    make = checked_engine if checked else Engine
    return make(cfg(engine, num_blocks, async_scheduling, sglang), trace()).run()


def test_engine_registry_lists_sglang():
    assert "sglang" in available_engines()
    with pytest.raises(InputError, match="sglang, vllm"):
        make_engine_scheduler("tgi", SchedulerConfig(), CacheConfig())


def test_map_sglang_config_maps_shared_settings_and_keeps_explicit_ones():
    sc = SchedulerConfig(max_num_seqs=7, max_num_batched_tokens=512, async_scheduling=True)
    cc = CacheConfig(block_size=16, num_gpu_blocks=101, enable_prefix_caching=False)
    m = map_sglang_config(sc, cc, None, seed=3)
    assert (m.max_running_requests, m.chunked_prefill_size, m.page_size, m.max_total_tokens) == (7, 512, 16, 1600)
    assert not m.enable_radix_cache and m.overlap_schedule and m.seed == 3 and m.schedule_policy == "fcfs"
    m = map_sglang_config(sc, cc, SGLangConfig(page_size=1, max_running_requests=3, schedule_policy="lpm"))
    assert (m.page_size, m.max_running_requests, m.schedule_policy) == (1, 3, "lpm")
    sched = make_engine_scheduler("sglang", sc, cc, cfg("sglang", sglang=SGLangConfig(schedule_policy="lof")))
    assert isinstance(sched, SGLangScheduler) and sched.config.schedule_policy == "lof"


@pytest.mark.slow
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_every_request_finishes_with_invariants_checked_each_step(async_scheduling):
    res = run("sglang", async_scheduling=async_scheduling)
    recs = res.metrics.requests.values()
    assert len(recs) == 50
    assert all(r.finish_s is not None and r.finish_reason == "length" for r in recs)
    assert all(len(r.token_times_s) == r.output_len_target for r in recs)


@pytest.mark.slow
def test_small_pool_retracts_and_still_finishes():
    res = run("sglang", num_blocks=400)  # 6,400 tokens: the reservation estimate is too optimistic
    recs = res.metrics.requests.values()
    assert all(r.finish_s is not None for r in recs)
    assert sum(r.num_preemptions for r in recs) > 0
    assert sum(res.metrics.steps.column("num_preemptions")) == sum(r.num_preemptions for r in recs)


@pytest.mark.slow
def test_sglang_separates_prefill_and_decode_batches_unlike_vllm():
    """Documented difference (docs/SGLANG_MODEL.md): vLLM spends one token budget on running
    requests first and fills it with prefill, so its steps mix decode and prefill tokens. SGLang
    runs a new prefill batch on its own (prefill first, decode waits) unless mixed chunk is on."""
    def mixed_steps(res):
        steps = res.metrics.steps
        return sum(1 for p, d in zip(steps.column("num_prefill_tokens"), steps.column("num_decode_tokens")) if p and d)

    vllm = run("vllm", checked=False)
    sglang, sglang_mixed = run("sglang"), run("sglang", mixed=True, checked=False)
    assert mixed_steps(vllm) > 0
    assert mixed_steps(sglang) == 0
    assert mixed_steps(sglang_mixed) > 0
    # Same trace, same outputs: only the batching differs.
    for res in (vllm, sglang, sglang_mixed):
        assert sum(len(r.token_times_s) for r in res.metrics.requests.values()) == sum(
            s.output_len for s in trace().requests)
