"""The CPU KV tier in simulated vLLM runs (simulator/kv_offload.py): config from every entry point,
the timed worker's rules, and an exact hand-computed timeline."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import yaml

from servesim.scheduler import CacheConfig, SchedulerConfig
from servesim.scheduler.kv_offload.connector import OffloadTransfer
from servesim.simulator.cluster.config import sim_config_from_dict
from servesim.simulator.config import CostModelConfig, HardwareConfig, SimConfig
from servesim.simulator.config_values import apply_overrides
from servesim.simulator.cost_model import register_cost_model
from servesim.simulator.cost_model.cpu_overhead import CpuOverheadConfig
from servesim.simulator.engine import Engine
from servesim.simulator.fastpath import planner_for
from servesim.simulator.kv_offload import KvOffloadConfig, TimedOffloadWorker, check_kv_offload
from servesim.traces.errors import InputError
from servesim.traces.workload import RequestSpec, Workload


class _LinearCost:
    """step = 5 ms + 1 ms per scheduled token."""

    name = "test-offload-linear"

    def step_time_s(self, shape) -> float:
        return 0.005 + 0.001 * sum(shape.num_new_tokens)


register_cost_model("test-offload-linear")(lambda **kw: _LinearCost())

GPU_BLOCK_BYTES = 4 * 131072  # llama-3.1-8b: 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes per token


def _cfg(offload: bool, async_scheduling: bool = False) -> SimConfig:
    # A link of 1000 GPU blocks per second: a copy of n blocks takes n ms.
    ko = KvOffloadConfig(num_cpu_blocks=100, host_link_bytes_per_s=GPU_BLOCK_BYTES * 1000.0) if offload \
        else KvOffloadConfig()
    return SimConfig(scheduler=SchedulerConfig(max_model_len=48, async_scheduling=async_scheduling),
                     cache=CacheConfig(block_size=4, num_gpu_blocks=12), derive_num_gpu_blocks=False,
                     cost_model=CostModelConfig(name="test-offload-linear",
                                                cpu_overhead=CpuOverheadConfig(0.001, 0.0, 0.0)),
                     kv_offload=ko)


# a and c share a 16-token prefix (4 blocks); b fills the GPU pool in between, evicting a's blocks.
_SPECS = [RequestSpec("a", 0.0, 20, 1, prefix_group=1, prefix_len=16), RequestSpec("b", 5.0, 40, 1),
          RequestSpec("c", 10.0, 20, 1, prefix_group=1, prefix_len=16)]


def _run(cfg: SimConfig):
    engine = Engine(cfg, Workload(list(_SPECS), name="t", source="test"))
    return engine, engine.run()


# --- config ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tp, block_size, expected", [(1, None, 4096), (2, None, 4096), (1, 32, 2048)])
def test_gib_size_the_tier_as_vllm_cpu_offloading_spec(tp, block_size, expected):
    # vLLM's CPUOffloadingSpec: cpu_bytes // (page bytes x layers x world_size x factor): 8 GiB over
    # 2 MiB per 16-token block of all ranks = 4096, whatever the TP split.
    cfg = SimConfig(hardware=HardwareConfig(tp=tp),
                    kv_offload=KvOffloadConfig(kv_offloading_size=8, block_size=block_size))
    assert check_kv_offload(cfg, cfg.cache) == expected


def test_offload_off_by_default_builds_nothing():
    engine = Engine(_cfg(False), Workload([], name="t", source="test"))
    assert engine.kv_offload is None and engine.scheduler.connector is None


@pytest.mark.parametrize("sets, field, match", [
    ({"kv_offload.kv_offloading_size": "8", "kv_offload.eviction_policy": "lfu"}, "kv_offload.eviction_policy",
     "unknown eviction_policy 'lfu'"),
    ({"kv_offload.num_cpu_blocks": "4", "kv_offload.kv_offloading_size": "1"}, "kv_offload.kv_offloading_size",
     "not both"),
    ({"kv_offload.num_cpu_blocks": "4", "kv_offload.block_size": "24"}, "kv_offload", "not a multiple"),
    ({"kv_offload.kv_offloading_size": "1e-9"}, "kv_offload", "holds no offload block"),
    ({"kv_offload.kv_offloading_size": "8", "cache.enable_prefix_caching": "false"}, "cache.enable_prefix_caching",
     "prefix caching"),
    ({"kv_offload.kv_offloading_size": "8", "engine": "sglang"}, "kv_offload", "vLLM's"),
    ({"kv_offload.kv_offloading_size": "8", "hardware.pp": "2"}, None, None),
    ({"kv_offload.kv_offloading_backend": "lmcache"}, "kv_offload.kv_offloading_backend", "not modelled"),
    ({"kv_offload.transfer_efficiency": "0"}, "kv_offload.transfer_efficiency", r"\(0, 1\]"),
])
def test_config_errors_from_set_and_yaml_alike(sets, field, match):
    errors = []
    for build in (lambda: apply_overrides(SimConfig(), sets),
                  lambda: sim_config_from_dict(yaml.safe_load("\n".join(f"{k}: {v}" for k, v in sets.items())),
                                               where="", path="run.yaml")):
        with pytest.raises(InputError) as exc:
            build()
        errors.append(exc.value)
    assert errors[0].detail == errors[1].detail  # the same check, whichever way the settings came in
    if field is not None:
        # --set names the field the message names; a YAML section's own check names the section.
        assert errors[0].field == field and field.startswith(errors[1].field), [e.field for e in errors]
        assert re.search(match, errors[0].detail)


def test_config_errors_from_the_python_api():
    with pytest.raises(ValueError, match="unknown eviction_policy 'lfu'"):
        KvOffloadConfig(num_cpu_blocks=4, eviction_policy="lfu")
    with pytest.raises(ValueError, match="not both"):
        KvOffloadConfig(num_cpu_blocks=4, kv_offloading_size=1.0)


# --- the timed worker ----------------------------------------------------------------------------------
def _meta(load=None, store=None, flush=()):
    return SimpleNamespace(reqs_to_load={r: OffloadTransfer(list(range(n)), []) for r, n in (load or {}).items()},
                           reqs_to_store={r: OffloadTransfer(list(range(n)), []) for r, n in (store or {}).items()},
                           reqs_to_flush=set(flush))


def _step(meta, tokens=8, finished=()):
    return SimpleNamespace(kv_connector_metadata=meta, total_num_scheduled_tokens=tokens, finished_req_ids=set(finished))


def test_stores_serialize_on_their_stream_and_land_after_their_step():
    w = TimedOffloadWorker(bytes_per_gpu_block=1000, link_bytes_per_s=1e6, latency_s=0.0)  # 1 ms a block
    # step 0 (0 .. 0.010): two stores of 3 and 2 blocks start at its end: they end at 0.013, 0.015.
    assert w.execute(_step(_meta(store={"s": 3, "t": 2})), 0.0, 0.010) is None
    # a load of 4 blocks at 0.011 overlaps the stores (its own stream): ends 0.015.
    assert w.execute(_step(_meta(load={"l": 4}), finished={"s"}), 0.011, 0.012) is None  # s waits for its store
    out = w.execute(_step(_meta(), finished={"t"}), 0.012, 0.016)
    assert out.finished_sending == ("s", "t") and out.finished_recving == ("l",)
    assert w.totals.num_stores == 2 and w.totals.bytes_stored == 5000 and w.totals.bytes_loaded == 4000
    assert w.totals.load_wait_s == pytest.approx(0.005)  # submitted 0.011, reported by the step ending 0.016


def test_no_store_without_a_forward_and_flush_completes_in_the_flushing_step():
    w = TimedOffloadWorker(bytes_per_gpu_block=1000, link_bytes_per_s=1e6, latency_s=0.001)
    assert w.execute(_step(_meta(store={"x": 2}), tokens=0), 0.0, 0.0) is None
    assert w.book.next_done() is None  # an empty step stores nothing (wait_for_save follows a forward)
    w.execute(_step(_meta(store={"p": 5})), 0.0, 0.010)  # ends at 0.010 + 0.001 + 0.005
    assert w.book.next_done() == pytest.approx(0.016)
    # p is preempted: the worker waits for its stores, which count as done in this step...
    assert w.execute(_step(_meta(flush={"p"})), 0.011, 0.012) is None  # ...reported once p finishes
    out = w.execute(_step(_meta(), finished={"p"}), 0.012, 0.013)
    assert out.finished_sending == ("p",)


def test_next_event_is_now_after_a_report_else_the_next_copy_end():
    w = TimedOffloadWorker(bytes_per_gpu_block=1000, link_bytes_per_s=1e6, latency_s=0.0)
    w.execute(_step(_meta(load={"l": 2}), tokens=0), 1.0, 1.0)
    assert w.next_event_s(1.0) == pytest.approx(1.002)
    w.execute(_step(_meta(), tokens=0), 1.002, 1.002)
    assert w.next_event_s(1.002) == 1.002  # the scheduler acts on the report at its next schedule()
    w.execute(_step(_meta(), tokens=0), 1.002, 1.002)
    assert w.next_event_s(1.002) is None


# --- runs ----------------------------------------------------------------------------------------------
def test_a_prefix_evicted_from_the_gpu_is_loaded_from_cpu_and_its_ttft_includes_the_load():
    _, off = _run(_cfg(False))
    engine, on = _run(_cfg(True))
    c_off, c_on = off.metrics.requests["c"], on.metrics.requests["c"]
    # Off: 1 of c's 4 prefix blocks survives b on the GPU; c computes 16 tokens: 1 ms CPU + 5 + 16 ms.
    assert c_off.first_token_s == pytest.approx(10.022)
    # On: b's finished stores are reported by an empty step at 10.0, then c's lookup finds the other
    # 3 blocks in the CPU tier: a 3 ms load (10.000 .. 10.003), reported by the step ending at 10.003;
    # c then computes its last 4 tokens: 1 ms CPU + 5 + 4 ms -> 10.013.
    assert c_on.first_scheduled_s == pytest.approx(10.003)
    assert c_on.first_token_s == pytest.approx(10.013)
    t = engine.kv_offload.totals
    assert (t.num_loads, t.bytes_loaded, t.load_wait_s) == (1, 3 * GPU_BLOCK_BYTES, pytest.approx(0.003))
    # a, b, c each stored their full blocks once: 5 + 10 + 1 (c's 4 new tokens fill its 5th block).
    assert (t.num_stores, t.bytes_stored) == (3, 16 * GPU_BLOCK_BYTES)


def test_a_finished_request_holds_its_blocks_until_its_stores_land():
    _, on = _run(_cfg(True))
    steps = on.metrics.steps_frame()
    # a's 5 blocks stay held after it finished (its stores end at 0.031; nothing steps until b at 5.0):
    # b's first step at 5.0 schedules nothing and reports a's stores; b runs in the next one.
    first_b = steps[steps.start_s >= 5.0].iloc[:2]
    assert list(first_b.num_prefill_tokens) == [0, 40] and list(first_b.num_waiting) == [1, 0]
    assert first_b.kv_usage.iloc[0] == pytest.approx(5 / 11)  # a's 5 prompt blocks, 6 free: b needs 10
    assert on.metrics.requests["b"].first_token_s == pytest.approx(5.046)


def test_offload_runs_decline_the_fast_path_and_are_deterministic():
    engine = Engine(_cfg(True), Workload(list(_SPECS), name="t", source="test"))
    assert "kv_offload" in planner_for(engine).declined
    for async_scheduling in (False, True):
        runs = [_run(_cfg(True, async_scheduling))[1] for _ in range(2)]
        frames = [r.metrics.requests_frame().to_csv() + r.metrics.steps_frame().to_csv() for r in runs]
        assert frames[0] == frames[1]


def test_summary_and_series_report_the_tier_only_when_on(tmp_path):
    from servesim.simulator.outputs import build_summary, write_results

    cfg_on = _cfg(True)
    _, on = _run(cfg_on)
    s = build_summary(cfg_on, on, 3)
    ko = s["kv_offload"]
    # lookups past the GPU hit: a 20 tokens, b 40, c 16 (4 on the GPU); c's 12 came from the CPU tier.
    assert (ko["cpu_query_tokens"], ko["cpu_hit_tokens"], ko["preempted_cpu_hit_tokens"]) == (76, 12, 0)
    assert (ko["num_loads"], ko["bytes_loaded_per_gpu"]) == (1, 3 * GPU_BLOCK_BYTES)
    assert ko["load_wait_s_mean"] == pytest.approx(0.003)
    write_results(tmp_path / "on", cfg_on, on, s, {})
    ts = (tmp_path / "on" / "timeseries.csv").read_text().splitlines()
    header = ts[0].split(",")
    assert header[-3:] == ["offload_cpu_hit_tokens", "offload_load_bytes", "offload_store_bytes"]
    col = {name: [int(float(line.split(",")[i])) for line in ts[1:]] for i, name in enumerate(header)
           if name.startswith("offload_")}
    assert sum(col["offload_cpu_hit_tokens"]) == 12 and col["offload_cpu_hit_tokens"][10] == 12
    assert sum(col["offload_store_bytes"]) == 16 * GPU_BLOCK_BYTES

    cfg_off = _cfg(False)
    _, off = _run(cfg_off)
    s_off = build_summary(cfg_off, off, 3)
    assert "kv_offload" not in s_off and off.kv_offload is None
    write_results(tmp_path / "off", cfg_off, off, s_off, {})
    assert "offload" not in (tmp_path / "off" / "timeseries.csv").read_text()


def test_pd_engines_refuse_the_tier():
    from servesim.simulator.cluster.pd import PrefillEngine

    with pytest.raises(InputError, match="P/D prefill engine"):
        PrefillEngine(_cfg(True))


def test_a_layout_other_than_full_attention_is_refused():
    with pytest.raises(InputError, match="attention layout 'sliding_window'") as exc:
        apply_overrides(SimConfig(), {"kv_offload.num_cpu_blocks": "64", "cache.sliding_window": "128"})
    assert exc.value.field == "cache.attention"
