"""The exact fast-forward gives the same per-request and per-step results as plain stepping."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from servesim.api import load_trace
from servesim.overrides import apply_overrides
from servesim.simulator.config import SimConfig
from servesim.simulator.engine import Engine
from servesim.traces.synthetic import make_workload


SYNC = {"scheduler.async_scheduling": False}  # fast-forward covers the synchronous engine loop


def _run(cfg, wl, ff):
    e = Engine(dataclasses.replace(cfg, fast_forward=ff), wl)
    res = e.run()
    return res, e


def _same(cfg, wl):
    a, _ = _run(cfg, wl, False)
    b, eng = _run(cfg, wl, True)
    ra, rb = a.metrics.requests_frame(), b.metrics.requests_frame()
    pd.testing.assert_frame_equal(ra, rb, check_exact=True)
    pd.testing.assert_frame_equal(a.metrics.steps_frame(), b.metrics.steps_frame(), check_exact=True)
    assert a.prefix_hits == b.prefix_hits and a.prefix_queries == b.prefix_queries
    return eng._ff.num_fast_steps, a.num_steps


def test_light_poisson_load_is_mostly_fast_forwarded_and_identical():
    wl = make_workload("poisson", {"num_requests": 60, "arrival": {"rate_per_s": 2.0},
                                   "prompt_len": {"dist": "uniform", "low": 50, "high": 600},
                                   "output_len": {"dist": "uniform", "low": 20, "high": 300}},
                       np.random.default_rng(1))
    fast, total = _same(apply_overrides(SimConfig(), SYNC), wl)
    assert fast > total // 2


@pytest.mark.parametrize("sets", [
    {},
    # KV pressure: preemptions around stretches (max_model_len within the pool: vLLM's start-up check)
    {"cache.num_gpu_blocks": 400, "cache.block_size": 16, "scheduler.max_model_len": 6400},
    {"scheduler.policy": "priority", "cache.num_gpu_blocks": 300, "scheduler.max_model_len": 4800},
    {"cache.enable_prefix_caching": False, "scheduler.max_num_seqs": 8},
])
@pytest.mark.slow
def test_bundled_trace_identical_with_and_without_fast_forward(sets):
    wl = load_trace(None, max_requests=80)
    cfg = apply_overrides(SimConfig(), {**SYNC, **sets})
    fast, total = _same(cfg, wl)
    assert fast > 0


def test_fast_forward_stays_off_where_it_cannot_be_exact():
    cfg = apply_overrides(SimConfig(), {"scheduler.async_scheduling": True})
    e = Engine(dataclasses.replace(cfg, fast_forward=True), load_trace(None, max_requests=5))
    assert not e._ff.enabled
