"""Metrics: per request, per step, a 1-second time series and a summary.

Phase (prefill vs decode) is derived here, never stored by the scheduler: a step's tokens are
prefill tokens while they cover positions inside the prompt.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from servesim.simulator.columns import Columns
from servesim.simulator.order_stats import percentiles
from servesim.simulator.request_records import MetricsRecorder, RequestRecord  # noqa: F401  (RequestRecord: re-exported)
from servesim.simulator.finished_records import retired_table
from servesim.simulator.request_table import (  # noqa: F401
    REQUEST_COLUMNS, JoinedRows, mark_pool_aborts, pooled_gaps, request_part)
from servesim.simulator.step_fold import (FOLDED_COLUMNS, MAX_DENSE_TICKS, RANK_COLUMNS,  # noqa: F401 (re-exported)
                                          SERIES_COLUMNS, RunFolds, StepFigures, fold_columns)
from servesim.simulator.step_table import StepTable

if TYPE_CHECKING:
    import pandas as pd

    from servesim.simulator.bench_metrics import ItlOrder

PERCENTILES = (50, 90, 95, 99)
# Rows of the requests table built per chunk when the records are released as they go
# (request_columns(release=True)): small enough that a chunk's Python objects are a few MB.
RELEASE_ROWS = 65_536


class MetricsCollector(MetricsRecorder):
    """A run's records (MetricsRecorder, filled by the engine) and what is built from them after it:
    the requests and steps as columns and frames, the time series."""

    def __init__(self, keep_step_rows: bool = True) -> None:
        super().__init__(keep_step_rows)
        self._columns: RunColumns | None = None  # built once, after the run (columns())
        self._tables: RunTables | None = None  # its frames, likewise (tables())
        self._adopted_steps: Columns | None = None  # this collector's steps, built elsewhere (adopt_steps)
        self._released: Columns | None = None  # the table the records went into (request_columns(release=True))
        self._folds: RunFolds | None = None  # the steps' figures and series (step_folds())

    # --- tables -------------------------------------------------------------------------------
    def columns(self, release: bool = False) -> RunColumns:
        """The requests and steps as columns (simulator/columns.py: no pandas), built once and kept:
        for after the run, when the records no longer change (the summary, the result files and
        the frames share them; they hold every inter-token gap, so building them again per
        reader set the peak memory of long runs). The run's step rows move into them (viewed,
        not copied: ~44 MB on the Azure hour). `release`: the records go as the table is built
        (request_columns): for a run whose records nobody reads again (running.py's replay)."""
        if self._columns is None:
            if self._adopted_steps is not None:
                steps = self._adopted_steps
            elif self.steps.keep_rows:
                steps = StepTable.move_to_columns([self.steps])
            else:  # folded as the run went (step_rows: false): no rows, the figures and series remain
                steps = StepTable().columns()
            self._columns = RunColumns(self.request_columns(release), steps, self.step_folds())
        return self._columns

    def step_folds(self) -> RunFolds:
        """What the run's steps are read for (the summary's figures, the 1-second series): this
        engine's own fold, or the folds a cluster's merged collector adopted (adopt_step_folds)."""
        if self._folds is None:
            self._folds = RunFolds({0: self.steps.finish_fold()}, grouped=False, rows_kept=self.steps.keep_rows)
        return self._folds

    def adopt_step_folds(self, folds: RunFolds) -> None:
        """Report `folds` (a cluster's replicas', grouped) as this collector's steps' figures and series."""
        self._folds = folds
        self._columns = self._tables = None

    def tables(self) -> RunTables:
        """The requests and steps frames of columns(), built once and kept (pandas imported here)."""
        if self._tables is None:
            cols = self.columns()
            self._tables = RunTables(cols.requests.frame(), cols.steps.frame(), cols.folds)
        return self._tables

    def adopt_steps(self, steps: Columns) -> None:
        """Use `steps`, columns of exactly this collector's step rows built elsewhere, as its steps
        instead of building them (a cluster builds one table of every replica's steps, copying each
        value once; each replica's are a view of its rows, the merged collector's the whole, with a
        replica column). columns() and tables() hand them out; steps_frame() a new frame of them."""
        self._adopted_steps = steps
        self._tables = self._columns = None  # built before (if at all), they hold other steps

    def adopt_requests(self, requests: Columns) -> None:
        """Use `requests`, this collector's requests table with columns added elsewhere (a cluster's
        merged collector: the routing and P/D columns, cluster/results.py), as its table in
        columns() and tables() from now on. The summary is built first, from the table as
        request_columns() builds it, which requests_frame() still answers."""
        cols = self.columns()
        self._columns = RunColumns(requests, cols.steps, cols.folds)
        self._tables = None

    def release_records(self) -> None:
        """Let go of the records once the tables are built (columns()): the requests table stays,
        and request_columns answers it from then on (a cluster's collectors, after its results)."""
        self._released = self.columns().requests
        self.requests.clear()
        self.finished = None

    def request_columns(self, release: bool = False) -> Columns:
        """The requests table (REQUEST_COLUMNS) built anew, column by column, never a dict per row
        (columns() keeps one). `release`: for after the run, when nothing reads the records again
        (columns(release=True)): the collector lets go of them and each chunk of RELEASE_ROWS
        rows' records is dropped once its rows are columns, so the records and the table are
        never both whole in memory (a 1 M-request run: ~0.3 GB each)."""
        if self._released is not None:
            return self._released
        records: list = list(self.requests.values())
        if self.finished is not None and len(self.finished):  # records retired at their finish
            table = retired_table(records, self.finished, release)
            if release:
                self.requests.clear()
                self.finished, self._released = None, table
            return table
        mark_pool_aborts(records)  # (only SGLang aborts on its own)
        by_row = any(r.status == "timed_out" or r.reject_reason is not None for r in records)
        stale = [r for r in records if r.itl_s is None or len(r.itl_s) != max(len(r.token_times_s) - 1, 0)]
        pooled = pooled_gaps(stale)
        # Every row's gaps are views of the one pooled buffer, in row order: the table keeps it, so
        # the summary and the result file read it rather than concatenating the rows again (a
        # rejected or timed-out row's gaps are left out, []: then not the pooled rows).
        flat = {"itl_s": pooled} if len(stale) == len(records) and not by_row else {}
        itls: list | None = None  # released with the buffer kept: the table builds the views if read
        if not (release and flat):  # kept on the records: a cluster's replicas' tables reuse its
            for r, itl in zip(stale, pooled.row_list()):  # merged table's (cluster/results.py _share_gaps)
                r.itl_s = itl
            itls = [r.itl_s for r in records]
        del stale
        if release:  # (cleared, not replaced: whoever holds the dict lets go of them too)
            self.requests.clear()
        step = RELEASE_ROWS if release else max(len(records), 1)
        if len(records) <= step:  # one chunk: its columns are the table's
            data, all_none = request_part(records, itls, by_row)
        else:
            joined = JoinedRows(len(records))
            for start in range(0, len(records), step):
                stop = min(start + step, len(records))
                joined.add(request_part(records[start:stop], None if itls is None else itls[start:stop], by_row))
                records[start:stop] = [None] * (stop - start)
            data, all_none = joined.data, sorted(joined.all_none or ())
        del records
        table = Columns(data, REQUEST_COLUMNS, all_none, flat)
        if release:
            self._released = table
        return table

    def requests_frame(self) -> pd.DataFrame:
        """A new requests frame (tables() keeps one)."""
        return self.request_columns().frame()

    def steps_frame(self) -> pd.DataFrame:
        """A new steps frame (tables() keeps one), from the table's columns as they are (or a new
        frame of the adopted columns' values: copy-on-write keeps the frames apart)."""
        if self._adopted_steps is not None:
            return self._adopted_steps.frame()
        return self.steps.frame()

    def timeseries_frame(self, end_s: float) -> pd.DataFrame:
        """1-second ticks: state at the last step that started at or before each tick."""
        return self.step_folds().series(end_s).frame()


@dataclass(slots=True)
class RunColumns:
    """A finished run's requests and steps as columns, built once (MetricsCollector.columns())."""

    requests: Columns
    steps: Columns  # no rows when the run kept none (step_rows: false)
    folds: RunFolds  # the steps' figures and series, whether the rows were kept or not

    def timeseries(self, end_s: float) -> Columns:
        return self.folds.series(end_s)


@dataclass(slots=True)
class RunTables:
    """A finished run's frames, built once (MetricsCollector.tables())."""

    requests: pd.DataFrame
    steps: pd.DataFrame
    folds: RunFolds
    _timeseries: dict = field(default_factory=dict)  # end_s -> frame

    def timeseries(self, end_s: float) -> pd.DataFrame:
        if end_s not in self._timeseries:
            self._timeseries[end_s] = self.folds.series(end_s).frame()
        return self._timeseries[end_s]


TIMESERIES_COLUMNS = SERIES_COLUMNS


def timeseries_from_steps(steps: Columns, end_s: float) -> Columns:
    """The 1-second series of step rows as columns (simulator/step_fold.py, which the run's own
    series comes from: state at the last step that started at or before each tick, tokens per
    second over [t, t + 1)). Steps of several replicas, each in its own step order, with a
    `replica` column (a cluster's) give the group's series. Only the series' columns are read
    (start_s, the token counts, num_running, num_waiting, kv_usage)."""
    def part(rows) -> dict[str, np.ndarray]:
        n = len(steps["start_s"][rows])
        return {c: steps[c][rows] if c in steps else np.zeros(n, dtype=np.int64) for c in FOLDED_COLUMNS}

    if "replica" not in steps or steps.empty:
        return RunFolds({0: fold_columns(part(slice(None)))}, grouped=False).series(end_s)
    rep = steps["replica"]
    order = np.argsort(rep, kind="stable") if np.any(rep[1:] < rep[:-1]) else None  # a cluster's: in order
    sorted_rep = rep if order is None else rep[order]
    bounds = [0, *(np.flatnonzero(np.diff(sorted_rep)) + 1).tolist(), len(rep)]
    folds = {}
    for a, b in zip(bounds[:-1], bounds[1:]):
        rows = slice(a, b) if order is None else order[a:b]
        folds[int(sorted_rep[a])] = fold_columns(part(rows))
    return RunFolds(folds, grouped=True).series(end_s)


def gap_stats(order: ItlOrder) -> dict:
    """stats(gaps) of the NaN-free, non-empty gaps buffer `order` partitioned at PERCENTILES: the
    same mean (taken in the values' order) and the same order statistics."""
    return {"mean": order.mean_s, **{f"p{p}": v for p, v in zip(PERCENTILES, order.seconds())},
            "count": order.stats.n}


def stats(values, scratch: bool = False) -> dict:
    """Mean, PERCENTILES and count of values (None and NaN left out). scratch: values is an array
    nobody reads afterwards (e.g. concat_gaps' result), so the percentiles may reorder it in place
    instead of partitioning a copy (a cluster hour's ~65 M gaps: ~0.5 GB less). The mean is taken
    first, in the values' order; percentiles are order statistics, the same in any order."""
    # Vectorised: None and NaN both become NaN under dtype=float and are dropped by one mask, in order,
    # so the array (and every statistic of it) is the one the per-value filter built.
    if isinstance(values, Iterator):  # a generator: its values (a list, a Series, an array as they are)
        values = list(values)
    arr = np.asarray(values, dtype=float)
    own = scratch and arr is values and arr.flags.writeable
    nan = np.isnan(arr)
    if nan.any():  # copied only when there is something to drop (ITLs: ~65 M in a cluster hour)
        arr = arr[~nan]
        own = True
    if arr.size == 0:
        return {"mean": None, **{f"p{p}": None for p in PERCENTILES}, "count": 0}
    out = {"mean": float(arr.mean())}
    # All four from one selection (each value numpy's own percentile: simulator/order_stats.py).
    for p, value in zip(PERCENTILES, percentiles(arr, PERCENTILES, own=own)):
        out[f"p{p}"] = value
    out["count"] = int(arr.size)
    return out
