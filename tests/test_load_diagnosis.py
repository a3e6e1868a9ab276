"""The summary's load diagnosis (simulator/summary_metrics/load.py) and readable units."""

from __future__ import annotations

import numpy as np
import pytest

from servesim.report import load_lines, time_unit
from servesim.simulator.columns import Columns
from servesim.simulator.step_fold import fold_columns, step_figures
from servesim.simulator.summary_metrics.load import load


def _requests(arrival, queueing, service_s=0.5):
    arrival, queueing = np.asarray(arrival, float), np.asarray(queueing, float)
    return Columns({"arrival_s": arrival, "queueing_s": queueing, "ttft_s": queueing + 0.05,
                    "finish_s": arrival + queueing + service_s})


def _figures(*engines):
    """StepFigures of engines' steps given as (start_s, duration_s) lists, each in start order."""
    folds = []
    for start, duration in engines:
        n = len(start)
        zeros = np.zeros(n, dtype=np.int64)
        folds.append(fold_columns({"start_s": np.asarray(start, float), "duration_s": np.asarray(duration, float),
                                   "num_prefill_tokens": zeros, "num_decode_tokens": zeros, "num_running": zeros,
                                   "num_waiting": zeros, "kv_usage": np.zeros(n), "num_preemptions": zeros}))
    return step_figures(folds)


STEPS = _figures(([0.0, 0.5, 3.0], [1.0, 1.0, 0.5]))


def test_a_queue_growing_at_slope_4_is_five_times_overloaded():
    arrival = np.linspace(0.0, 100.0, 101)  # 1 req/s offered
    out = load(_requests(arrival, 4.0 * arrival), STEPS, 500.0)
    assert out["queueing_growth"] == pytest.approx(4.0) and out["overload_factor"] == pytest.approx(5.0)
    assert out["offered_requests_per_s"] == pytest.approx(1.0) and out["served_requests_per_s"] == pytest.approx(0.2)
    assert out["overloaded"] is True and out["drain_s"] == pytest.approx(400.5)
    assert out["busy_fraction"] == pytest.approx(2.0 / 500.0)  # [0, 1.5) and [3, 3.5)
    line = "\n".join(load_lines({"metrics": {"load": out}}))
    assert "overloaded about 5.0x" in line and "--rate-scale 0.2" in line


def test_a_flat_queue_is_not_overloaded_however_long_the_tail():
    arrival = np.linspace(0.0, 10.0, 50)
    out = load(_requests(arrival, np.full(50, 0.01), service_s=60.0), STEPS, 70.0)
    assert out["overload_factor"] == 1.0 and out["overloaded"] is False
    assert len(load_lines({"metrics": {"load": out}})) == 1  # the load line, no warning


def test_too_few_requests_give_no_diagnosis():
    assert load(_requests([0.0, 1.0], [0.0, 0.0]), STEPS, 2.0) is None


def test_busy_time_is_the_union_of_overlapping_steps():
    assert STEPS.busy_s == 2.0
    # engines' steps overlap too: the union over all of them
    assert _figures(([2.0], [1.0]), ([0.0, 0.5], [1.0, 0.2])).busy_s == 2.0


@pytest.mark.parametrize("values, unit", [([0.04, 0.2], "ms"), ([2.0, 59.0], "s"), ([30.0, 1139.8], "min"),
                                          ([None, None], "ms")])
def test_latency_units_fit_the_magnitude(values, unit):
    assert time_unit(values)[0] == unit
