"""requests.parquet is written from one Arrow list array of every inter-token gap
(simulator.outputs.write_requests_parquet); the file must be the very bytes pandas' to_parquet
writes, for every kind of requests frame a run or a cluster produces, and frames the fast path
does not cover must take to_parquet itself."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pyarrow as pa

from servesim.simulator.config import SimConfig
from servesim.simulator.engine import Engine
from servesim.simulator.outputs import _requests_table, write_requests_parquet
from servesim.traces.bundled import load_bundled
from servesim.traces.workload import Workload


def _same_bytes(frame: pd.DataFrame, tmp_path) -> bool:
    frame.to_parquet(tmp_path / "plain.parquet", index=False)
    write_requests_parquet(frame, tmp_path / "fast.parquet")
    return (tmp_path / "plain.parquet").read_bytes() == (tmp_path / "fast.parquet").read_bytes()


def _frame(workload: Workload, **cfg) -> pd.DataFrame:
    return Engine(SimConfig(**cfg), workload).run().metrics.requests_frame()


def test_completed_run_takes_the_fast_path_with_the_same_bytes(tmp_path):
    frame = _frame(load_bundled())
    assert _requests_table(frame, pa) is not None
    assert _same_bytes(frame, tmp_path)
    back = pd.read_parquet(tmp_path / "fast.parquet")
    for got, want in zip(back["itl_s"], frame["itl_s"]):
        assert list(got) == list(want)


def test_rejected_and_timed_out_rows_keep_the_same_bytes(tmp_path):
    wl = load_bundled()
    specs = wl.requests[:30]
    specs[3] = dataclasses.replace(specs[3], prompt_len=10**7, prompt_token_ids=None)  # longer than the model: rejected
    specs[5] = dataclasses.replace(specs[5], timeout_s=1e-6)  # the client gives up at once
    frame = _frame(Workload(specs, "edge", "test"))
    assert set(frame["status"]) == {"completed", "rejected", "timed_out"}
    assert _requests_table(frame, pa) is not None  # reject_reason typed from a row that has one
    assert _same_bytes(frame, tmp_path)


def test_frames_the_fast_path_does_not_cover_take_to_parquet(tmp_path):
    frame = _frame(Workload(load_bundled().requests[:12], "small", "test"))
    no_gaps = frame.assign(itl_s=[[] for _ in range(len(frame))])
    lists = frame.assign(itl_s=[list(v) for v in frame["itl_s"]])
    for other in (no_gaps, lists):
        assert _requests_table(other, pa) is None
        assert _same_bytes(other, tmp_path)
    extra = frame.assign(replica=np.arange(len(frame)) % 3)  # a cluster's frame: more columns
    assert _requests_table(extra, pa) is not None
    assert _same_bytes(extra, tmp_path)
