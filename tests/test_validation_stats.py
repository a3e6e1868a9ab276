"""Validation machinery on hand-made runs: adapters, pairing by id, statistics, self-consistency."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from servesim.simulator.validation import load_run, pair_requests, per_request_errors, timeseries_errors
from servesim.simulator.validation.compare import aggregate_errors, ttft_by_admission
from servesim.simulator.validation.kv import choose_kv_blocks
from servesim.simulator.validation.runs import available_run_formats, to_measured_convention, vllm_defaults
from servesim.traces.errors import InputError

# (request id, in, out, arrival wall s, queued, scheduled, first token, last token)
TINY = [
    ("bench-0", 100, 11, 1000.00, 50.00, 50.00, 50.10, 51.10),
    ("bench-1", 200, 21, 1000.50, 50.50, 50.60, 50.80, 52.80),
    ("bench-2", 300, 5, 1001.00, 51.00, 51.50, 51.90, 52.30),
    ("bench-3", 50, 1, 1001.20, 51.20, 51.20, 51.30, 51.30),
]


def write_tiny_run(path, engine_kwargs=None, meta_extra=None, kv_zero=True):
    path.mkdir(parents=True, exist_ok=True)
    meta = {"model": "meta-llama/Llama-3.1-8B", "vllm_version": "0.19.0",
            "engine_kwargs": {"tensor_parallel_size": 1, "max_num_seqs": 8, "max_num_batched_tokens": 512,
                              "max_model_len": None, **(engine_kwargs or {})}, **(meta_extra or {})}
    (path / "meta.json").write_text(json.dumps(meta))
    (path / "requests.jsonl").write_text("".join(json.dumps(dict(zip(
        ("request_id", "input_toks", "output_toks", "arrival_time", "queued_ts", "scheduled_ts", "first_token_ts",
         "last_token_ts"), r))) + "\n" for r in TINY))
    (path / "timeseries.csv").write_text("t,prompt_throughput,gen_throughput,running,waiting,kv_cache_pct\n"
                                         f"1.0,300,10,2,1,{0.0 if kv_zero else 5.0}\n"
                                         f"2.0,350,20,3,0,{0.0 if kv_zero else 7.0}\n")
    return path


def test_llmservingsim_adapter_reads_settings_and_latencies(tmp_path):
    run = load_run(write_tiny_run(tmp_path / "RTXPRO6000_Llama-3.1-8B"))
    assert run.format == "llmservingsim"
    s = run.settings
    assert (s.max_num_seqs, s.max_num_batched_tokens, s.tp, s.max_model_len) == (8, 512, 1, None)
    assert s.async_scheduling is True and "default" in s.provenance["async_scheduling"]
    assert s.provenance["max_num_seqs"].startswith("recorded")
    assert s.num_gpu_blocks is None and s.gpu == "rtx-pro-6000" and "folder" in s.provenance["gpu"]
    r = run.requests.set_index("request_id")
    assert r.loc["bench-1", "ttft_s"] == pytest.approx(0.30)
    assert r.loc["bench-1", "e2e_s"] == pytest.approx(2.30)
    assert r.loc["bench-1", "tpot_s"] == pytest.approx(2.0 / 20)
    assert r.loc["bench-2", "queueing_s"] == pytest.approx(0.5)
    assert math.isnan(r.loc["bench-3", "tpot_s"])  # one output token: no TPOT
    assert r.loc["bench-2", "arrival_s"] == pytest.approx(1.0)
    assert list(r["workload_index"]) == [0, 1, 2, 3]
    assert any("kv_cache_pct" in n for n in run.notes)


def test_adapter_uses_recorded_blocks_and_device(tmp_path):
    run = load_run(write_tiny_run(tmp_path / "somewhere", meta_extra={
        "kv_cache": {"num_gpu_blocks": 1234}, "hardware": {"device_name": "NVIDIA H100 80GB HBM3"}}))
    assert run.settings.num_gpu_blocks == 1234 and run.settings.gpu == "NVIDIA H100 80GB HBM3"
    kv = choose_kv_blocks("llama-3.1-8b", "h100", 1, 16, 0.9, 512, 8, recorded=1234, given=99)
    assert (kv.num_gpu_blocks, kv.source) == (1234, "recorded")
    assert choose_kv_blocks("llama-3.1-8b", "h100", 1, 16, 0.9, 512, 8, given=99).source == "given"
    derived = choose_kv_blocks("llama-3.1-8b", "rtx-pro-6000", 1, 16, 0.9, 2048, 128)
    # 0.9 x 95.6 GiB - 15 GiB weights - ~1.2 GiB activations = ~70 GiB at 2 MiB per block
    assert derived.source == "derived" and 33_000 < derived.num_gpu_blocks < 38_000
    assert derived.blocks_with_project_default_reserve < derived.num_gpu_blocks


def test_unknown_layout_and_format_errors(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError):
        load_run(tmp_path / "empty")
    with pytest.raises(InputError):
        load_run(write_tiny_run(tmp_path / "r"), fmt="nope")
    assert {"llmservingsim", "servesim"} <= set(available_run_formats())


def test_vllm_version_defaults():
    assert vllm_defaults("0.19.0")["async_scheduling"][0] is True
    assert vllm_defaults("0.12.0")["async_scheduling"][0] is False
    assert vllm_defaults(None)["async_scheduling"][0] is False


def _sim_frame(ids, ttft, tpot, e2e, queue, prompt=(100, 200, 300, 50), out=(11, 21, 5, 1)):
    return pd.DataFrame({"request_id": ids, "arrival_s": [0.0, 0.5, 1.0, 1.2], "prompt_len": prompt,
                         "output_len": out, "ttft_s": ttft, "tpot_s": tpot, "e2e_s": e2e, "queueing_s": queue})


def test_pairing_by_workload_order_and_by_id(tmp_path):
    run = load_run(write_tiny_run(tmp_path / "r"))
    wl_ids = [f"llmservingsim-{i}" for i in range(4)]
    sim = _sim_frame(wl_ids[::-1], [0.1] * 4, [0.1] * 4, [1.0] * 4, [0.0] * 4,
                     prompt=(50, 300, 200, 100), out=(1, 5, 21, 11))  # reversed order on purpose
    paired, info = pair_requests(run.requests, sim, wl_ids)
    assert info["method"].startswith("workload order") and info["num_paired"] == 4
    assert info["num_length_mismatch"] == 0
    assert list(paired["sim_request_id"]) == wl_ids
    same = _sim_frame(["bench-0", "bench-1", "bench-2", "bench-3"], [0.1] * 4, [0.1] * 4, [1.0] * 4, [0.0] * 4,
                      prompt=(100, 200, 300, 51))
    paired, info = pair_requests(run.requests, same)
    assert info["method"] == "request_id" and info["num_length_mismatch"] == 1
    with pytest.raises(InputError):
        pair_requests(run.requests, sim)  # no shared ids and no workload to map through
    with pytest.raises(InputError):
        pair_requests(run.requests, sim, wl_ids[:2])  # workload shorter than the run


def test_statistics_on_known_numbers(tmp_path):
    run = load_run(write_tiny_run(tmp_path / "r"))
    ids = ["bench-0", "bench-1", "bench-2", "bench-3"]
    m = run.requests.set_index("request_id").loc[ids]
    ttft = m["ttft_s"].to_numpy() * np.array([1.1, 0.9, 1.0, 1.0])  # +10 %, -10 %, 0, 0
    e2e = m["e2e_s"].to_numpy() * np.array([1.2, 1.0, 1.0, 1.0])
    tpot = m["tpot_s"].to_numpy() * np.array([1.0, 1.5, 1.0, 1.0])
    sim = _sim_frame(ids, ttft, tpot, e2e, m["queueing_s"].to_numpy() + 0.25)
    paired, _ = pair_requests(run.requests, sim)
    pr = per_request_errors(paired)
    assert pr["ttft"]["mape"] == pytest.approx(0.05)
    assert pr["ttft"]["median_ape"] == pytest.approx(0.05)
    assert pr["e2e"]["mape"] == pytest.approx(0.05) and pr["e2e"]["median_ape"] == pytest.approx(0.0)
    assert pr["tpot"]["n"] == 3 and pr["tpot"]["mape"] == pytest.approx(0.5 / 3)
    assert pr["queueing"]["mae_s"] == pytest.approx(0.25)
    agg = aggregate_errors(paired)
    e = agg["e2e"]["mean"]
    assert e["measured"] == pytest.approx(m["e2e_s"].mean())
    assert e["error"] == pytest.approx((e2e.mean() - m["e2e_s"].mean()) / m["e2e_s"].mean())
    assert set(agg) == {"ttft", "tpot", "e2e", "queueing"}
    assert set(agg["ttft"]) == {"mean", "p50", "p90", "p99"}
    split = ttft_by_admission(paired)
    assert split["admitted_at_once"]["n"] == 2 and split["queued"]["n"] == 2


def test_timeseries_mae_and_invalid_reference():
    meas = pd.DataFrame({"t_s": [1.0, 2.0, 3.0], "running": [2, 3, 0], "waiting": [1, 0, 0],
                         "kv_cache_pct": [0.0, 0.0, 0.0]})
    sim = pd.DataFrame({"t_s": [0.0, 1.0, 2.0], "running": [0, 3, 3], "waiting": [0, 1, 1],
                        "kv_cache_pct": [0.0, 10.0, 20.0]})
    out = timeseries_errors(meas, sim)
    assert out["running"]["mae"] == pytest.approx((1 + 0 + 0) / 3)  # t=3 is past the sim's end: 0
    assert out["waiting"]["mae"] == pytest.approx((0 + 1 + 0) / 3)
    assert out["kv_cache_pct"]["measured_valid"] is False and "note" in out["kv_cache_pct"]


def test_sim_series_moves_throughput_one_tick():
    sim = pd.DataFrame({"t_s": [0.0, 1.0, 2.0], "running": [1, 2, 3], "waiting": [0, 0, 0],
                        "kv_cache_pct": [1.0, 2.0, 3.0], "prefill_tokens_per_s": [10.0, 20.0, 30.0],
                        "decode_tokens_per_s": [1.0, 2.0, 3.0]})
    out = to_measured_convention(sim)
    assert list(out["running"]) == [1, 2, 3]
    assert list(out["prompt_tokens_per_s"]) == [0.0, 10.0, 20.0]


def test_self_validation_of_a_simulated_run_is_exact(tmp_path):
    """A servesim result folder validated against the same configuration: zero error everywhere."""
    from servesim.api import run as api_run
    from servesim.simulator.config import CostModelConfig, HardwareConfig, SimConfig
    from servesim.scheduler.config import CacheConfig, SchedulerConfig
    from servesim.validation_report import ValidateOptions, validate_run
    from servesim.traces.formats import load_workload

    wl_path = tmp_path / "wl.jsonl"
    rng = np.random.default_rng(1)
    rows = [{"input_toks": int(rng.integers(20, 400)), "output_toks": int(rng.integers(2, 60)),
             "arrival_time_ns": int(i * 2e7)} for i in range(40)]
    wl_path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = SimConfig(hardware=HardwareConfig(model="llama-3.1-8b", gpu="h100"),
                    scheduler=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=512, max_model_len=1024,
                                              async_scheduling=True),
                    cache=CacheConfig(num_gpu_blocks=400), derive_num_gpu_blocks=False,
                    cost_model=CostModelConfig(name="roofline"))
    api_run(cfg, load_workload(wl_path, "llmservingsim"), out_dir=tmp_path / "simrun")
    rep = validate_run(tmp_path / "simrun", wl_path, ValidateOptions(cost_model="roofline", cpu_overhead="default",
                                                                     plots=False), out_dir=tmp_path / "val")
    assert rep["run"]["format"] == "servesim" and rep["pairing"]["method"] == "request_id"
    assert rep["kv_cache"]["source"] == "recorded" and rep["kv_cache"]["num_gpu_blocks"] == 400
    for m in ("ttft", "tpot", "e2e"):
        assert rep["per_request"][m]["mape"] == pytest.approx(0.0, abs=1e-9)
    for name in ("running", "waiting", "kv_cache_pct"):
        assert rep["timeseries"][name]["mae"] == pytest.approx(0.0, abs=1e-9)
    assert (tmp_path / "val" / "validation.json").exists()
