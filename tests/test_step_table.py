"""StepTable (simulator/step_table.py): rows by column; a cluster moves its replicas' rows into
one frame, each value held once."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from servesim.simulator.step_table import STEP_COLUMNS, StepTable


def _table(first_step: int, n: int, size: int) -> StepTable:
    t = StepTable()
    row = t.append(first_step, 0.5, size, 100, 0, 0.25, size, 1, 0)  # a stepped prefill step
    t.set_gpu_time(row, 0.01)
    t.set_update(row, 0.52, 16, 32)
    start = [1.0 + 0.01 * j for j in range(n)]
    t.extend_decode_run(first_step + 1, start, [0.01] * (n - 1), [0.008] * n, size,
                        iter([0.3] * n), size, 0, [0] * n, [0] * n)
    return t


def test_move_to_frame_holds_each_row_once_and_the_tables_answer_from_it():
    tables = [_table(0, 5, 3), _table(0, 0 + 1, 2), StepTable(), _table(0, 9, 7)]
    before = [t.frame() for t in tables]
    expected = pd.concat(before, ignore_index=True)
    frame = StepTable.move_to_frame(tables)
    pd.testing.assert_frame_equal(frame, expected)
    start = 0
    for t, own in zip(tables, before):
        assert len(t) == len(own)
        pd.testing.assert_frame_equal(t.frame(), own)
        assert list(t.column("start_s")) == list(own["start_s"])
        assert all(getattr(t, name) == [] for name in STEP_COLUMNS)  # the rows left the table
        if len(own):
            assert np.shares_memory(t.column("gpu_time_s"), frame["gpu_time_s"].to_numpy())
        start += len(own)
    assert start == len(frame)
    with pytest.raises(RuntimeError, match="moved to columns"):  # a row added after the move fails loudly
        tables[0].append(99, 9.0, 1, 0, 1, 0.1, 1, 0, 0)
    with pytest.raises(RuntimeError, match="moved to columns"):
        tables[0].extend_decode_run(99, [9.0], [], [0.01], 1, [0.1], 1, 0, [0], [0])
    assert len(tables[0]) == len(before[0])


def test_move_to_frame_of_nothing_is_a_typed_empty_frame():
    frame = StepTable.move_to_frame([])
    assert list(frame.columns) == STEP_COLUMNS and len(frame) == 0
    assert frame["start_s"].dtype == np.float64 and frame["step"].dtype == np.int64


@pytest.mark.parametrize("n", [0, 6])
def test_one_table_moves_without_a_copy(n):
    """A single engine's run (MetricsCollector.tables): the frame views the table's own arrays."""
    t = _table(0, n, 4) if n else StepTable()
    own = t.frame()
    buffers = {name: np.frombuffer(t.column(name), dtype=own[name].dtype) for name in STEP_COLUMNS}
    frame = StepTable.move_to_frame([t])
    pd.testing.assert_frame_equal(frame, own)
    pd.testing.assert_frame_equal(t.frame(), own)
    for name in STEP_COLUMNS:
        assert frame[name].dtype == own[name].dtype
        if n:
            assert np.shares_memory(frame[name].to_numpy(), buffers[name])  # viewed, not copied
    with pytest.raises(RuntimeError, match="moved to columns"):
        t.append(99, 9.0, 1, 0, 1, 0.1, 1, 0, 0)


def _rows(t: StepTable) -> list[tuple]:
    return list(zip(*(t.column(name).tolist() for name in STEP_COLUMNS)))


def test_rows_past_a_chunk_are_packed_and_still_completed_by_row(monkeypatch):
    """Rows wait in lists and are packed into the arrays a chunk at a time; a step whose chunk was
    packed while it was in flight is still completed by its row, and the rows are the same ones
    a table that packs every row at once holds."""
    import servesim.simulator.step_table as st

    def fill(t: StepTable) -> None:
        in_flight = t.append(0, 0.5, 2, 30, 2, 0.1, 2, 0, 0)
        t.extend_decode_run(1, [1.0, 1.1, 1.2], [0.1, 0.1], [0.05] * 3, [2, 2, 1], iter([0.2, 0.25, 0.3]),
                            [2, 2, 1], 1, [0, 3, 0], [0, 5, 0])
        t.set_gpu_time(in_flight, 0.04)
        t.set_update(in_flight, 0.75, 16, 32)
        t.set_update(3, 1.31, 0, 0)
        last = t.append(4, 1.4, 1, 0, 1, 0.3, 1, 0, 0)
        t.set_gpu_time(last, 0.02)
        t.set_update(last, 1.45, 1, 2)

    whole = StepTable()
    fill(whole)
    monkeypatch.setattr(st, "_CHUNK", 2)
    chunked = StepTable()
    fill(chunked)
    assert len(chunked) == len(whole) == 5
    assert _rows(chunked) == _rows(whole)
    assert _rows(whole)[0] == (0, 0.5, 0.75 - 0.5, 0.04, 2, 30, 2, 0.1, 2, 0, 0, 16, 32)
    assert _rows(whole)[3][2] == 1.31 - 1.2  # the run's last step, completed by its update


def test_a_column_out_of_step_is_an_error_not_shifted_rows():
    t = StepTable()
    t.append(0, 0.5, 2, 30, 2, 0.1, 2, 0, 0)
    t.extend_decode_run(1, [1.0, 1.1], [0.1], [0.05] * 2, 2, iter([0.2]), 2, 0, [0, 0], [0, 0])
    with pytest.raises(ValueError, match="kv_usage"):
        t.column("kv_usage")
