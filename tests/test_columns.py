"""Columns (simulator/columns.py): added columns and integer columns with missing values, as a
cluster's requests table uses them (simulator/cluster/results.py) - the frame pandas users read,
and the file written from the columns, are what the same table built as a DataFrame gives."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from servesim.simulator.columns import Columns
from servesim.simulator.outputs import write_requests_parquet


def _table() -> Columns:
    return Columns({"request_id": ["a", "b", "c"], "x": np.array([1.0, 2.0, 3.0])})


def test_inserted_places_columns_and_shares_the_others():
    t = _table()
    out = t.inserted(1, {"replica": np.array([0, 1, 0]), "reason": ["r", None, "s"]})
    assert out.columns == ["request_id", "replica", "reason", "x"]
    assert out.raw("x") is t.raw("x")  # shared, not copied
    assert t.columns == ["request_id", "x"]  # the table itself is unchanged
    assert out.inserted(len(out.columns), {"y": [1, 2, 3]}).columns[-1] == "y"
    with pytest.raises(ValueError, match="already present"):
        out.inserted(0, {"x": np.zeros(3)})


def test_a_nullable_int_column_is_int64_in_the_frame_and_as_stored_in_the_file(tmp_path):
    missing = _table().inserted(1, {"decode_replica": np.array([1.0, np.nan, 0.0])}, ["decode_replica"])
    present = _table().inserted(1, {"decode_replica": np.array([1, 2, 0])}, ["decode_replica"])
    for cols, expected in ((missing, [1, pd.NA, 0]), (present, [1, 2, 0])):
        frame = cols.frame()
        pd.testing.assert_series_equal(frame["decode_replica"],
                                       pd.Series(pd.array(expected, dtype="Int64"), name="decode_replica"))
        # rows and selections keep it; a frame's Int64 column reads back as the same columns
        assert str(cols.rows(0, 2).frame()["decode_replica"].dtype) == "Int64"
        assert str(cols[np.array([True, False, True])].frame()["decode_replica"].dtype) == "Int64"
        back = Columns.of_frame(frame)
        np.testing.assert_array_equal(back.raw("decode_replica"), cols.raw("decode_replica"))
        assert back.frame().equals(frame)
        # the file: the columns and the frame write the same bytes (int64, or float64 with NaN)
        write_requests_parquet(cols, tmp_path / "cols.parquet")
        write_requests_parquet(frame, tmp_path / "frame.parquet")
        assert (tmp_path / "cols.parquet").read_bytes() == (tmp_path / "frame.parquet").read_bytes()
