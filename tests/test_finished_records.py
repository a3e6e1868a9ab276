"""Completed requests' records retired into columns at their finish (simulator/finished_records.py):
the requests table, the summary and the result files are the same as with every record kept."""

from __future__ import annotations

import filecmp
import json
from array import array

import numpy as np
import pandas as pd
import pytest

from servesim.running import run
from servesim.simulator.build import build_engine
from servesim.simulator.config import SimConfig
from servesim.simulator.config_values import apply_overrides
from servesim.simulator.engine import Engine
from servesim.simulator.finished_records import FinishedRecords
from servesim.simulator.request_records import RequestRecord
from servesim.traces.bench import BenchConfig, bench_workload


def _workload(n: int = 400):
    return bench_workload(BenchConfig(dataset_name="random", num_prompts=n, random_input_len=200,
                                      random_output_len=40, random_range_ratio=0.5, request_rate=60.0))


def _frames(sets: dict, retire: bool):
    engine = build_engine(apply_overrides(SimConfig(), sets), _workload())
    if retire:
        engine.retire_finished_records()
    res = engine.run()
    retired = len(res.metrics.finished) if res.metrics.finished is not None else 0
    table = res.metrics.columns(release=True)
    return table.requests.frame(), table.steps.frame(), res.sim_duration_s, retired


@pytest.mark.parametrize("sets", [
    {},  # macro-steps on: runs through finishes
    {"macro_steps": "false"},
    {"frontend.enabled": "true", "frontend.serial": "false"},  # the output delay moves retired times too
    {"client.timeout_s": "0.4"},  # timed-out rows: the row path (by_row), retired rows among them
    {"engine": "sglang"},
], ids=["plain", "stepping", "frontend", "timeouts", "sglang"])
def test_retired_records_build_the_same_tables(sets):
    kept_req, kept_steps, kept_end, none = _frames(sets, retire=False)
    req, steps, end, retired = _frames(sets, retire=True)
    assert none == 0 and 0 < retired <= len(req)
    pd.testing.assert_frame_equal(req, kept_req, check_exact=True)
    pd.testing.assert_frame_equal(steps, kept_steps, check_exact=True)
    assert end == kept_end
    if "client.timeout_s" in sets:
        assert (req["status"] == "timed_out").sum() > 0 and retired < len(req)


def test_the_serial_loop_keeps_its_records():
    """Its output jobs move a finished request's times when delivered: nothing is retired."""
    engine = build_engine(apply_overrides(SimConfig(), {"frontend.enabled": "true", "frontend.serial": "true"}),
                          _workload(50))
    engine.retire_finished_records()
    res = engine.run()
    assert res.metrics.finished is None and len(res.metrics.requests) == 50


def test_result_folders_are_byte_identical(tmp_path, monkeypatch):
    wl, cfg = _workload(300), apply_overrides(SimConfig(), {"frontend.enabled": "true", "frontend.serial": "false"})
    run(cfg, wl, out_dir=tmp_path / "retired")
    monkeypatch.setattr(Engine, "retire_finished_records", lambda self: None)
    run(cfg, wl, out_dir=tmp_path / "kept")
    for name in ("requests.parquet", "steps.parquet", "timeseries.csv", "config.yaml"):
        assert filecmp.cmp(tmp_path / "retired" / name, tmp_path / "kept" / name, shallow=False), name
    a, b = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("retired", "kept"))
    for s in (a, b):  # (the host's time, not the run's)
        s.pop("wall_time_s"), s.pop("sim_speedup_x")
    assert a == b


def _record(rid: str, order: int, times: list[float], **kw) -> RequestRecord:
    return RequestRecord(rid, 0.5, 10, len(times), first_scheduled_s=0.75, first_token_s=times[0], finish_s=times[-1],
                         token_times_s=array("d", times), finish_reason="length", order=order, **kw)


def test_a_record_reads_back_as_it_went_in():
    fin = FinishedRecords()
    a = _record("a", 3, [1.0, 1.5, 2.25], num_preemptions=2, num_cached_tokens=16, grammar_wait_s=0.125)
    b = _record("b", 1, [0.875])
    for rec in (a, b):
        assert fin.takes(rec)
        fin.add(rec)
    starts = fin.starts()
    assert starts.tolist() == [0, 3, 4] and len(fin) == 2
    assert fin.record(0, 0) == a and fin.record(1, 3) == b
    assert fin.record(1, 3).grammar_wait_s is None and fin.record(1, 3).first_scheduled_s == 0.75
    assert fin.last_finish_s() == 2.25
    fin.delay(0.1)
    assert list(fin.token_times_s) == [t + 0.1 for t in (1.0, 1.5, 2.25, 0.875)]
    assert fin.record(0, 0).first_token_s == 1.0 + 0.1 and fin.record(0, 0).arrival_s == 0.5


def test_only_completed_records_are_taken():
    done = _record("a", 0, [1.0])
    assert FinishedRecords().takes(done)
    for change in ({"finish_reason": "abort"}, {"status": "timed_out"}, {"reject_reason": "too_long"},
                   {"finish_s": None}, {"finish_reason": None}):
        rec = _record("a", 0, [1.0])
        for k, v in change.items():
            setattr(rec, k, v)
        assert not FinishedRecords().takes(rec), change


def test_small_chunks_give_the_same_table(monkeypatch):
    """Rows gathered and built a few at a time (the last chunk short) as in one go."""
    import servesim.simulator.finished_records as FR
    import servesim.simulator.metrics as M

    sets = {"client.timeout_s": "0.4"}
    whole, _, _, _ = _frames(sets, retire=True)
    monkeypatch.setattr(FR, "_GATHER_ROWS", 7)
    monkeypatch.setattr(M, "RELEASE_ROWS", 7)
    chunked, _, _, retired = _frames(sets, retire=True)
    assert retired > 7
    pd.testing.assert_frame_equal(chunked, whole, check_exact=True)
