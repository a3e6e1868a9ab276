"""Completed requests' records retired into columns at their finish (simulator/finished_records.py):
the requests table, the summary and the result files are the same as with every record kept."""

from __future__ import annotations

import dataclasses
import filecmp
import json
import math
from array import array

import numpy as np
import pandas as pd
import pytest

from servesim.running import run
from servesim.simulator.build import build_engine
from servesim.simulator.config import SimConfig
from servesim.simulator.config_values import apply_overrides
from servesim.simulator.engine import Engine
from servesim.simulator.columns import Columns
from servesim.simulator.finished_records import FinishedRecords, retired_table
from servesim.simulator.metrics import MetricsCollector
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


def _kept_table(records: list[RequestRecord]) -> Columns:
    """The table of these records built the plain way (none retired)."""
    collector = MetricsCollector()
    collector.requests.update({r.request_id: r for r in records})
    return collector.request_columns()


def _copy(rec: RequestRecord) -> RequestRecord:
    return dataclasses.replace(rec, token_times_s=array("d", rec.token_times_s))


@pytest.mark.parametrize("release", [False, True])
def test_retired_columns_are_the_records_table(release):
    """Hand-built rows: retired in an order other than arrival, a float column missing in some
    rows and in all, a row with one token (no gap, no TPOT), one with none, live rows among them
    (one still running, one timed out: the row path)."""
    a = _record("a", 3, [1.0, 1.5, 2.25], num_preemptions=2, num_cached_tokens=16, grammar_wait_s=0.125)
    b = _record("b", 1, [0.875])
    c = _record("c", 0, [0.25, 0.5, 0.625, 0.75])
    d = RequestRecord("d", 0.0, 5, 3, first_scheduled_s=0.1, finish_s=0.3, finish_reason="stop", order=5)  # no token
    running = _record("e", 2, [0.5, 0.75])
    running.finish_s = running.finish_reason = None
    timed_out = _record("f", 4, [0.5, 0.625, 1.0])
    timed_out.finish_reason, timed_out.status = "abort", "timed_out"
    for live in ([], [running], [running, timed_out]):
        fin = FinishedRecords()
        for rec in (a, b, c, d):
            assert fin.takes(rec)
            fin.add(_copy(rec))
        table = retired_table([_copy(r) for r in live], fin, release)
        kept = _kept_table([_copy(r) for r in sorted((a, b, c, d, *live), key=lambda r: r.order)])
        pd.testing.assert_frame_equal(table.frame(), kept.frame(), check_exact=True)
        assert table.none_in_frame == kept.none_in_frame and "input_wait_s" in table.none_in_frame
        assert (table.flat("itl_s") is None) == (kept.flat("itl_s") is None) == (timed_out in live)
        if table.flat("itl_s") is not None:
            assert table.flat("itl_s").values.tobytes() == kept.flat("itl_s").values.tobytes()
    assert table["request_id"].tolist() == ["c", "b", "e", "a", "f", "d"]
    assert np.isnan(table["tpot_s"][[1, 5]]).all() and table["tpot_s"][0] == (0.75 - 0.25) / 3


def test_delay_moves_every_output_time():
    fin = FinishedRecords()
    fin.add(_record("a", 0, [1.0, 1.5, 2.25]))
    fin.add(RequestRecord("d", 0.0, 5, 3, first_scheduled_s=0.1, finish_s=0.3, finish_reason="stop", order=1))
    assert fin.last_finish_s() == 2.25 and fin.starts().tolist() == [0, 3, 3]
    fin.delay(0.1)
    assert list(fin.token_times_s) == [t + 0.1 for t in (1.0, 1.5, 2.25)]
    assert list(fin.finish_s) == [2.25 + 0.1, 0.3 + 0.1] and fin.first_token_s[0] == 1.0 + 0.1
    assert math.isnan(fin.first_token_s[1]) and list(fin.arrival_s) == [0.5, 0.0]


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
    """Gaps gathered a few at a time (the last chunk short, rows longer than a chunk alone) as in one go."""
    import servesim.simulator.request_table as T

    sets = {"client.timeout_s": "0.4"}
    whole, _, _, _ = _frames(sets, retire=True)
    monkeypatch.setattr(T, "GAP_CHUNK", 7)
    chunked, _, _, retired = _frames(sets, retire=True)
    assert retired > 7
    pd.testing.assert_frame_equal(chunked, whole, check_exact=True)
