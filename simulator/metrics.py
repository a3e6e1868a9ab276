"""Metrics: per request, per step, a 1-second time series and a summary.

Phase (prefill vs decode) is derived here, never stored by the scheduler: a step's tokens are
prefill tokens while they cover positions inside the prompt.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from servesim.simulator.columns import Columns, FlatList, float_column
from servesim.simulator.order_stats import percentiles
from servesim.simulator.request_records import MetricsRecorder, RequestRecord
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
        for r in records:
            if r.finish_reason == "abort" and r.reject_reason is None and r.status != "timed_out":
                # Only SGLang aborts on its own: a request that cannot decode even alone in the pool.
                r.reject_reason = "exceeds_kv_pool"
        by_row = any(r.status == "timed_out" or r.reject_reason is not None for r in records)
        stale = [r for r in records if r.itl_s is None or len(r.itl_s) != max(len(r.token_times_s) - 1, 0)]
        pooled = _pooled_gaps(stale)
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
        parts = []
        for start in range(0, len(records), step):
            stop = min(start + step, len(records))
            parts.append(_request_part(records[start:stop], None if itls is None else itls[start:stop], by_row))
            if release:
                records[start:stop] = [None] * (stop - start)
        data, all_none = _joined(parts) if parts else _request_part([], [], False)
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


def _pooled_gaps(records: list[RequestRecord]) -> FlatList:
    """Every request's inter-token gaps laid end to end (request order), with each request's
    offsets: one np.diff over every request's token times laid end to end, less the gaps that
    straddle two requests (a gap kept is the same subtraction np.diff per request made). Converting
    each request's times to an array separately cost more than the whole rest of the frame.

    Read-only: each request's itl_s is a view of it (FlatList.row_list; 8 bytes a gap: as lists of floats
    a cluster hour's 65 M gaps took ~2 GB per frame), and the summary's statistics and
    requests.parquet's list column read the buffer itself."""
    lens = np.fromiter((len(r.token_times_s) for r in records), dtype=np.int64, count=len(records))
    # the arrays' buffers laid end to end in one copy (bytes.join reads each array's buffer: no
    # numpy view per request, ~3x faster than concatenating views on the Azure hour's 19 k)
    flat = np.frombuffer(b"".join([r.token_times_s for r in records]), dtype=np.float64)
    num_gaps = np.maximum(lens - 1, 0)
    offsets = np.zeros(len(records) + 1, dtype=np.int64)
    np.cumsum(num_gaps, out=offsets[1:])
    if flat.size > 1:
        gaps = np.diff(flat)
        firsts = (np.cumsum(lens) - lens)[(lens > 0)][1:]  # each request's first token but the first's
        if firsts.size:  # the gap into a request's first token straddles two requests
            keep = np.ones(gaps.size, dtype=bool)
            keep[firsts - 1] = False
            gaps = gaps[keep]
    else:
        gaps = np.empty(0)
    del flat
    gaps.flags.writeable = False
    return FlatList(gaps, offsets)


def _append_row(cols: dict[str, list], r: RequestRecord, itl: np.ndarray | list) -> None:
    """One request's values onto the requests-frame columns (completed, rejected or timed out);
    `itl` is its inter-token gaps (FlatList.row_list)."""
    times = r.token_times_s
    n = len(times)
    if r.status == "timed_out" or r.reject_reason is not None:
        # Latencies stay empty (NaN) so the request never counts in a percentile or CDF; a timed-out
        # request keeps what it streamed (output_len, first_scheduled_s), a failure as vllm bench counts.
        # A request aborted as stranded (status "aborted") keeps what it streamed as a timed-out one does.
        ran = r.status in ("timed_out", "aborted")
        values = dict.fromkeys(_LATENCY_COLUMNS, math.nan)
        values.update(request_id=r.request_id, arrival_s=r.arrival_s, prompt_len=r.prompt_len,
                      output_len=n if ran else 0, output_len_target=r.output_len_target, itl_s=[],
                      num_preemptions=r.num_preemptions, num_cached_tokens=r.num_cached_tokens if ran else 0,
                      finish_reason="abort" if ran else None, status=r.status if ran else "rejected",
                      reject_reason=None if r.status == "timed_out" else r.reject_reason,
                      grammar_wait_s=r.grammar_wait_s, input_wait_s=r.input_wait_s)
        if ran:
            values.update(first_scheduled_s=r.first_scheduled_s, queueing_s=_sub(r.first_scheduled_s, r.arrival_s))
    else:
        values = {
            "request_id": r.request_id, "arrival_s": r.arrival_s, "prompt_len": r.prompt_len,
            "output_len": n, "output_len_target": r.output_len_target,
            "first_scheduled_s": r.first_scheduled_s, "first_token_s": r.first_token_s, "finish_s": r.finish_s,
            "queueing_s": _sub(r.first_scheduled_s, r.arrival_s), "ttft_s": _sub(r.first_token_s, r.arrival_s),
            "tpot_s": (times[-1] - times[0]) / (n - 1) if n > 1 else None, "e2e_s": _sub(r.finish_s, r.arrival_s),
            "itl_s": itl,
            "num_preemptions": r.num_preemptions, "num_cached_tokens": r.num_cached_tokens,
            "finish_reason": r.finish_reason, "status": "completed" if r.finish_reason is not None else None,
            "reject_reason": None, "grammar_wait_s": r.grammar_wait_s, "input_wait_s": r.input_wait_s,
        }
    for c, v in values.items():
        cols[c].append(v)


def _request_part(records: list[RequestRecord], itls: list | None, by_row: bool) -> tuple[dict, list[str]]:
    """Some requests' rows of the requests table as columns, and the float columns all missing
    in them (request_columns); `itls` each request's gaps (None: no itl_s column, the table's
    flat buffer holds it), `by_row`: some request of the run timed out or was rejected (the row
    path, _append_row)."""
    lazy_gaps = itls is None
    if itls is None:
        itls = [[]] * len(records)  # (not read: the column is dropped below)
    if by_row:
        rows: dict[str, list] = {c: [] for c in REQUEST_COLUMNS}
        for r, itl in zip(records, itls):
            _append_row(rows, r, itl)
        column: Callable[[str], list] = rows.pop  # each list dropped once converted
        pending: dict = rows
    else:  # every request completed (or is still running): one comprehension per column, when asked
        built = pending = _completed_columns(records, itls)

        def column(name: str) -> list:
            return built.pop(name)()
    data: dict[str, np.ndarray | list] = {}
    all_none: list[str] = []
    for name in REQUEST_COLUMNS:
        kind = _REQUEST_KINDS.get(name)
        event = _SINCE_ARRIVAL.get(name)
        if name == "itl_s" and lazy_gaps:
            pending.pop(name, None)
        elif event is not None:  # every row's event time less its arrival: NaN where the event is
            pending.pop(name, None)  # missing (as _sub's None), missing everywhere where it is
            data[name] = data[event] - data["arrival_s"]
            if event in all_none:
                all_none.append(name)
        elif kind == "f":
            data[name], missing = float_column(column(name))
            if missing:
                all_none.append(name)
        elif kind == "i":
            data[name] = np.array(column(name), dtype=np.int64)
        else:
            data[name] = column(name)
    return data, all_none


def _joined(parts: list[tuple[dict, list[str]]]) -> tuple[dict, list[str]]:
    """Consecutive row chunks' columns as one table's (a float column all missing where it is in
    every chunk, as float_column says of the whole)."""
    if len(parts) == 1:
        return parts[0]
    data: dict[str, np.ndarray | list] = {}
    for name in REQUEST_COLUMNS:
        if name not in parts[0][0]:  # a column the table builds from its flat buffer
            continue
        pieces = [p[0].pop(name) for p in parts]
        if isinstance(pieces[0], np.ndarray):
            data[name] = np.concatenate(pieces)
        else:
            data[name] = [v for piece in pieces for v in piece]
        del pieces
    return data, [name for name in parts[0][1] if all(name in p[1] for p in parts)]


def _completed_columns(records: list[RequestRecord], itls: list) -> dict[str, Callable[[], list]]:
    """The requests-frame columns when no request timed out or was rejected, each built when called:
    the very values _append_row's completed branch appends (those since arrival are taken from the
    columns: _SINCE_ARRIVAL). request_columns converts each to its
    array before building the next, so one column's Python objects exist at a time (1 M requests:
    ~30 MB a column of floats, not ~600 MB for all of them)."""
    n_out = [len(r.token_times_s) for r in records]
    return {
        "request_id": lambda: [r.request_id for r in records], "arrival_s": lambda: [r.arrival_s for r in records],
        "prompt_len": lambda: [r.prompt_len for r in records], "output_len": lambda: n_out,
        "output_len_target": lambda: [r.output_len_target for r in records],
        "first_scheduled_s": lambda: [r.first_scheduled_s for r in records],
        "first_token_s": lambda: [r.first_token_s for r in records], "finish_s": lambda: [r.finish_s for r in records],
        "tpot_s": lambda: [(r.token_times_s[-1] - r.token_times_s[0]) / (n - 1) if n > 1 else None
                           for r, n in zip(records, n_out)],
        "itl_s": lambda: itls,
        "num_preemptions": lambda: [r.num_preemptions for r in records],
        "num_cached_tokens": lambda: [r.num_cached_tokens for r in records],
        "finish_reason": lambda: [r.finish_reason for r in records],
        "status": lambda: ["completed" if r.finish_reason is not None else None for r in records],
        "reject_reason": lambda: [None] * len(records),
        "grammar_wait_s": lambda: [r.grammar_wait_s for r in records],
        "input_wait_s": lambda: [r.input_wait_s for r in records],
    }


REQUEST_COLUMNS = ["request_id", "arrival_s", "prompt_len", "output_len", "output_len_target", "first_scheduled_s",
                   "first_token_s", "finish_s", "queueing_s", "ttft_s", "tpot_s", "e2e_s", "itl_s",
                   "num_preemptions", "num_cached_tokens", "finish_reason", "status", "reject_reason",
                   "grammar_wait_s", "input_wait_s"]
# How request_columns stores each column: "f" float64 (NaN where missing), "i" int64; the rest as lists.
_REQUEST_KINDS = {"arrival_s": "f", "prompt_len": "i", "output_len": "i", "output_len_target": "i",
                  "first_scheduled_s": "f", "first_token_s": "f", "finish_s": "f", "queueing_s": "f",
                  "ttft_s": "f", "tpot_s": "f", "e2e_s": "f", "num_preemptions": "i", "num_cached_tokens": "i",
                  "grammar_wait_s": "f", "input_wait_s": "f"}
# Columns that are an event's time less the arrival, by the event's column: computed on the
# columns (the same float64 subtraction per row as _sub, NaN where the event is missing), after both.
_SINCE_ARRIVAL = {"queueing_s": "first_scheduled_s", "ttft_s": "first_token_s", "e2e_s": "finish_s"}
# Latency fields a rejected request leaves empty (NaN), so it never counts in a percentile or CDF.
_LATENCY_COLUMNS = ("first_scheduled_s", "first_token_s", "finish_s", "queueing_s", "ttft_s", "tpot_s", "e2e_s")


def _sub(a: float | None, b: float) -> float | None:
    return None if a is None else a - b


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
