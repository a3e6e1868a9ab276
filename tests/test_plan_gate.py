"""The planner's backoff (simulator/fastpath/run_length.py): which loop tops attempt a run, and that
a gated planner leaves outputs byte-identical to stepping."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from servesim.overrides import apply_overrides
from servesim.simulator.build import build_engine
from servesim.simulator.config import SimConfig
from servesim.simulator.fastpath.run_length import FREE_FAILURES, MAX_SKIP, MIN_SKIP_CAP, PlanGate
from servesim.traces.synthetic import make_workload


def _pattern(gate: PlanGate, outcomes) -> str:
    """'a' for each attempted loop top, '.' for a skipped one; outcomes(i) is the i-th attempt's
    (steps applied, run pending)."""
    out, i = [], 0
    while i < len(outcomes):
        if gate.should_try():
            gate.record(*outcomes[i])
            out.append("a")
            i += 1
        else:
            out.append(".")
    return "".join(out)


def test_failures_are_free_then_skips_double_up_to_the_cap():
    gate = PlanGate()
    pattern = _pattern(gate, [(0, False)] * (FREE_FAILURES + 8))
    skips = [1, 2, 4, 8, 16, 32, 64, 64]
    assert pattern == "a" * FREE_FAILURES + "".join("." * s + "a" for s in skips)
    assert gate.skip_left == MAX_SKIP  # after the last failure
    assert gate.num_attempts == FREE_FAILURES + 8 and gate.num_skipped == sum(skips)


def test_a_run_ends_the_backoff_and_its_length_caps_the_skip():
    gate = PlanGate()
    _pattern(gate, [(0, False)] * (FREE_FAILURES + 3))
    assert gate.skip_left == 8
    while not gate.should_try():
        pass
    gate.record(10, False)  # a 10-step run
    assert (gate.num_failures, gate.skip_left, gate.num_runs, gate.skip_cap()) == (0, 0, 1, 10)
    pattern = _pattern(gate, [(0, False)] * (FREE_FAILURES + 6))
    assert pattern == "a" * FREE_FAILURES + ".a..a....a........a" + ".........." + "a" + ".........." + "a"


def test_one_step_tails_are_neutral_and_deferred_runs_succeed():
    gate = PlanGate()
    for _ in range(FREE_FAILURES - 1):
        assert gate.should_try()
        gate.record(0, False)
    assert gate.should_try()
    gate.record(1, False)  # an async tail step alone: neither a failure nor a run
    assert (gate.num_failures, gate.skip_left, gate.num_runs) == (FREE_FAILURES - 1, 0, 0)
    assert gate.should_try()
    gate.record(0, False)
    assert gate.skip_left == 1
    assert not gate.should_try() and gate.should_try()
    gate.record(0, True)  # a cluster replica's deferred run
    assert gate.num_failures == 0 and gate.skip_left == 0
    assert gate.skip_cap() == MAX_SKIP  # no eager run measured yet


def test_short_runs_keep_the_cap_floor():
    gate = PlanGate()
    gate.record(2, False)
    assert gate.skip_cap() == MIN_SKIP_CAP


def _prefill_bound_workload(n: int, seed: int):
    # long prompts arriving faster than they prefill: a chunk in nearly every step while the queue
    # lasts (attempts fail, the gate backs off), then plain decodes as it drains (runs again)
    return make_workload("poisson", {
        "num_requests": n, "arrival": {"rate_per_s": 20.0},
        "prompt_len": {"dist": "lognormal", "median": 3000, "sigma": 0.4, "max_value": 8000},
        "output_len": {"dist": "lognormal", "median": 60, "sigma": 0.5, "max_value": 300},
    }, np.random.default_rng(seed))


@pytest.mark.parametrize("sets", [{}, {"scheduler.async_scheduling": False}])
def test_a_backed_off_planner_is_identical_to_stepping(sets):
    """Prefill-bound traffic: the gate skips loop tops (stepped), runs resume once the queue drains,
    and the requests, the step rows and the prefix totals are stepping's."""
    wl = _prefill_bound_workload(120, seed=11)
    cfg = apply_overrides(SimConfig(), {"scheduler.max_num_batched_tokens": 2048, **sets})
    plain = build_engine(dataclasses.replace(cfg, macro_steps=False), wl).run()
    eng = build_engine(dataclasses.replace(cfg, macro_steps=True), wl)
    macro = eng.run()
    pd.testing.assert_frame_equal(plain.metrics.requests_frame(), macro.metrics.requests_frame(), check_exact=True)
    pd.testing.assert_frame_equal(plain.metrics.steps_frame(), macro.metrics.steps_frame(), check_exact=True)
    assert (plain.num_steps, plain.prefix_hits, plain.prefix_queries) == (macro.num_steps, macro.prefix_hits,
                                                                         macro.prefix_queries)
    gate = eng.planner.gate
    assert gate.num_skipped > 0 and gate.num_runs > 0 and eng.planner.num_macro_runs > 0
