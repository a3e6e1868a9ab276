"""Large result tables are written to Parquet a row group at a time (simulator/outputs.py
write_parquet): the file reads back as the one-shot file does, every column typed as in the whole
table even where one group holds only None or no gaps; an all-true selection is the table itself."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from servesim.simulator import outputs
from servesim.simulator.columns import Columns


def _table() -> Columns:
    return Columns({
        "request_id": [f"r{i}" for i in range(7)],
        "arrival_s": np.array([0.0, 0.1, np.nan, 0.3, 0.4, 0.5, 0.6]),
        "prompt_len": np.arange(7, dtype=np.int64),
        # None in the first group alone (rows 0-2), then strings
        "reject_reason": [None, None, None, "exceeds_kv_pool", None, "stranded_kv_pool", None],
        # no gap at all in the first group
        "itl_s": [[], [], [], np.array([0.01, 0.02]), np.array([0.03]), [], np.array([0.04, 0.05, 0.06])],
        "status": ["completed"] * 7,
        "grammar_wait_s": np.full(7, np.nan),
    }, none_in_frame=["grammar_wait_s"])


def test_row_groups_read_back_as_the_whole_file(tmp_path, monkeypatch):
    whole, grouped = tmp_path / "whole.parquet", tmp_path / "grouped.parquet"
    outputs.write_requests_parquet(_table(), whole)
    monkeypatch.setattr(outputs, "ROW_GROUP_ROWS", 3)
    outputs.write_requests_parquet(_table(), grouped)
    assert pq.ParquetFile(grouped).metadata.num_row_groups == 3 and pq.ParquetFile(whole).metadata.num_row_groups == 1
    a, b = pq.read_table(whole), pq.read_table(grouped)
    assert a.schema == b.schema and a.to_pylist() == b.to_pylist()
    assert b.column("reject_reason").to_pylist()[3] == "exceeds_kv_pool"
    assert b.column("itl_s").to_pylist()[6] == [0.04, 0.05, 0.06]


def test_a_column_only_pyarrow_can_type_is_written_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(outputs, "ROW_GROUP_ROWS", 2)
    t = Columns({"x": [1, 2, None, 3, None]})  # Python ints with None: pyarrow infers int64
    outputs.write_parquet(t, tmp_path / "x.parquet")
    assert pq.ParquetFile(tmp_path / "x.parquet").metadata.num_row_groups == 1


def test_an_all_true_selection_is_the_table_itself():
    t = _table()
    assert t[np.ones(7, dtype=bool)] is t
    part = t[np.arange(7) < 3]
    assert part is not t and list(part["request_id"]) == ["r0", "r1", "r2"]
    with pytest.raises(ValueError):
        t.take(np.ones(6, dtype=bool))
