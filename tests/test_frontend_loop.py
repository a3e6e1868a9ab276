"""The API server as one event loop (simulator/frontend.py ApiServerLoop): exact timelines by hand.

The engine prices a step at 1 ms CPU + 5 ms + 1 ms per scheduled token and schedules synchronously,
so a decode step of K running requests takes (6 + K) ms and the step that also prefills a 4-token
prompt (10 + K) ms.
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pandas as pd
import pytest

from servesim.scheduler import CacheConfig, SchedulerConfig
from servesim.simulator.build import build_engine
from servesim.simulator.config import ClientConfig, CostModelConfig, SimConfig
from servesim.simulator.cost_model import register_cost_model
from servesim.simulator.cost_model.cpu_overhead import CpuOverheadConfig
from servesim.simulator.engine import Engine
from servesim.simulator.fastpath import FRONTEND_LOOP_DECLINED
from servesim.simulator.frontend import ApiServerLoop, FrontendConfig, StepDelivery
from servesim.simulator.request_records import RequestRecord
from servesim.overrides import apply_overrides
from servesim.traces.errors import InputError
from servesim.traces.workload import RequestSpec, Workload

MS = 1e-3


class LinearCost:
    name = "test-linear-loop"

    def step_time_s(self, shape) -> float:
        return 0.005 + 0.001 * sum(shape.num_new_tokens)


register_cost_model("test-linear-loop")(lambda **kw: LinearCost())


def cfg(frontend: FrontendConfig, **kw) -> SimConfig:
    return SimConfig(
        scheduler=SchedulerConfig(max_model_len=512, max_num_seqs=64),
        cache=CacheConfig(block_size=4, num_gpu_blocks=4000, enable_prefix_caching=False),
        derive_num_gpu_blocks=False, frontend=frontend,
        cost_model=CostModelConfig(name="test-linear-loop", cpu_overhead=CpuOverheadConfig(0.001, 0.0, 0.0)), **kw)


def fe(**kw) -> FrontendConfig:
    base = dict(enabled=True, http_s=0.002, tokenize_base_s=0.0, tokenize_s_per_token=0.0, engine_hop_s=0.0,
                output_step_s=0.0, output_per_request_s=0.0)
    return FrontendConfig(**{**base, **kw})


def streams_and_probe(k: int, probe_at_s: float, probe_out: int = 2):
    """k streams sent at t=0 (4-token prompts, long answers), then a probe request at probe_at_s."""
    specs = [RequestSpec(f"s{i}", 0.0, prompt_len=4, output_len=100) for i in range(k)]
    return Workload(specs + [RequestSpec("x", probe_at_s, prompt_len=4, output_len=probe_out)], name="t", source="test")


def _last_step_end_before(res, t_s: float) -> float:
    """The last update a stream saw at or before t_s (engine time: its token times with free output)."""
    return max(t for t in res.metrics.requests["s0"].token_times_s if t <= t_s)


# --- the loop by itself ------------------------------------------------------------------------------
def _job(arrival_s: float, service_s: float, rec: RequestRecord) -> StepDelivery:
    rec.token_times_s.append(arrival_s)
    return StepDelivery(arrival_s, service_s, [rec], [len(rec.token_times_s) - 1], [1], [False])


def test_loop_serves_in_arrival_order_ties_in_submission_order():
    loop = ApiServerLoop()
    a, b = RequestRecord("a", 0.0, 1, 5), RequestRecord("b", 0.0, 1, 5)
    loop.post(_job(1.0, 0.5, a))  # a step's outputs reach the loop at 1.0
    assert loop.intake(0.9, 0.25) == 0.9  # arrived first: served first, the loop is busy to 1.15
    assert loop.intake(1.0, 0.25) == 1.65  # same instant as the step, submitted after it: behind it
    assert a.token_times_s[0] == a.first_token_s == 1.65  # the step: 1.15 + 0.5
    assert loop.intake(1.0, 0.125) == 1.9  # and behind the intake before it
    loop.post(_job(1.5, 0.25, b))  # arrived while the loop was busy: queued until it is free
    loop.drain(2.0)
    assert b.token_times_s[0] == 1.9 + 0.125 + 0.25
    assert loop.num_jobs == 5 and loop.busy_until_s == 2.275


def test_loop_drains_only_what_has_arrived():
    loop = ApiServerLoop()
    rec = RequestRecord("a", 0.0, 1, 5)
    loop.post(_job(2.0, 0.5, rec))
    loop.drain(1.0)
    assert rec.first_token_s is None and loop.num_jobs == 0
    assert loop.intake(1.5, 1.0) == 1.5  # an intake arriving before the step goes first
    loop.drain(float("inf"))
    assert rec.token_times_s[0] == 3.0  # 2.5 (the intake) + 0.5


# --- on the engine -------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_ttft_of_a_request_arriving_while_k_streams_run(k):
    s0, c = 0.2 * MS, 0.5 * MS
    free = Engine(cfg(fe()), streams_and_probe(k, 5.0)).run()  # where the streams' steps end (engine time)
    u_m = _last_step_end_before(free, 0.3)
    t = u_m + 0.1 * MS  # the probe is sent just after a step's outputs reached the loop
    ref = Engine(cfg(fe()), streams_and_probe(k, t)).run()
    res = Engine(cfg(fe(output_step_s=s0, output_per_request_s=c)), streams_and_probe(k, t)).run()
    u1 = u_m + (6 + k) * MS  # the decode step running when the probe arrives
    u2 = u1 + (10 + k) * MS  # the next: k decodes + the probe's 4-token prefill
    for r in (ref, res):
        assert r.metrics.requests["x"].first_scheduled_s == pytest.approx(u1, abs=1e-12)
    # No output cost: the probe's token reaches its client as the engine applies the step.
    assert ref.metrics.requests["x"].first_token_s - t == pytest.approx(u2 - t, abs=1e-12)
    # With it: the probe's intake waited behind the step's k outputs (still inside the step), and
    # its own token is delivered after that step's k + 1 outputs went through the loop.
    ttft = res.metrics.requests["x"].first_token_s - t
    assert ttft == pytest.approx(u2 + s0 + (k + 1) * c - t, abs=1e-12)
    # the streams see the same: every chunk of a step delivered when the step's job ends
    assert res.metrics.requests["s0"].token_times_s[-1] == pytest.approx(
        ref.metrics.requests["s0"].token_times_s[-1] + s0 + k * c, abs=1e-12)


def test_intake_waits_behind_the_outputs_of_running_streams():
    # 8 streams: a decode step takes 14 ms and its outputs 0.2 + 8 x 0.5 = 4.2 ms of the loop. A probe
    # sent 0.1 ms after a step ended with a 12 ms intake would reach the engine inside the running
    # step (12.1 < 14 ms); behind the outputs it arrives after it (4.2 + 12 > 14) and runs a step later.
    k, s0, c = 8, 0.2 * MS, 0.5 * MS
    u_m = _last_step_end_before(Engine(cfg(fe(http_s=0.012)), streams_and_probe(k, 5.0)).run(), 0.3)
    t = u_m + 0.1 * MS
    ref = Engine(cfg(fe(http_s=0.012)), streams_and_probe(k, t)).run().metrics.requests["x"]
    res = Engine(cfg(fe(http_s=0.012, output_step_s=s0, output_per_request_s=c)),
                 streams_and_probe(k, t)).run().metrics.requests["x"]
    u1 = u_m + (6 + k) * MS
    assert ref.first_scheduled_s == pytest.approx(u1, abs=1e-12)
    assert res.first_scheduled_s == pytest.approx(u1 + (6 + k) * MS, abs=1e-12)


def test_a_burst_of_intakes_is_served_as_before_when_no_outputs_are_pending():
    # Three requests sent at 0 with a 10 ms intake each: they reach the engine at 10, 20 and 30 ms.
    # The first one's step outputs reach the loop at 20 ms, after the third intake arrived (at 0).
    specs = [RequestSpec(f"r{i}", 0.0, prompt_len=4, output_len=1) for i in range(3)]
    res = Engine(cfg(fe(http_s=0.010, output_step_s=0.001, output_per_request_s=0.002)),
                 Workload(specs, name="t", source="test")).run()
    assert [res.metrics.requests[f"r{i}"].first_scheduled_s for i in range(3)] == pytest.approx([0.010, 0.020, 0.030])
    # r0: scheduled at 10 ms, step 1 + 5 + 4 = 10 ms; its output waits for the third intake (20-30 ms).
    assert res.metrics.requests["r0"].first_token_s == pytest.approx(0.030 + 0.001 + 0.002)


def test_tokenization_runs_on_its_own_thread_beside_the_loop():
    # vLLM tokenizes on one thread off the event loop: three requests sent at 0 with 10 ms of HTTP
    # handling (the loop) and 20 ms of tokenization (the thread) pipeline: parsed at 10, 20, 30 ms,
    # tokenized at 30, 50, 70 ms (the thread is the bottleneck; one loop doing both: 30, 60, 90).
    # Each reaches an idle engine (its one-token step ends ~11 ms later) and is scheduled at once.
    specs = [RequestSpec(f"r{i}", 0.0, prompt_len=10, output_len=1) for i in range(3)]
    res = Engine(cfg(fe(http_s=0.010, tokenize_base_s=0.020)), Workload(specs, name="t", source="test")).run()
    assert [res.metrics.requests[f"r{i}"].first_scheduled_s for i in range(3)] == pytest.approx([0.030, 0.050, 0.070])


def test_a_client_slot_frees_when_the_last_chunk_is_delivered():
    # --max-concurrency 1: r1 is sent the instant r0's last chunk reaches its client.
    specs = [RequestSpec(f"r{i}", 0.0, prompt_len=4, output_len=3) for i in range(2)]
    res = Engine(cfg(fe(http_s=0.001, engine_hop_s=0.0005, output_step_s=0.0002, output_per_request_s=0.0003),
                     client=ClientConfig(max_concurrency=1)), Workload(specs, name="t", source="test")).run()
    r0, r1 = res.metrics.requests["r0"], res.metrics.requests["r1"]
    # r0 reaches the engine at 1.5 ms; steps of 10, 7, 7 ms end at 11.5, 18.5, 25.5 ms; each is
    # delivered 0.5 + 0.2 + 0.3 ms later.
    assert list(r0.token_times_s) == pytest.approx([0.0125, 0.0195, 0.0265])
    assert r0.finish_s == r0.token_times_s[-1] == r1.arrival_s


def test_frontend_runs_are_identical_with_and_without_the_fast_path():
    rng = np.random.default_rng(3)
    specs = [RequestSpec(f"r{i}", float(t), prompt_len=int(p), output_len=int(o))
             for i, (t, p, o) in enumerate(zip(np.cumsum(rng.exponential(0.02, 40)), rng.integers(4, 200, 40),
                                                rng.integers(5, 80, 40)))]
    wl = Workload(specs, name="t", source="test")
    c = dataclasses.replace(cfg(FrontendConfig(enabled=True)), scheduler=SchedulerConfig(max_model_len=512))
    plain = Engine(c, wl).run()
    built = build_engine(c, wl)
    fast = built.run()
    assert built.planner_declined == FRONTEND_LOOP_DECLINED
    pd.testing.assert_frame_equal(plain.metrics.requests_frame(), fast.metrics.requests_frame(), check_exact=True)
    independent = build_engine(dataclasses.replace(c, frontend=FrontendConfig(enabled=True, serial=False)), wl)
    assert independent.planner_declined != FRONTEND_LOOP_DECLINED  # a constant delay needs no loop


@pytest.mark.parametrize("key,value", [("output_per_request_s", -1.0), ("output_step_s", float("nan")),
                                       ("engine_hop_s", True), ("serial", 2), ("http_s", "fast")])
def test_bad_values_are_refused_with_the_field_name(key, value):
    with pytest.raises(InputError, match=f"frontend.{key}"):
        apply_overrides(SimConfig(), {f"frontend.{key}": value})
    if key != "http_s":  # a string for a float is refused by the config builder before the class
        with pytest.raises(InputError, match=f"frontend.{key}"):
            FrontendConfig(**{key: value})


def test_the_old_chunk_key_is_read_as_the_per_request_cost():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg_ = apply_overrides(SimConfig(), {"frontend.chunk_s": 0.0004})
    assert cfg_.frontend.output_per_request_s == 0.0004 and cfg_.frontend.chunk_s is None
    assert any("output_per_request_s" in str(w.message) for w in caught)
    with pytest.raises(InputError, match="frontend.chunk_s"):
        FrontendConfig(chunk_s=-1.0)
