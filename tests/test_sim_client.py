"""Client behaviour and the HTTP frontend on the engine: exact timelines by hand."""

from __future__ import annotations

import dataclasses

import pytest

from servesim.scheduler import CacheConfig, SchedulerConfig
from servesim.simulator.config import ClientConfig, CostModelConfig, SimConfig
from servesim.simulator.cost_model.cpu_overhead import CpuOverheadConfig
from servesim.simulator.engine import Engine
from servesim.simulator.frontend import FrontendConfig
from servesim.simulator.cost_model import register_cost_model
from servesim.traces.errors import InputError
from servesim.traces.workload import RequestSpec, Workload


class LinearCost:
    """step = 5 ms + 1 ms per scheduled token (the same arithmetic as tests/test_sim_engine.py)."""

    name = "test-linear-client"

    def step_time_s(self, shape) -> float:
        return 0.005 + 0.001 * sum(shape.num_new_tokens)


register_cost_model("test-linear-client")(lambda **kw: LinearCost())


def cfg(**kw) -> SimConfig:
    return SimConfig(
        scheduler=SchedulerConfig(max_model_len=512, max_num_seqs=1),
        cache=CacheConfig(block_size=4, num_gpu_blocks=200), derive_num_gpu_blocks=False,
        cost_model=CostModelConfig(name="test-linear-client", cpu_overhead=CpuOverheadConfig(0.001, 0.0, 0.0)), **kw)


def wl(*specs) -> Workload:
    return Workload(list(specs), name="t", source="test")


def test_a_queued_request_times_out_and_frees_nothing_it_never_had():
    # max_num_seqs=1: b waits behind a (a: 10-token prompt, 3 outputs, done at 30 ms). b gives up at 20 ms.
    a = RequestSpec("a", 0.0, prompt_len=10, output_len=3)
    b = RequestSpec("b", 0.0, prompt_len=4, output_len=2, timeout_s=0.020)
    eng = Engine(cfg(), wl(a, b))
    res = eng.run()
    ra, rb = res.metrics.requests["a"], res.metrics.requests["b"]
    assert ra.token_times_s == pytest.approx([0.016, 0.023, 0.030]) and ra.finish_reason == "length"
    assert rb.status == "timed_out" and len(rb.token_times_s) == 0 and rb.finish_s is None
    assert eng.scheduler.kv_cache_manager.usage == 0.0  # nothing leaked
    df = res.metrics.requests_frame().set_index("request_id")
    assert df.loc["b", "e2e_s"] is None or df.loc["b", "e2e_s"] != df.loc["b", "e2e_s"]  # empty, not 0


def test_a_running_request_is_aborted_at_the_next_step_boundary_and_frees_its_blocks():
    # a runs alone: steps end at 16, 23, 30, ... ms. Its client gives up at 20 ms; the abort is applied
    # when the engine loop next runs (23 ms), so a keeps the two tokens it streamed.
    a = RequestSpec("a", 0.0, prompt_len=10, output_len=50, timeout_s=0.020)
    c = RequestSpec("c", 0.0, prompt_len=4, output_len=1)
    eng = Engine(cfg(), wl(a, c))
    res = eng.run()
    ra, rc = res.metrics.requests["a"], res.metrics.requests["c"]
    assert ra.status == "timed_out" and ra.token_times_s == pytest.approx([0.016, 0.023])
    assert rc.first_scheduled_s == pytest.approx(0.023)  # c runs once a's KV is freed
    assert eng.scheduler.kv_cache_manager.usage == 0.0
    assert res.metrics.requests_frame().status.tolist() == ["timed_out", "completed"]


def test_config_timeout_applies_to_every_request_and_summary_counts_failures():
    specs = [RequestSpec(f"r{i}", 0.0, prompt_len=10, output_len=3) for i in range(4)]
    res = Engine(cfg(client=ClientConfig(timeout_s=0.05)), wl(*specs)).run()
    statuses = res.metrics.requests_frame()["status"].tolist()
    # each request takes 30 ms alone and they run one at a time: r0 done at 30 ms, r1 at 60 ms (too late).
    assert statuses == ["completed", "timed_out", "timed_out", "timed_out"]


def test_frontend_shifts_one_request_by_exactly_its_costs():
    fe = FrontendConfig(enabled=True, http_s=0.002, tokenize_base_s=0.001, tokenize_s_per_token=0.0001,
                        engine_hop_s=0.0005, output_step_s=0.0001, output_per_request_s=0.0003)
    r = RequestSpec("a", 1.0, prompt_len=10, output_len=3)
    plain = Engine(cfg(), wl(r)).run().metrics.requests["a"]
    front = Engine(cfg(frontend=fe), wl(r)).run().metrics.requests["a"]
    before = 0.002 + 0.001 + 0.0001 * 10 + 0.0005  # handling + tokenize + hop to the engine
    after = 0.0005 + 0.0001 + 0.0003  # hop back + the step's output pass + its one chunk (an idle loop)
    assert front.arrival_s == plain.arrival_s == 1.0  # latencies count from the client's send
    assert front.first_token_s == pytest.approx(plain.first_token_s + before + after)
    assert front.token_times_s == pytest.approx([t + before + after for t in plain.token_times_s])


def test_serial_frontend_queues_a_burst():
    fe = FrontendConfig(enabled=True, http_s=0.010, tokenize_base_s=0.0, tokenize_s_per_token=0.0,
                        engine_hop_s=0.0, output_step_s=0.0, output_per_request_s=0.0)
    specs = [RequestSpec(f"r{i}", 0.0, prompt_len=4, output_len=1) for i in range(3)]
    cfg3 = cfg(frontend=fe)
    cfg3.scheduler = dataclasses.replace(cfg3.scheduler, max_num_seqs=8)
    res = Engine(cfg3, wl(*specs)).run()
    firsts = [res.metrics.requests[f"r{i}"].first_scheduled_s for i in range(3)]
    assert firsts == pytest.approx([0.010, 0.020, 0.030])  # one event loop: 10 ms each, in order


def test_bad_timeouts_are_refused():
    with pytest.raises(InputError, match="client.timeout_s"):
        ClientConfig(timeout_s=0.0)
    with pytest.raises(InputError, match="timeout_s"):
        RequestSpec("x", 0.0, prompt_len=1, output_len=1, timeout_s=-1.0)


def test_max_concurrency_holds_clients_until_a_slot_frees():
    # vllm bench --max-concurrency 1: each request is sent when the previous one completed, and its
    # latencies count from that send (a: 10-token prompt, 3 outputs = 30 ms alone).
    specs = [RequestSpec(f"r{i}", 0.0, prompt_len=10, output_len=3) for i in range(3)]
    c = cfg(client=ClientConfig(max_concurrency=1))
    c.scheduler = dataclasses.replace(c.scheduler, max_num_seqs=8)
    res = Engine(c, wl(*specs)).run()
    recs = [res.metrics.requests[f"r{i}"] for i in range(3)]
    assert [r.arrival_s for r in recs] == pytest.approx([0.0, 0.030, 0.060])
    assert [r.first_token_s - r.arrival_s for r in recs] == pytest.approx([0.016] * 3)
    with pytest.raises(InputError, match="client.max_concurrency"):
        ClientConfig(max_concurrency=0)
