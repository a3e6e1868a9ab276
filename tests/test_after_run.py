"""After the run: every request's gaps pooled once (Columns.flat), the records let go a chunk of rows
at a time (MetricsCollector.columns(release=True)) and tables written in row groups from row slices
(Columns.rows): each gives exactly the table, summary and file bytes of the plain build."""

from __future__ import annotations

import dataclasses
import json
from array import array

import numpy as np
import pytest

from servesim.simulator import metrics as M
from servesim.simulator import outputs as O
from servesim.simulator import bench_metrics as B
from servesim.simulator import request_table as T
from servesim.simulator.bench_metrics import bench_serve_result, concat_gaps
from servesim.simulator.build import build_engine
from servesim.simulator.columns import Columns, FlatList
from servesim.simulator.config import SimConfig
from servesim.simulator.request_records import RequestRecord
from servesim.simulator.summary import summarize
from servesim.traces.bundled import load_bundled
from servesim.traces.workload import Workload


def _record(rid: str, times: list[float], **kw) -> RequestRecord:
    r = RequestRecord(rid, 0.5, 16, max(len(times), 1), first_scheduled_s=0.6, **kw)
    r.token_times_s = array("d", times)
    if times:
        r.first_token_s, r.finish_s, r.finish_reason = times[0], times[-1], "length"
    return r


def test_pooled_gaps_are_each_requests_own_diffs_end_to_end():
    times = [[], [1.0], [1.0, 1.25], [2.0, 2.0, 2.5, 4.0], [], [0.5, 9.0], [3.0]]
    recs = [_record(str(i), t) for i, t in enumerate(times)]
    pooled = T.pooled_gaps(recs)
    expected = [np.diff(np.array(t)) for t in times]
    assert pooled.offsets.tolist() == [0, 0, 0, 1, 4, 4, 5, 5]
    assert pooled.values.tobytes() == np.concatenate(expected).tobytes()
    assert not pooled.values.flags.writeable  # the rows are views of it: nobody reorders it
    views = pooled.row_list()
    for view, want in zip(views, expected):
        assert (view == [] if len(want) == 0 else view.tobytes() == want.tobytes())
    assert T.pooled_gaps([]).values.size == 0 and T.pooled_gaps([_record("a", [1.0])]).offsets.tolist() == [0, 0]


@pytest.mark.parametrize("chunk_tokens", [1, 3, 7, 1 << 22])
def test_pooled_gaps_are_the_same_however_the_requests_are_chunked(monkeypatch, chunk_tokens):
    rng = np.random.default_rng(0)
    times = [np.cumsum(rng.random(int(n))).tolist() for n in rng.choice([0, 1, 2, 5, 40], 200)]
    monkeypatch.setattr(T, "POOL_CHUNK_TOKENS", chunk_tokens)
    pooled = T.pooled_gaps([_record(str(i), t) for i, t in enumerate(times)])
    assert pooled.values.tobytes() == np.concatenate([np.diff(np.array(t)) for t in times]).tobytes()


def _collector(workload: Workload) -> M.MetricsCollector:
    return build_engine(SimConfig(), workload).run().metrics


def _frames_equal(a: Columns, b: Columns) -> None:
    import pandas as pd

    pd.testing.assert_frame_equal(a.frame(), b.frame(), check_exact=True)
    assert a.none_in_frame == b.none_in_frame


def _edge_workload() -> Workload:
    specs = load_bundled().requests[:30]
    specs[3] = dataclasses.replace(specs[3], prompt_len=10**7, prompt_token_ids=None)  # rejected
    specs[5] = dataclasses.replace(specs[5], timeout_s=1e-6)  # its client gives up at once
    return Workload(specs, "edge", "test")


def _small() -> Workload:
    return Workload(load_bundled().requests[:60], "small", "test")


@pytest.mark.parametrize("workload", [_small, _edge_workload], ids=["completed", "rejected_timed_out"])
def test_released_records_give_the_plain_table_in_chunks(workload, monkeypatch, tmp_path):
    metrics = _collector(workload())
    kept = _collector(workload())  # a second run of the same: a compiled collector does not deepcopy
    plain = kept.request_columns()
    monkeypatch.setattr(M, "RELEASE_ROWS", 7)  # several chunks, the last one short
    released = metrics.request_columns(release=True)
    _frames_equal(released, plain)
    assert not metrics.requests and metrics.request_columns() is released  # the records are gone
    assert (released.flat("itl_s") is None) == (plain.flat("itl_s") is None)
    O.write_requests_parquet(plain, tmp_path / "a.parquet")
    O.write_requests_parquet(released, tmp_path / "b.parquet")
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()


def test_released_run_summary_equals_the_kept_one():
    metrics = _collector(_small())
    kept = _collector(_small())  # a second run of the same: a compiled collector does not deepcopy
    metrics.columns(release=True)
    slo = SimConfig().slo
    a = summarize(metrics, 100.0, 1.0, slo, 500, 3, 9)
    b = summarize(kept, 100.0, 1.0, slo, 500, 3, 9)
    assert json.dumps(a) == json.dumps(b)


def test_the_pooled_buffer_is_what_concatenating_the_rows_gives():
    cols = _collector(Workload(load_bundled().requests[:40], "small", "test")).request_columns()
    flat = cols.flat("itl_s")
    assert flat is not None
    gaps, new = concat_gaps(cols)
    assert gaps is flat.values and not new  # shared, read-only: a reader copies before reordering
    rows = [v for v in cols.raw("itl_s") if len(v)]
    assert gaps.tobytes() == np.concatenate(rows).tobytes()
    as_list = Columns({n: cols.raw(n) for n in cols.columns}, cols.columns, cols.none_in_frame)  # no flat
    again, new = concat_gaps(as_list)
    assert new and again.tobytes() == gaps.tobytes()
    assert json.dumps(bench_serve_result(cols)) == json.dumps(bench_serve_result(as_list))


@pytest.mark.parametrize("group_rows", [1, 6, 10_000])
def test_row_groups_from_row_slices_write_the_same_bytes(group_rows, monkeypatch, tmp_path):
    cols = _collector(Workload(load_bundled().requests[:23], "small", "test")).request_columns()
    without = Columns({n: cols.raw(n) for n in cols.columns}, cols.columns, cols.none_in_frame)
    monkeypatch.setattr(O, "ROW_GROUP_ROWS", group_rows)
    O.write_requests_parquet(cols, tmp_path / "flat.parquet")
    O.write_requests_parquet(without, tmp_path / "rows.parquet")
    assert (tmp_path / "flat.parquet").read_bytes() == (tmp_path / "rows.parquet").read_bytes()
    part = cols.rows(5, 11)
    assert len(part) == 6 and part["request_id"].tolist() == cols["request_id"][5:11].tolist()
    assert part.flat("itl_s").values.tobytes() == np.concatenate(
        [v for v in cols.raw("itl_s")[5:11] if len(v)]).tobytes()


def test_a_flat_list_must_cover_the_rows():
    with pytest.raises(ValueError, match="flat rows"):
        Columns({"x": [[1.0]]}, flat={"x": FlatList(np.array([1.0]), np.array([0, 1, 1]))})


def _gaps_table(rows: list[list[float]]) -> Columns:
    """A completed requests table whose rows' gaps are `rows` (pooled: the table's flat buffer)."""
    lens = np.array([len(r) for r in rows], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lens)])
    flat = FlatList(np.array([g for r in rows for g in r], dtype=np.float64), offsets)
    n = len(rows)
    data = {"request_id": [str(i) for i in range(n)], "arrival_s": np.zeros(n), "prompt_len": np.full(n, 8),
            "output_len": lens + 1, "first_token_s": np.full(n, 0.5), "finish_s": np.full(n, 2.0),
            "status": ["completed"] * n}
    return Columns(data, [*data, "itl_s"], flat={"itl_s": flat})


@pytest.mark.parametrize("rows", [
    [[0.25, 0.0, 0.5], [0.0, 0.0], [1.5, 0.125, 0.125, 0.0, 3.0]],  # zero gaps (a chunk's tokens) among them
    [[0.0, 0.0], [0.0]],  # no positive gap: bench_serve's ITL has no figure
    [[0.375]],  # one gap
], ids=["zeros", "no_positive", "one"])
@pytest.mark.parametrize("chunk", [1, 2, 1 << 16])
def test_one_partition_gives_the_summary_and_bench_serve_itl_figures(rows, chunk, monkeypatch):
    """ItlOrder's figures are np.percentile's and np.median's of each array, bit for bit, and
    bench_serve's result is the same with the summary's partition as without it (its ITL array
    compacted into the partition's copy however many gaps at a time)."""
    monkeypatch.setattr(B, "_COMPACT_CHUNK", chunk)
    table = _gaps_table(rows)
    gaps, scratch = concat_gaps(table)
    assert not scratch and gaps is table.flat("itl_s").values
    order = B.ItlOrder.of(gaps, scratch, M.PERCENTILES)
    assert order is not None and order.gaps is gaps
    assert M.gap_stats(order) == M.stats(gaps) and json.dumps(M.gap_stats(order)) == json.dumps(M.stats(gaps))
    positive = gaps[gaps > 0] * 1e3
    if positive.size:
        median, found = order.positive_ms()
        assert median == float(np.median(positive)) and found == np.percentile(positive, B.BENCH_PERCENTILES).tolist()
    else:
        assert order.positive_ms() is None
    assert order.itl_ms().tobytes() == positive.tobytes()
    with pytest.raises(ValueError, match="handed out"):
        order.itl_ms()
    order = B.ItlOrder.of(gaps, scratch, M.PERCENTILES)
    shared = bench_serve_result(table, itl_order=order)
    assert json.dumps(shared) == json.dumps(bench_serve_result(table))
    assert gaps.tobytes() == np.array([g for r in rows for g in r]).tobytes()  # the table's buffer untouched


def test_a_partition_of_other_gaps_or_percentiles_is_not_used():
    table = _gaps_table([[0.25, 0.5], [1.0]])
    other = B.ItlOrder.of(np.array([9.0, 8.0, 7.0]), False, M.PERCENTILES)
    assert json.dumps(bench_serve_result(table, itl_order=other)) == json.dumps(bench_serve_result(table))
    gaps, _ = concat_gaps(table)
    mine = B.ItlOrder.of(gaps, False, M.PERCENTILES, (50, 75))
    assert json.dumps(bench_serve_result(table, itl_order=mine)) == json.dumps(bench_serve_result(table))
    own = B.ItlOrder.of(gaps.copy(), True, M.PERCENTILES)  # partitioned in place: nothing to share
    assert own.gaps is None and own.mean_s == float(gaps.mean())
    assert B.ItlOrder.of(np.array([0.5, np.nan]), False, M.PERCENTILES) is None
    assert B.ItlOrder.of(np.empty(0), False, M.PERCENTILES) is None


def _fail_on(name: str, real):
    def write(table, path, *args):
        if path.name == name:
            raise OSError(28, "No space left on device", str(path))
        return real(table, path, *args)
    return write


@pytest.mark.parametrize("failing", ["steps.parquet", "requests.parquet"])
def test_a_failed_table_file_leaves_no_folder(failing, monkeypatch, tmp_path):
    """A full disk while either table is written: raised, and nothing is left behind."""
    table = Columns({"a": np.arange(5.0)})
    monkeypatch.setattr(O, "write_parquet", _fail_on(failing, O.write_parquet))
    with pytest.raises(OSError, match="No space left"):
        O.write_result_folder(tmp_path / "out", "replay", requests=table, steps=table, timeseries=table,
                              config={}, summary={})
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("group_rows", [4, 10_000])
def test_writing_a_pooled_column_builds_no_view_per_row(group_rows, monkeypatch, tmp_path):
    """requests.parquet's gaps come from the flat buffer, in one group or several: the same bytes
    as from the rows listed one by one, and no view per row is built for it."""
    monkeypatch.setattr(O, "ROW_GROUP_ROWS", group_rows)
    listed = _collector(_small()).request_columns()
    listed = Columns({n: listed.raw(n) for n in listed.columns}, listed.columns, listed.none_in_frame)
    O.write_requests_parquet(listed, tmp_path / "listed.parquet")
    table = _collector(_small()).request_columns(release=True)  # the gaps only as the flat buffer

    def no_views(self):
        raise AssertionError("a view per row was built")
    monkeypatch.setattr(FlatList, "row_list", no_views)
    O.write_requests_parquet(table, tmp_path / "flat.parquet")
    assert (tmp_path / "flat.parquet").read_bytes() == (tmp_path / "listed.parquet").read_bytes()
