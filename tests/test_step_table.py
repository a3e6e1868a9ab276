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
        assert all(getattr(t, name) is None for name in STEP_COLUMNS)  # the arrays were freed
        if len(own):
            assert np.shares_memory(t.column("gpu_time_s"), frame["gpu_time_s"].to_numpy())
        start += len(own)
    assert start == len(frame)
    with pytest.raises(AttributeError):  # a row added after the move fails loudly
        tables[0].append(99, 9.0, 1, 0, 1, 0.1, 1, 0, 0)


def test_move_to_frame_of_nothing_is_a_typed_empty_frame():
    frame = StepTable.move_to_frame([])
    assert list(frame.columns) == STEP_COLUMNS and len(frame) == 0
    assert frame["start_s"].dtype == np.float64 and frame["step"].dtype == np.int64


@pytest.mark.parametrize("n", [0, 6])
def test_one_table_moves_without_a_copy(n):
    """A single engine's run (MetricsCollector.tables): the frame views the table's own arrays."""
    t = _table(0, n, 4) if n else StepTable()
    own = t.frame()
    buffers = {name: np.frombuffer(getattr(t, name), dtype=own[name].dtype) for name in STEP_COLUMNS}
    frame = StepTable.move_to_frame([t])
    pd.testing.assert_frame_equal(frame, own)
    pd.testing.assert_frame_equal(t.frame(), own)
    for name in STEP_COLUMNS:
        assert frame[name].dtype == own[name].dtype
        if n:
            assert np.shares_memory(frame[name].to_numpy(), buffers[name])  # viewed, not copied
    with pytest.raises(AttributeError):
        t.append(99, 9.0, 1, 0, 1, 0.1, 1, 0, 0)
