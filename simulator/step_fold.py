"""What a run's step rows are read for, folded from them block by block: the summary's step figures
(steps, preemptions, mean KV usage, busy time) and the 1-second time series.

Why fold: a day of a busy 64-replica fleet is ~2x10^8 steps, ~21 GB of rows. A run with
`step_rows: false` folds each block of rows as the run goes and drops it; a run that keeps its rows
folds them the same way after the run. Both give the same bytes: blocks are aligned on the row
number (FOLD_BLOCK rows from row 0), every sum is taken per block in one way (exactly rounded:
math.fsum) and the series and the busy intervals are the same sets whatever the blocks.

Invariant: one engine's rows are folded in row (= step) order, and a step starts no earlier than
the step before it (steps are scheduled one after another on one clock); a fold refuses rows that
break it rather than answer wrong.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass

import numpy as np

from servesim.simulator.columns import Columns

FOLD_BLOCK = 4096  # rows per block (the sums' grouping: changing it changes the last bits of means)
# The series' columns (simulator/metrics.py TIMESERIES_COLUMNS) and the per-second state behind them.
SERIES_COLUMNS = ["t_s", "running", "waiting", "kv_cache_pct", "prefill_tokens_per_s", "decode_tokens_per_s"]
RANK_COLUMNS = ("running", "waiting", "kv_cache_pct")  # a group's series adds these per replica
# Runs longer than this many seconds get a sparse series: 11.6 days of 1-s rows is ~50 MB of
# columns; a trace spanning years would otherwise take gigabytes.
MAX_DENSE_TICKS = 1_000_000
FOLDED_COLUMNS = ("start_s", "duration_s", "num_prefill_tokens", "num_decode_tokens", "num_running",
                  "num_waiting", "kv_usage", "num_preemptions")


@dataclass(slots=True, frozen=True)
class StepFigures:
    """The summary's figures of a run's steps (of one engine, or of several: step_figures)."""

    num_steps: int
    num_preemptions: int
    kv_usage_mean: float  # over steps (0.0 for none)
    busy_s: float  # length of the union of the steps' [start_s, start_s + duration_s) intervals


class StepFold:
    """One engine's step rows folded (fold, a block at a time, in row order).

    Per second s in which a step started ("touched", ascending): the state (running, waiting, KV
    usage) of the last step started at or before the tick s, the state of the last step started in
    [s, s + 1), and the prefill and decode tokens of the steps started in [s, s + 1). The series at
    any tick T follows: T touched -> its tick state; else the end state of the last touched second
    before T (no step started in between); none -> idle (0)."""

    def __init__(self) -> None:
        self.num_steps = 0
        self.num_preemptions = 0
        self._kv_sums: list[float] = []  # math.fsum of each block's kv_usage
        self._last: tuple[float, int, int, float] | None = None  # (start s, running, waiting, kv) of the last row
        # The busy intervals: closed ones, and the open one (start, reach) the next rows may extend.
        self._busy_start = array("d")
        self._busy_end = array("d")
        self._open: tuple[float, float] | None = None
        self._sec = array("d")
        self._state = {name: array(code) for name, code in _STATE_CODES.items()}
        self._tokens = {"prefill": array("q"), "decode": array("q")}

    def fold(self, cols: dict[str, np.ndarray]) -> None:
        """The next rows, in order (FOLDED_COLUMNS, equal lengths): one aligned block of the table,
        or its last, shorter one."""
        start = cols["start_s"]
        n = len(start)
        if not n:
            return
        if (self._last is not None and start[0] < self._last[0]) or np.any(start[1:] < start[:-1]):
            raise ValueError("step rows folded out of start order (a step started before the one before it)")
        self.num_steps += n
        self.num_preemptions += int(cols["num_preemptions"].sum())
        self._kv_sums.append(math.fsum(cols["kv_usage"].tolist()))
        self._fold_busy(start, start + cols["duration_s"])
        self._fold_series(start, cols)
        self._last = (float(start[-1]), int(cols["num_running"][-1]), int(cols["num_waiting"][-1]),
                      float(cols["kv_usage"][-1]))

    def _fold_busy(self, start: np.ndarray, end: np.ndarray) -> None:
        """Extend the maximal busy intervals (start order: a step opens a new one when it starts
        after every earlier step ended)."""
        carried = -math.inf if self._open is None else self._open[1]
        reach = np.maximum(np.maximum.accumulate(end), carried)
        before = np.concatenate(([carried], reach[:-1]))
        opens = np.flatnonzero(start > before)
        # interval k runs from start[opens[k]] to the reach just before the next one opens
        if self._open is not None and (not len(opens) or opens[0] > 0):
            first = (self._open[0], float(reach[opens[0] - 1]) if len(opens) else float(reach[-1]))
        else:
            first = None
        if not len(opens):
            self._open = first
            return
        if first is not None:
            self._busy_start.append(first[0])
            self._busy_end.append(first[1])
        elif self._open is not None:  # the block's first row opens a new interval: the old one closes
            self._busy_start.append(self._open[0])
            self._busy_end.append(self._open[1])
        self._busy_start.extend(start[opens[:-1]].tolist())
        self._busy_end.extend(reach[opens[1:] - 1].tolist())
        self._open = (float(start[opens[-1]]), float(reach[-1]))

    def _fold_series(self, start: np.ndarray, cols: dict[str, np.ndarray]) -> None:
        sec = np.floor(start)
        n = len(start)
        change = np.flatnonzero(sec[1:] != sec[:-1]) + 1
        first = np.concatenate(([0], change))
        last = np.concatenate((change - 1, [n - 1]))
        touched = sec[first]
        at = np.searchsorted(start, touched, side="right") - 1  # last row started at or before the tick
        prev = self._last
        states = {}
        for name, col, k in (("running", "num_running", 1), ("waiting", "num_waiting", 2), ("kv", "kv_usage", 3)):
            values = cols[col]
            before = (0 if name != "kv" else 0.0) if prev is None else prev[k]
            states[f"tick_{name}"] = np.where(at >= 0, values[np.maximum(at, 0)], before)
            states[f"end_{name}"] = values[last]
        tokens = {"prefill": np.add.reduceat(cols["num_prefill_tokens"], first),
                  "decode": np.add.reduceat(cols["num_decode_tokens"], first)}
        skip = 0
        if len(self._sec) and self._sec[-1] == touched[0]:  # the previous block's last second goes on
            skip = 1
            for name in ("running", "waiting", "kv"):
                self._state[f"end_{name}"][-1] = states[f"end_{name}"][0].item()
                if at[0] >= 0:  # a row of this block started at or before the tick
                    self._state[f"tick_{name}"][-1] = states[f"tick_{name}"][0].item()
            for name in ("prefill", "decode"):
                self._tokens[name][-1] += int(tokens[name][0])
        self._sec.frombytes(touched[skip:].tobytes())
        for name, values in states.items():
            self._state[name].frombytes(values[skip:].astype(_STATE_DTYPES[name], copy=False).tobytes())
        for name, values in tokens.items():
            self._tokens[name].frombytes(values[skip:].astype(np.int64, copy=False).tobytes())

    # --- after the run ------------------------------------------------------------------------
    def touched_seconds(self) -> np.ndarray:
        return np.frombuffer(self._sec, dtype=np.float64)

    def busy_intervals(self) -> tuple[np.ndarray, np.ndarray]:
        """The maximal busy intervals (starts, ends), in start order."""
        starts, ends = np.array(self._busy_start), np.array(self._busy_end)
        if self._open is not None:
            starts, ends = np.append(starts, self._open[0]), np.append(ends, self._open[1])
        return starts, ends

    def series(self, ticks: np.ndarray) -> dict[str, np.ndarray]:
        """This engine's series at `ticks` (SERIES_COLUMNS but t_s): running, waiting and KV usage
        (%) of the last step started at or before each tick, tokens of the steps started in [t, t + 1)."""
        sec = self.touched_seconds()
        k = np.searchsorted(sec, ticks, side="right") - 1
        valid = k >= 0
        kk = np.where(valid, k, 0)
        on = valid & (sec[kk] == ticks) if len(sec) else valid
        out: dict[str, np.ndarray] = {}
        for name, col in (("running", "running"), ("waiting", "waiting"), ("kv", "kv_cache_pct")):
            tick = np.frombuffer(self._state[f"tick_{name}"], dtype=_STATE_DTYPES[f"tick_{name}"])
            end = np.frombuffer(self._state[f"end_{name}"], dtype=_STATE_DTYPES[f"end_{name}"])
            if not len(sec):
                value = np.zeros(len(ticks), dtype=tick.dtype)
            else:
                value = np.where(valid, np.where(on, tick[kk], end[kk]), tick.dtype.type(0))
            out[col] = 100.0 * value if name == "kv" else value
        for name in ("prefill", "decode"):
            tokens = np.frombuffer(self._tokens[name], dtype=np.int64)
            out[f"{name}_tokens_per_s"] = (np.where(on, tokens[kk], 0) if len(sec) else
                                           np.zeros(len(ticks), dtype=np.int64)).astype(np.float64)
        return out

    def kv_sums(self) -> list[float]:
        return self._kv_sums


_STATE_DTYPES = {f"{when}_{name}": (np.float64 if name == "kv" else np.int64)
                 for when in ("tick", "end") for name in ("running", "waiting", "kv")}
_STATE_CODES = {name: ("d" if dtype is np.float64 else "q") for name, dtype in _STATE_DTYPES.items()}


def step_figures(folds: list[StepFold]) -> StepFigures:
    """The figures of several engines' steps together (a cluster's): counts summed, KV usage the
    mean over every step, busy time the union of every engine's intervals."""
    num_steps = sum(f.num_steps for f in folds)
    kv = math.fsum(s for f in folds for s in f.kv_sums()) / num_steps if num_steps else 0.0
    parts = [f.busy_intervals() for f in folds]
    starts = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0)
    ends = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0)
    return StepFigures(num_steps, sum(f.num_preemptions for f in folds), kv, _union_length_s(starts, ends))


def _union_length_s(starts: np.ndarray, ends: np.ndarray) -> float:
    """Length of the union of the intervals [starts, ends) (its maximal intervals' lengths summed
    exactly rounded, so the same union gives the same bytes however it was split)."""
    if not len(starts):
        return 0.0
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)
    opens = np.flatnonzero(np.concatenate(([True], starts[1:] > reach[:-1])))
    closes = np.concatenate((opens[1:] - 1, [len(starts) - 1]))
    return math.fsum((reach[closes] - starts[opens]).tolist())


def series_ticks(folds: list[StepFold], end_s: float) -> np.ndarray:
    """The series' tick times (whole seconds, ascending): every second of the run up to
    MAX_DENSE_TICKS; a longer run keeps only the seconds in which a step started and the second
    after each (where the series falls back to idle), so it is sized by the steps, never by the
    simulated span."""
    n = math.floor(max(end_s, 0.0)) + 1
    if n <= MAX_DENSE_TICKS:
        return np.arange(0.0, float(n))
    secs = [f.touched_seconds() for f in folds if f.num_steps]
    if not secs:
        return np.array([0.0, float(n - 1)])
    sec = np.unique(np.concatenate(secs))
    return np.union1d(np.union1d(sec, sec + 1.0), [0.0, float(n - 1)])


def fold_series(fold: StepFold, end_s: float) -> Columns:
    """One engine's 1-second series (SERIES_COLUMNS): state at the last step that started at or
    before each tick, tokens per second over [t, t + 1)."""
    ticks = series_ticks([fold], end_s)
    return Columns({"t_s": ticks, **fold.series(ticks)}, SERIES_COLUMNS)


def group_series(folds: dict[int, StepFold], end_s: float) -> Columns:
    """A group's series (a cluster's replicas, by replica index, ascending): each replica's own
    series, then the counts (running, waiting, tokens per second) summed over the replicas and KV
    usage their mean (each replica has its own pool; DP ranks' pools are equal, so the mean is the
    group's usage), with each replica's running, waiting and KV usage beside (`running_rank<i>`,
    `waiting_rank<i>`, `kv_cache_pct_rank<i>`, i its index)."""
    ticks = series_ticks(list(folds.values()), end_s)
    per = {i: folds[i].series(ticks) for i in sorted(folds)}
    data = {"t_s": ticks}
    for col in SERIES_COLUMNS[1:]:
        stacked = np.stack([p[col] for p in per.values()])
        data[col] = stacked.mean(axis=0) if col == "kv_cache_pct" else stacked.sum(axis=0)
    for i, p in per.items():
        data.update({f"{col}_rank{i}": p[col] for col in RANK_COLUMNS})
    return Columns(data)


class RunFolds:
    """A finished run's folds: one engine's (`grouped` False: the plain series), or a group's by
    replica index (a cluster's: the group series, with each replica's beside); `rows_kept` False:
    the rows themselves were dropped as they were folded (step_rows: false). Figures and series
    are built once and kept."""

    __slots__ = ("folds", "grouped", "rows_kept", "_figures", "_series")

    def __init__(self, folds: dict[int, StepFold], grouped: bool, rows_kept: bool = True) -> None:
        if not grouped and len(folds) != 1:
            raise ValueError(f"a plain series is one engine's, got {len(folds)} folds")
        self.folds = folds
        self.grouped = grouped
        self.rows_kept = rows_kept
        self._figures: StepFigures | None = None
        self._series: dict[float, Columns] = {}

    def figures(self) -> StepFigures:
        if self._figures is None:
            self._figures = step_figures(list(self.folds.values()))
        return self._figures

    def series(self, end_s: float) -> Columns:
        if end_s not in self._series:
            if not self.grouped:
                self._series[end_s] = fold_series(next(iter(self.folds.values())), end_s)
            else:  # replicas that took a step (none at all: the plain, idle series)
                stepped = {i: f for i, f in self.folds.items() if f.num_steps}
                self._series[end_s] = group_series(stepped, end_s) if stepped else fold_series(StepFold(), end_s)
        return self._series[end_s]


def fold_columns(cols: dict[str, np.ndarray]) -> StepFold:
    """One engine's rows (FOLDED_COLUMNS as arrays, in step order) folded as its table folds them."""
    fold = StepFold()
    for a in range(0, len(cols["start_s"]), FOLD_BLOCK):
        fold.fold({name: cols[name][a:a + FOLD_BLOCK] for name in FOLDED_COLUMNS})
    return fold
