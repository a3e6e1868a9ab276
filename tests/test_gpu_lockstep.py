"""Lock-step: the GPU executor (real model on CPU) and the simulated executor produce identical
SchedulerOutputs and step traces; the GPU paths refuse clearly without CUDA."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import numpy as np

from servesim.api import run
from servesim.traces.synthetic import make_workload
from servesim.overrides import apply_overrides
from servesim.simulator.config import SimConfig
from servesim.traces.errors import InputError


def small_workload(n: int):
    """Short prompts: the CPU torch backend stays fast, and chunking, prefix groups and decodes all occur."""
    return make_workload("poisson", {"num_requests": n, "arrival": {"rate_per_s": 50.0},
                                     "prompt_len": {"dist": "uniform", "low": 20, "high": 120},
                                     "output_len": {"dist": "uniform", "low": 2, "high": 12}},
                         np.random.default_rng(0))


def tiny_cfg(**kw) -> SimConfig:
    cfg = SimConfig()
    cfg.hardware = dataclasses.replace(cfg.hardware, model="tiny-llama")
    return apply_overrides(cfg, {"cache.num_gpu_blocks": 512, "cache.block_size": 16, **kw})


@pytest.mark.slow
def test_sim_and_gpu_cpu_write_identical_step_traces(tmp_path):
    from servesim.gpu import make_gpu_executor

    wl = small_workload(8)
    cfg = tiny_cfg(**{"scheduler.max_num_batched_tokens": 64, "scheduler.max_num_seqs": 64})  # forces chunked prefills
    run(cfg, wl, step_trace=tmp_path / "a.jsonl")
    exe = make_gpu_executor(cfg, device="cpu", clock="model")
    res_gpu = run(cfg, wl, step_trace=tmp_path / "b.jsonl", executor=exe)
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    assert res_gpu.summary["num_finished"] == 8
    # Every executed step pairs the cost model's prediction with a measured time.
    assert exe.timings and all(t.predicted_s is not None and t.measured_s > 0 for t in exe.timings)


def test_measured_clock_and_greedy_sampling_run(tmp_path):
    from servesim.gpu import make_gpu_executor

    wl = small_workload(2)
    cfg = tiny_cfg(**{"scheduler.max_num_batched_tokens": 256})
    exe = make_gpu_executor(cfg, device="cpu", clock="measured", sampling="greedy")
    res = run(cfg, wl, executor=exe)
    assert res.summary["num_finished"] == 2
    steps = res.steps
    assert (steps["duration_s"] > 0).all()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cuda_refused_with_a_clear_message():
    from servesim.gpu import make_gpu_executor

    with pytest.raises(InputError, match="needs a CUDA GPU"):
        make_gpu_executor(tiny_cfg(), device="cuda")


def test_unknown_model_preset_and_oversized_cpu_cache_refused():
    from servesim.gpu import make_gpu_executor

    cfg = SimConfig()
    cfg.hardware = dataclasses.replace(cfg.hardware, model="mixtral-8x7b")
    with pytest.raises(InputError, match="Mixture-of-Experts"):  # a model the runner cannot run
        make_gpu_executor(cfg, device="cpu")
    big = dataclasses.replace(SimConfig(), hardware=dataclasses.replace(SimConfig().hardware, model="llama-3.1-8b"))
    with pytest.raises(InputError, match="GiB on the CPU"):
        make_gpu_executor(big, device="cpu")


def test_warmup_runs_every_shape_and_leaves_results_unchanged(tmp_path):
    from servesim.gpu import make_gpu_executor

    wl = small_workload(4)
    cfg = tiny_cfg(**{"scheduler.max_num_batched_tokens": 64, "scheduler.max_num_seqs": 64})
    exe = make_gpu_executor(cfg, device="cpu", clock="model", sampling="greedy")
    assert exe.warmup() == 6
    run(cfg, wl, executor=exe, step_trace=tmp_path / "warm.jsonl")
    exe2 = make_gpu_executor(cfg, device="cpu", clock="model", sampling="greedy")
    run(cfg, wl, executor=exe2, step_trace=tmp_path / "cold.jsonl")
    # Warm-up writes only KV slots that real steps overwrite before reading: the same greedy tokens
    # (the step traces record every sampled token id).
    assert (tmp_path / "warm.jsonl").read_bytes() == (tmp_path / "cold.jsonl").read_bytes()


def test_top_p_sampling_priced_alike_by_the_gpu_runner_and_the_simulator():
    """sampling.top_p < 1: the runner's model clock adds the simulator's sampler price (same
    floats, same steps), and its measured steps run the sort path on the real logits."""
    from servesim.gpu import make_gpu_executor

    wl = small_workload(3)
    top_p = {"sampling.temperature": 0.6, "sampling.top_p": 0.9}
    cfg, neutral = tiny_cfg(**top_p), tiny_cfg()
    sim = run(cfg, wl)
    exe = make_gpu_executor(cfg, device="cpu", clock="model")
    assert exe.top_p == 0.9 and exe.sampler_s is not None
    gpu = run(cfg, wl, executor=exe)
    cols = ["start_s", "duration_s", "gpu_time_s", "num_requests"]
    assert sim.steps[cols].equals(gpu.steps[cols])
    base = run(neutral, wl).steps
    ran, ran_base = sim.steps[sim.steps["num_requests"] > 0], base[base["num_requests"] > 0]
    assert len(ran) == len(ran_base)
    assert (ran["gpu_time_s"].to_numpy() > ran_base["gpu_time_s"].to_numpy()).all()  # each samples a row
    measured = make_gpu_executor(cfg, device="cpu", clock="measured")
    assert run(cfg, wl, executor=measured).summary["num_finished"] == 3
    assert make_gpu_executor(neutral, device="cpu").top_p == 1.0  # no top-p: no sort


def test_top_p_sort_path_keeps_the_smallest_set_reaching_top_p():
    from servesim.gpu_runner.runner import top_p_sort_path

    logits = torch.randn(4, 300, generator=torch.Generator().manual_seed(0))  # [S, vocab]
    probs = logits.softmax(dim=-1)
    out = top_p_sort_path(logits, 0.8)
    for row in range(4):
        kept = torch.isfinite(out[row])
        assert torch.equal(out[row][kept], logits[row][kept])  # kept logits unchanged, in place
        assert bool(kept[logits[row].argmax()])
        mass = probs[row][kept].sum().item()
        assert mass >= 0.8 and mass - probs[row][kept].min().item() < 0.8  # minimal: one fewer falls short
    assert torch.isfinite(top_p_sort_path(logits, 1e-6)).sum(dim=-1).tolist() == [1, 1, 1, 1]
