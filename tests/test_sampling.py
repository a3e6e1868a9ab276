"""Sampling parameters and the sampler path's cost (simulator/sampling.py): vLLM's path choice,
validation from every entry point, the per-row arithmetic, and whole runs (macro-stepped and plain
identical; the neutral default leaves every float as the cost model gives it)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from servesim.overrides import apply_overrides
from servesim.simulator.config import SimConfig
from servesim.simulator.build import build_engine
from servesim.simulator.sampling import (SORT_S_PER_LOGIT_H100, SORT_S_PER_LOGIT_H100_FROM_128_ROWS, SamplerCost,
                                         SamplingConfig, sampler_cost, sampler_cost_for)
from servesim.simulator.specs import resolve_gpu, resolve_model
from servesim.simulator.validation.generation_defaults import generation_defaults
from servesim.traces.errors import InputError
from servesim.traces.synthetic import make_workload


@pytest.mark.parametrize("params, path", [
    ({}, "random"),  # vLLM's neutral defaults: temperature 1, no top-k / top-p
    ({"top_k": 20}, "top_k"),
    ({"top_k": -1}, "random"),
    ({"top_p": 0.9}, "sort"),
    ({"top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}, "sort"),
    ({"temperature": 0.0, "top_p": 0.5, "top_k": 5}, "greedy"),  # vLLM resets top-p / top-k when greedy
    ({"temperature": 5e-6, "top_p": 0.5}, "greedy"),  # below vLLM's _SAMPLING_EPS
])
def test_path_follows_vllm(params, path):
    assert SamplingConfig(**params).path == path


@pytest.mark.parametrize("key, value, allowed", [
    ("sampling.top_p", 0.0, "0 < top_p <= 1"),
    ("sampling.top_p", 1.5, "0 < top_p <= 1"),
    ("sampling.temperature", -0.1, ">= 0"),
    ("sampling.top_k", -2, "0 / -1"),
    ("sampling.min_p", 2.0, "0 .. 1"),
    ("sampling.repetition_penalty", 0.0, "> 0"),
    ("sampling.presence_penalty", 3.0, "-2 .. 2"),
    ("sampling.temperature", float("nan"), "finite"),
])
def test_bad_values_are_refused_naming_the_field(key, value, allowed):
    with pytest.raises(InputError, match=rf"{key}.*{allowed}".replace("(", r"\(").replace(")", r"\)")):
        apply_overrides(SimConfig(), {key: value})
    with pytest.raises(InputError, match=key):  # the same check from the Python API
        SamplingConfig(**{key.split(".")[1]: value})


def test_overrides_reach_the_config():
    cfg = apply_overrides(SimConfig(), {"sampling.top_p": 0.9, "sampling.top_k": 40})
    assert cfg.sampling == SamplingConfig(top_p=0.9, top_k=40)
    with pytest.raises(InputError, match="top_k"):
        apply_overrides(SimConfig(), {"sampling.top_k": "x"})


def test_sort_path_cost_per_row():
    llama = resolve_model("llama-3.1-8b")
    h100, a100 = resolve_gpu("h100"), resolve_gpu("a100-80gb")
    cost = sampler_cost(SamplingConfig(top_p=0.9), llama.vocab_size, h100.peak_mem_bytes_per_s)
    # Below 128 rows PyTorch runs two full radix sorts; from 128 rows CUB's segmented sort.
    assert cost.seconds(1) == llama.vocab_size * SORT_S_PER_LOGIT_H100
    assert cost.seconds(127) == 127 * cost.s_per_row
    assert cost.seconds(128) == 128 * llama.vocab_size * SORT_S_PER_LOGIT_H100_FROM_128_ROWS
    # 30 rows of a 128k vocabulary: ~1 ms a step on an H100.
    assert cost.seconds(30) == pytest.approx(30 * 128_256 * 0.2718e-9)
    slower = sampler_cost(SamplingConfig(top_p=0.9), llama.vocab_size, a100.peak_mem_bytes_per_s)
    assert slower.s_per_row / cost.s_per_row == pytest.approx(3350 / 2039)  # scaled by memory bandwidth
    for neutral in (SamplingConfig(), SamplingConfig(top_k=50), SamplingConfig(temperature=0, top_p=0.5)):
        assert sampler_cost(neutral, llama.vocab_size, h100.peak_mem_bytes_per_s) == SamplerCost()
    assert sampler_cost_for(SimConfig()) == SamplerCost()


def _workload():
    return make_workload("poisson", {"num_requests": 80, "arrival": {"rate_per_s": 6.0},
                                     "prompt_len": {"dist": "uniform", "low": 50, "high": 900},
                                     "output_len": {"dist": "uniform", "low": 20, "high": 300}},
                         np.random.default_rng(7))


@pytest.mark.parametrize("async_", [True, False])
def test_sort_path_runs_identical_macro_stepped_and_plain(async_):
    wl = _workload()
    cfg = apply_overrides(SimConfig(), {"sampling.top_p": 0.9, "scheduler.async_scheduling": async_})
    plain = build_engine(dataclasses.replace(cfg, macro_steps=False), wl).run()
    eng = build_engine(cfg, wl)
    macro = eng.run()
    assert eng.planner.num_macro_steps > 0
    pd.testing.assert_frame_equal(plain.metrics.requests_frame(), macro.metrics.requests_frame(), check_exact=True)
    pd.testing.assert_frame_equal(plain.metrics.steps_frame(), macro.metrics.steps_frame(), check_exact=True)


def test_every_step_pays_its_rows_and_nothing_else_changes():
    """Same schedule (sync, every request there at t=0, KV never binds): each step's GPU time is
    the neutral run's plus the sort path's cost of the rows it sampled."""
    wl = _workload()
    wl = dataclasses.replace(wl, requests=[dataclasses.replace(r, arrival_time_s=0.0) for r in wl.requests])
    base = apply_overrides(SimConfig(), {"scheduler.async_scheduling": False, "scheduler.max_num_seqs": 256})
    neutral = build_engine(base, wl)
    n_steps = neutral.run().metrics.steps_frame()
    cost = sampler_cost_for(dataclasses.replace(base, sampling=SamplingConfig(top_p=0.9)))
    assert cost.s_per_row > 0
    shapes = []
    eng = build_engine(dataclasses.replace(base, sampling=SamplingConfig(top_p=0.9), macro_steps=False), wl)
    sim = eng.executor

    class Spy:  # the executor is a compiled class (no instance patching): wrap it instead
        def execute(self, so):
            mro, t = sim.execute(so)
            shapes.append((sim.last_shape, t))
            return mro, t

        def __getattr__(self, name):
            return getattr(sim, name)

    eng.executor = Spy()
    s_steps = eng.run().metrics.steps_frame()
    assert len(s_steps) == len(n_steps)
    model = eng.executor.cost_model
    for shape, t in shapes:
        assert t == model.step_time_s(shape) + (cost.seconds(shape.num_sampled) if shape.num_sampled else 0.0)
    pd.testing.assert_series_equal(s_steps["num_requests"], n_steps["num_requests"])
    assert (s_steps["gpu_time_s"] > n_steps["gpu_time_s"]).sum() == sum(1 for s, _ in shapes if s.num_sampled)


def test_generation_defaults():
    qwen, source = generation_defaults("Qwen/Qwen2.5-7B-Instruct")
    assert qwen.path == "sort" and qwen.top_k == 20 and qwen.repetition_penalty == 1.05 and "Qwen" in source
    assert generation_defaults("meta-llama/Llama-3.1-70B-Instruct")[0] == SamplingConfig(temperature=0.6, top_p=0.9)
    neutral, why = generation_defaults("01-ai/Yi-34B")
    assert neutral == SamplingConfig() and "not listed" in why


BLIS = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "benchmarks" / "blis_h100_trainval"


@pytest.mark.skipif(not BLIS.is_dir(), reason="shared BLIS data not present")
def test_blis_runs_sample_with_their_models_defaults():
    from servesim.simulator.validation.blis import blis_config, find_experiment

    cfg, info = blis_config(find_experiment(BLIS, "64"))  # Qwen2.5-7B-Instruct
    assert cfg.sampling.path == "sort" and info["sampling"]["path"] == "sort"
    cfg, info = blis_config(find_experiment(BLIS, "65"))  # Yi-34B: not listed
    assert cfg.sampling == SamplingConfig() and "not listed" in info["sampling"]["source"]
    cfg, info = blis_config(find_experiment(BLIS, "64"), sampling=SamplingConfig(temperature=0.0))
    assert cfg.sampling.path == "greedy" and info["sampling"]["source"] == "given"


def test_validate_sampling_option_is_checked_as_set_is():
    from servesim.commands.validate import _sampling_option

    assert _sampling_option([]) is None  # the run's own rule
    assert _sampling_option(["top_p=0.9", "temperature=0.6"]) == SamplingConfig(temperature=0.6, top_p=0.9)
    with pytest.raises(InputError) as bad:
        _sampling_option(["top_p=1.5"])
    assert bad.value.field == "--sampling top_p" and "top_p <= 1" in bad.value.allowed
    for item in ("sampling.top_p=0.9", "top_p", "=0.5"):
        with pytest.raises(InputError, match="--sampling"):
            _sampling_option([item])
    with pytest.raises(InputError, match="top_q"):  # an unknown field: named, with the valid ones
        _sampling_option(["top_q=0.9"])


@pytest.mark.skipif(not BLIS.is_dir(), reason="shared BLIS data not present")
def test_validate_cli_hands_the_given_sampling_to_both_run_kinds(tmp_path, monkeypatch):
    """A BLIS folder gets it in validate_blis; any other run in ValidateOptions, whose config and
    report carry it (and say it was given)."""
    from typer.testing import CliRunner

    import servesim.simulator.validation.blis as blis
    from servesim.cli import _register, app

    seen = {}
    monkeypatch.setattr(blis, "validate_blis", lambda *a, **kw: seen.update(kw) or {})
    monkeypatch.setattr(blis, "format_blis_report", lambda rep: "report")
    _register()
    res = CliRunner().invoke(app, ["validate", str(BLIS), "--experiment", "64", "--out", str(tmp_path / "o"),
                                   "--sampling", "temperature=0", "--sampling", "top_p=0.5"])
    assert res.exit_code == 0, res.output
    assert seen["sampling"] == SamplingConfig(temperature=0.0, top_p=0.5)  # greedy: top_p then ignored


RTX_RUN = BLIS.parent / "llmservingsim_vllm_runs" / "RTXPRO6000_Llama-3.1-8B"


@pytest.mark.skipif(not RTX_RUN.is_dir(), reason="shared vLLM run not present")
def test_validate_run_config_takes_the_given_sampling():
    from servesim.simulator.validation.replay import ValidateOptions, build_config
    from servesim.simulator.validation.runs import load_run

    run = load_run(RTX_RUN, "auto")
    cfg, info = build_config(run, ValidateOptions())
    assert cfg.sampling == SamplingConfig() and "neutral" in info["sampling"]["source"]
    top_p = SamplingConfig(temperature=0.6, top_p=0.9)
    cfg, info = build_config(run, ValidateOptions(sampling=top_p))
    assert cfg.sampling == top_p and info["sampling"] == {"path": "sort", "source": "given (--sampling)"}
