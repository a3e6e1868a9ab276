"""Metrics: per request, per step, a 1-second time series and a summary.

Phase (prefill vs decode) is derived here, never stored by the scheduler: a step's tokens are
prefill tokens while they cover positions inside the prompt.
"""

from __future__ import annotations

import math
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
from servesim.simulator.step_table import StepTable

if TYPE_CHECKING:
    import pandas as pd

PERCENTILES = (50, 90, 95, 99)
# Rows of the requests table built per chunk when the records are released as they go
# (request_columns(release=True)): small enough that a chunk's Python objects are a few MB.
RELEASE_ROWS = 65_536


class MetricsCollector(MetricsRecorder):
    """A run's records (MetricsRecorder, filled by the engine) and what is built from them after it:
    the requests and steps as columns and frames, the time series."""

    def __init__(self) -> None:
        super().__init__()
        self._columns: RunColumns | None = None  # built once, after the run (columns())
        self._tables: RunTables | None = None  # its frames, likewise (tables())
        # (the frame tables() uses, as adopted; its column set as adopted) - adopt_steps_frame
        self._adopted_steps: tuple[pd.DataFrame, pd.DataFrame] | None = None
        self._released: Columns | None = None  # the table the records went into (request_columns(release=True))

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
                steps = Columns.of_frame(self._adopted_steps[0])
            else:
                steps = StepTable.move_to_columns([self.steps])
            self._columns = RunColumns(self.request_columns(release), steps)
        return self._columns

    def tables(self) -> RunTables:
        """The requests and steps frames of columns(), built once and kept."""
        if self._tables is None:
            cols = self.columns()
            steps = self._adopted_steps[0] if self._adopted_steps is not None else cols.steps.frame()
            self._tables = RunTables(cols.requests.frame(), steps)
        return self._tables

    def adopt_steps_frame(self, steps: pd.DataFrame) -> None:
        """Use `steps`, a frame of exactly this collector's step rows built elsewhere, as its steps
        frame instead of building one (a cluster builds one frame of every replica's steps, copying
        each value once; each replica's is a view of its rows, the merged collector's the whole).
        tables() hands out this very frame; steps_frame() a new frame of its columns as adopted."""
        self._adopted_steps = (steps, steps.copy(deep=False))
        self._tables = self._columns = None  # built before (if at all), they hold other steps

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
            chunk = RELEASE_ROWS if release else len(records) + len(self.finished)
            table = retired_table(records, self.finished, release, chunk)
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
        if not (release and flat):  # kept on the records: a cluster's merged table reuses its
            for r, itl in zip(stale, pooled.row_list()):  # replicas' (cluster/results.py)
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
        frame sharing an adopted frame's values: copy-on-write keeps them apart)."""
        if self._adopted_steps is not None:
            return self._adopted_steps[1].copy(deep=False)
        return self.steps.frame()

    def timeseries_frame(self, end_s: float) -> pd.DataFrame:
        """1-second ticks: state at the last step that started at or before each tick."""
        if self._columns is not None:
            return timeseries_from_steps(self._columns.steps, end_s).frame()
        return timeseries_from_steps(Columns.of_frame(self.steps_frame()), end_s).frame()


@dataclass(slots=True)
class RunColumns:
    """A finished run's requests and steps as columns, built once (MetricsCollector.columns())."""

    requests: Columns
    steps: Columns
    _timeseries: dict = field(default_factory=dict)  # end_s -> Columns

    def timeseries(self, end_s: float) -> Columns:
        if end_s not in self._timeseries:
            self._timeseries[end_s] = timeseries_from_steps(self.steps, end_s)
        return self._timeseries[end_s]


@dataclass(slots=True)
class RunTables:
    """A finished run's frames, built once (MetricsCollector.tables())."""

    requests: pd.DataFrame
    steps: pd.DataFrame
    _timeseries: dict = field(default_factory=dict)  # end_s -> frame

    def timeseries(self, end_s: float) -> pd.DataFrame:
        if end_s not in self._timeseries:
            self._timeseries[end_s] = timeseries_from_steps(Columns.of_frame(self.steps), end_s).frame()
        return self._timeseries[end_s]


# Runs longer than this many seconds get a sparse series (timeseries_from_steps): 11.6 days of
# 1-s rows is ~50 MB of columns; a trace spanning years would otherwise take gigabytes.
MAX_DENSE_TICKS = 1_000_000
TIMESERIES_COLUMNS = ["t_s", "running", "waiting", "kv_cache_pct", "prefill_tokens_per_s", "decode_tokens_per_s"]
# A group's series (steps with a `replica` column) adds these per replica: `running_rank<i>`, ...
RANK_COLUMNS = ("running", "waiting", "kv_cache_pct")
_STEP_SERIES = ("num_prefill_tokens", "num_decode_tokens", "num_running", "num_waiting", "kv_usage")


def timeseries_from_steps(steps: Columns, end_s: float) -> Columns:
    """1-second ticks from the steps: state at the last step that started at or before each tick,
    tokens per second over [t, t + 1). Every second of the run up to MAX_DENSE_TICKS seconds; a
    longer run (a trace spanning weeks) keeps only the seconds in which a step started and the
    second after each (where the series falls back to idle), so the series is sized by the steps,
    never by the simulated span.

    Steps of several replicas, each in its own step order, with a `replica` column (a cluster's:
    the ranks of a data-parallel deployment, simulator/cluster/) give the group's series: each
    replica's own series, then the counts (running, waiting, tokens per second) summed over the
    replicas and KV usage their mean (each replica has its own pool; DP ranks' pools are equal,
    so the mean is the group's usage), with each replica's running, waiting and KV usage beside
    (`running_rank<i>`, `waiting_rank<i>`, `kv_cache_pct_rank<i>`, i its `replica` value)."""
    ticks = _ticks(None if steps.empty else steps["start_s"], end_s)
    if steps.empty:
        return Columns({"t_s": ticks, **_series(None, [], ticks)}, TIMESERIES_COLUMNS)
    if "replica" not in steps:
        return Columns({"t_s": ticks, **_series(steps["start_s"], [steps[c] for c in _STEP_SERIES], ticks)},
                       TIMESERIES_COLUMNS)
    rep = steps["replica"]
    order = np.argsort(rep, kind="stable") if np.any(rep[1:] < rep[:-1]) else None  # a cluster's: in order
    sorted_rep = rep if order is None else rep[order]
    bounds = [0, *(np.flatnonzero(np.diff(sorted_rep)) + 1).tolist(), len(rep)]
    per: dict[int, dict[str, np.ndarray]] = {}
    for a, b in zip(bounds[:-1], bounds[1:]):
        rows = slice(a, b) if order is None else order[a:b]
        per[int(sorted_rep[a])] = _series(steps["start_s"][rows], [steps[c][rows] for c in _STEP_SERIES], ticks)
    data = {"t_s": ticks}
    for col in TIMESERIES_COLUMNS[1:]:
        stacked = np.stack([p[col] for p in per.values()])
        data[col] = stacked.mean(axis=0) if col == "kv_cache_pct" else stacked.sum(axis=0)
    for i, p in per.items():
        data.update({f"{col}_rank{i}": p[col] for col in RANK_COLUMNS})
    return Columns(data)


def _ticks(start: np.ndarray | None, end_s: float) -> np.ndarray:
    """The series' tick times (whole seconds, ascending; see timeseries_from_steps)."""
    n = math.floor(max(end_s, 0.0)) + 1
    if n <= MAX_DENSE_TICKS:
        return np.arange(0.0, float(n))
    if start is None or not len(start):
        return np.array([0.0, float(n - 1)])
    sec = np.unique(np.floor(start))
    return np.union1d(np.union1d(sec, sec + 1.0), [0.0, float(n - 1)])


def _series(start: np.ndarray | None, values: list, ticks: np.ndarray) -> dict[str, np.ndarray]:
    """One engine's series at `ticks` (TIMESERIES_COLUMNS but t_s) from its steps' start times
    and _STEP_SERIES columns, in step order; start None: no steps."""
    n = len(ticks)
    if start is None:
        zeros_i, zeros_f = np.zeros(n, dtype=np.int64), np.zeros(n)
        return {"running": zeros_i, "waiting": zeros_i, "kv_cache_pct": zeros_f,
                "prefill_tokens_per_s": zeros_f, "decode_tokens_per_s": zeros_f}
    prefill, decode, running, waiting, kv_usage = values
    idx = np.searchsorted(start, ticks, side="right") - 1
    valid = idx >= 0
    take = np.where(valid, idx, 0)
    sec = np.floor(start)
    if n and ticks[-1] == n - 1:  # every second from 0: a step's second is its tick's index
        pos, keep = sec.astype(np.int64), None
    else:  # sparse ticks hold every second a step started in (and may stop short of a step)
        pos = np.searchsorted(ticks, sec)
        keep = (pos < n) & (ticks[np.minimum(pos, n - 1)] == sec)
        pos = pos[keep]
    per_s = [np.bincount(pos, weights=w if keep is None else w[keep], minlength=n)[:n] for w in (prefill, decode)]
    return {"running": np.where(valid, running[take], 0), "waiting": np.where(valid, waiting[take], 0),
            "kv_cache_pct": np.where(valid, 100.0 * kv_usage[take], 0.0),
            "prefill_tokens_per_s": per_s[0], "decode_tokens_per_s": per_s[1]}


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
