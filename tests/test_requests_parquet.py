"""requests.parquet (and every result table) is written from the run's columns through Arrow
buffers, without pandas (simulator/outputs.py); read back, a file must be exactly what pandas'
own to_parquet of the run's frame reads back as (columns, types, values), for every kind of
requests table a run or a cluster produces: completed, rejected and timed-out rows, a column of
None alone, gaps as arrays or lists or none at all, a cluster's extra columns."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from servesim.simulator.columns import Columns
from servesim.simulator.config import SimConfig
from servesim.simulator.build import build_engine
from servesim.simulator.outputs import write_csv, write_parquet, write_requests_parquet
from servesim.traces.bundled import load_bundled
from servesim.traces.workload import Workload


def _reads_back_as_pandas_writes(table, tmp_path) -> pd.DataFrame:
    """Write `table` (Columns or a frame) both ways; assert pandas reads the same frame and the
    Arrow schemas agree (less pandas' metadata); return the frame."""
    frame = table.frame() if isinstance(table, Columns) else table
    frame.to_parquet(tmp_path / "pandas.parquet", index=False)
    write_requests_parquet(table, tmp_path / "ours.parquet")
    ours, theirs = pd.read_parquet(tmp_path / "ours.parquet"), pd.read_parquet(tmp_path / "pandas.parquet")
    pd.testing.assert_frame_equal(ours, theirs, check_exact=True)
    assert pq.read_schema(tmp_path / "ours.parquet").remove_metadata() == \
        pq.read_schema(tmp_path / "pandas.parquet").remove_metadata()
    return ours


def _columns(workload: Workload, **cfg) -> Columns:
    return build_engine(SimConfig(**cfg), workload).run().metrics.request_columns()


def test_a_completed_run_reads_back_as_its_frame(tmp_path):
    cols = _columns(load_bundled())
    back = _reads_back_as_pandas_writes(cols, tmp_path)
    pd.testing.assert_frame_equal(back, cols.frame(), check_exact=True)
    for got, want in zip(back["itl_s"], cols.raw("itl_s")):
        assert list(got) == list(want)


def test_rejected_and_timed_out_rows_and_columns_of_none(tmp_path):
    wl = load_bundled()
    specs = wl.requests[:30]
    specs[3] = dataclasses.replace(specs[3], prompt_len=10**7, prompt_token_ids=None)  # longer than the model: rejected
    specs[5] = dataclasses.replace(specs[5], timeout_s=1e-6)  # the client gives up at once
    cols = _columns(Workload(specs, "edge", "test"))
    assert set(cols["status"]) == {"completed", "rejected", "timed_out"}
    _reads_back_as_pandas_writes(cols, tmp_path)
    # one output token each: no TPOT anywhere, a column of None alone (object; typed null in the file)
    single = [dataclasses.replace(s, output_len=1) for s in wl.requests[:4]]
    ones = _columns(Workload(single, "single", "test"))
    assert "tpot_s" in ones.none_in_frame and ones.frame()["tpot_s"].dtype == object
    _reads_back_as_pandas_writes(ones, tmp_path)


def test_other_gaps_and_a_clusters_frame(tmp_path):
    frame = _columns(Workload(load_bundled().requests[:12], "small", "test")).frame()
    no_gaps = frame.assign(itl_s=[[] for _ in range(len(frame))])
    lists = frame.assign(itl_s=[list(v) for v in frame["itl_s"]])
    cluster = frame.assign(replica=np.arange(len(frame)) % 3, role=["prefill", None, "decode"] * 4)
    for other in (no_gaps, lists, cluster):
        _reads_back_as_pandas_writes(other, tmp_path)


def test_steps_and_timeseries_files(tmp_path):
    res = build_engine(SimConfig(), Workload(load_bundled().requests[:40], "small", "test")).run()
    cols = res.metrics.columns()
    write_parquet(cols.steps, tmp_path / "steps.parquet", ("num_requests",))
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "steps.parquet"), cols.steps.frame(), check_exact=True)
    ts = cols.timeseries(res.sim_duration_s)
    write_csv(ts, tmp_path / "ts.csv")
    assert (tmp_path / "ts.csv").read_text() == ts.frame().to_csv(index=False)
    odd = Columns({"x": np.array([0.0, 1e-05, np.nan, 1e22, -0.0, 0.1 + 0.2]), "n": np.arange(6)})
    write_csv(odd, tmp_path / "odd.csv")
    assert (tmp_path / "odd.csv").read_text() == odd.frame().to_csv(index=False)
