"""Inputs the simulator must bound: absolute epoch arrival times, arrivals far apart, and the time
series of a run that spans weeks (issue: unbounded inputs)."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from servesim.simulator import metrics, step_fold
from servesim.simulator.columns import Columns
from servesim.traces.errors import InputError
from servesim.traces.formats import load_workload
from servesim.traces.workload import MAX_SPAN_S, RequestSpec, Workload


def _trace(path, arrivals):
    path.write_text("".join(json.dumps({"request_id": f"r{i}", "arrival_time_s": t, "prompt_len": 20,
                                        "output_len": 4}) + "\n" for i, t in enumerate(arrivals)))
    return path


def test_epoch_arrivals_are_rebased_with_a_note(tmp_path, caplog):
    path = _trace(tmp_path / "epoch.jsonl", [1.7e9 + 0.25, 1.7e9 + 1.0, 1.7e9 + 3.5])
    with caplog.at_level(logging.WARNING, logger="servesim"):
        wl = load_workload(path)
    assert [r.arrival_time_s for r in wl.requests] == [0.0, 0.75, 3.25]
    assert "rebased" in wl.source and "epoch" in wl.source
    assert any("rebased" in rec.getMessage() for rec in caplog.records)


def test_relative_arrivals_are_left_alone():
    wl = Workload([RequestSpec("a", 5.0, 10, 2), RequestSpec("b", 9.5e7, 10, 2)], "w", "src")
    assert [r.arrival_time_s for r in wl.requests] == [5.0, 9.5e7] and wl.source == "src"


def test_an_arrival_beyond_the_span_names_the_request_and_file(tmp_path):
    path = _trace(tmp_path / "far.jsonl", [0.0, 1.0, 1e300])
    with pytest.raises(InputError) as err:
        load_workload(path)
    msg = str(err.value)
    assert "far.jsonl" in msg and "'r2'" in msg and "arrival_time_s" in msg and f"{MAX_SPAN_S:.0e}" in msg


def _steps(starts, tokens):
    n = len(starts)
    return Columns({"start_s": np.asarray(starts, float), "num_prefill_tokens": np.asarray(tokens),
                    "num_decode_tokens": np.arange(n), "num_running": np.arange(1, n + 1),
                    "num_waiting": np.zeros(n, int), "kv_usage": np.linspace(0.1, 0.4, n)})


def test_a_run_spanning_weeks_gets_a_sparse_series_equal_to_the_dense_one_at_its_ticks(monkeypatch):
    steps = _steps([0.2, 0.7, 5.5, 2e6 + 0.1, 2e6 + 0.9], [10, 0, 3, 7, 1])
    sparse = metrics.timeseries_from_steps(steps, 2e6 + 3).frame()
    assert sparse["t_s"].tolist() == [0.0, 1.0, 5.0, 6.0, 2e6, 2e6 + 1, 2e6 + 3]
    assert sparse["prefill_tokens_per_s"].tolist() == [10.0, 0.0, 3.0, 0.0, 8.0, 0.0, 0.0]
    monkeypatch.setattr(step_fold, "MAX_DENSE_TICKS", 10**8)
    dense = metrics.timeseries_from_steps(steps, 2e6 + 3).frame().set_index("t_s")
    assert len(dense) == 2_000_004
    assert dense.loc[sparse["t_s"]].reset_index().equals(sparse)


def test_a_short_run_keeps_every_second():
    frame = metrics.timeseries_from_steps(_steps([0.5, 2.5], [4, 5]), 3.2).frame()
    assert frame["t_s"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert frame["running"].tolist() == [0, 1, 1, 2] and frame["prefill_tokens_per_s"].tolist() == [4, 0, 5, 0]


BOMB = "[" + ", ".join(
    ["&a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"] + [f"&{b} [{', '.join(['*' + a] * 10)}]" for a, b in zip("abcd", "bcde")]
    + ["[" + ", ".join(["*e"] * 10) + "]"]) + "]"


def test_a_set_value_that_expands_through_aliases_is_refused_fast():
    from servesim.simulator.config import SimConfig
    from servesim.simulator.config_values import apply_overrides

    with pytest.raises(InputError, match=r"--set scheduler.max_num_seqs.*expands to 1.23e\+06 values"):
        apply_overrides(SimConfig(), {"scheduler.max_num_seqs": BOMB})


def test_plain_yaml_with_aliases_still_loads():
    from servesim.simulator.yaml_input import expanded_size, safe_load_bounded

    assert safe_load_bounded("x: &x [1, 2]\ny: *x\n") == {"x": [1, 2], "y": [1, 2]}
    import yaml

    assert expanded_size(yaml.compose("x: &x [1, 2]\ny: *x\n")) == 9  # map, 2 keys, the list (3) twice


def test_draft_model_budget_without_chunking_is_refused_at_start_up():
    """A draft model keeps max_num_seqs slots of the budget; with chunked prefill off a prompt
    between the two budgets would wait forever (vLLM checks only max_num_batched_tokens)."""
    from servesim.scheduler.config import SchedulerConfig

    common = dict(max_num_batched_tokens=2048, max_num_seqs=64, enable_chunked_prefill=False,
                  num_spec_tokens=3, spec_method="draft_model")
    with pytest.raises(ValueError, match=r"max_num_batched_tokens - max_num_seqs \(1984\) must be >= max_model_len \(2048\)"):
        SchedulerConfig(max_model_len=2048, **common)
    assert SchedulerConfig(max_model_len=1984, **common).max_num_scheduled_tokens == 1984
    assert SchedulerConfig(max_model_len=2048, **dict(common, spec_method="eagle")).max_num_scheduled_tokens == 2048
