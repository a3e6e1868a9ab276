"""The per-step rows of a run, stored by column.

Why columns: an hour-long replay has ~400k steps, most of them applied in bulk by macro-steps
(simulator/fastpath/planner.py). One object per step cost more to create and to transpose into the
steps frame than the steps took to simulate; a run of steps here is one `extend` per column, and
the frame is built from the columns as they are.

A step scheduled one at a time is appended when scheduled and completed at its update
(`set_gpu_time`, `set_update`), by the row number `append` returned.

Each column is an `array` of machine values (int64 or float64), not a list of Python objects: a
cluster hour has ~17 M steps, whose rows as lists held ~7 GB of boxed numbers; as arrays they take
8 bytes a value, and the frame copies each column in one memcpy. The newest rows (fewer than
_CHUNK past the last packing) wait in lists, and are packed into the arrays a chunk at a time by
`struct`: an `array` converts each value it is given through the C argument parser (~5x a list
append, ~4x struct's conversion), which on the Azure hour cost ~5 % of the run.

What the rows are read for after the run (the summary's step figures, the time series) is folded
from them (simulator/step_fold.py) in blocks aligned on the row number. A table that does not keep
its rows (`keep_rows=False`: a config's `step_rows: false`) folds each block as the run goes and
drops it, FOLD_LAG rows behind the newest (a step's times are completed at its update, after
later steps may have been scheduled); a table that keeps them folds them once the run is over.
Both fold the same blocks, so both give the same figures and series, byte for byte.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import numpy as np

from servesim.simulator.columns import Columns
from servesim.simulator.step_fold import FOLD_BLOCK, FOLDED_COLUMNS, StepFold

if TYPE_CHECKING:
    import pandas as pd

STEP_COLUMNS = ["step", "start_s", "duration_s", "gpu_time_s", "num_requests", "num_prefill_tokens",
                "num_decode_tokens", "kv_usage", "num_running", "num_waiting", "num_preemptions",
                "prefix_hit_tokens", "prefix_query_tokens"]
_CHUNK = 4096  # rows waiting as Python numbers before they are packed (~1.7 MB at most)
# Rows kept unfolded behind the newest (keep_rows=False): a step's duration and prefix stats are
# set at its update, while at most a pipeline's depth of later steps (async scheduling: one more)
# have been scheduled; completing a row already folded is an error, never a silent loss.
FOLD_LAG = 64


class StepTable:
    """Step rows (STEP_COLUMNS), one array per column, in step order.

    Units: `start_s` when the step was scheduled; `duration_s` schedule to output applied (GPU and
    CPU time charged to the step); `gpu_time_s` the GPU's share; `kv_usage` the fraction of usable
    blocks in use after the step was scheduled; `num_running` / `num_waiting` counted after the
    schedule; `prefix_*_tokens` the prefix-cache lookups applied with the step's output (vLLM's stats).

    Invariant: row r is in the arrays (`_packed[name][r]`) when r < `_num_packed`, else in the
    lists named after the columns, at r - `_num_packed`; every column has as many rows.
    """

    def __init__(self, keep_rows: bool = True) -> None:
        self.keep_rows = keep_rows
        # The rows not packed yet, one list per column (STEP_COLUMNS' names): declared one by one,
        # so the compiled engine (tools/build_native.py) reads them as native attributes.
        self.step: list[int] = []
        self.start_s: list[float] = []
        self.duration_s: list[float] = []
        self.gpu_time_s: list[float] = []
        self.num_requests: list[int] = []
        self.num_prefill_tokens: list[int] = []
        self.num_decode_tokens: list[int] = []
        self.kv_usage: list[float] = []
        self.num_running: list[int] = []
        self.num_waiting: list[int] = []
        self.num_preemptions: list[int] = []
        self.prefix_hit_tokens: list[int] = []
        self.prefix_query_tokens: list[int] = []
        self._packed: dict[str, array] | None = {name: array(_TYPECODES[name]) for name in STEP_COLUMNS}
        self._num_packed = 0
        # After move_to_columns: this table's rows as views of the columns they moved to (its own
        # are then None: the run is over, and a row added after would fail loudly, not vanish).
        self._moved: Columns | None = None
        # The rows folded so far (a prefix, in FOLD_BLOCK blocks), and those of them no longer in
        # the arrays (keep_rows=False: row r is at _packed[name][r - _num_dropped]).
        self.fold = StepFold()
        self._num_folded = 0
        self._num_dropped = 0
        self._fold_done = False

    def __len__(self) -> int:
        return self._num_packed + len(self.step) if self._moved is None else len(self._moved)

    def append(self, step: int, start_s: float, num_requests: int, num_prefill_tokens: int,
               num_decode_tokens: int, kv_usage: float, num_running: int, num_waiting: int,
               num_preemptions: int) -> int:
        """A step just scheduled; its times and prefix stats are filled in later. Returns its row."""
        if self._moved is not None or self._fold_done:
            raise RuntimeError("a step row added after the run's rows were folded or moved to columns")
        steps = self.step
        steps.append(step)
        self.start_s.append(start_s)
        self.duration_s.append(0.0)
        self.gpu_time_s.append(0.0)
        self.num_requests.append(num_requests)
        self.num_prefill_tokens.append(num_prefill_tokens)
        self.num_decode_tokens.append(num_decode_tokens)
        self.kv_usage.append(kv_usage)
        self.num_running.append(num_running)
        self.num_waiting.append(num_waiting)
        self.num_preemptions.append(num_preemptions)
        self.prefix_hit_tokens.append(0)
        self.prefix_query_tokens.append(0)
        if len(steps) >= _CHUNK:
            self._pack()
        return self._num_packed + len(self.step) - 1

    def set_gpu_time(self, row: int, gpu_time_s: float) -> None:
        i = row - self._num_packed
        if i >= 0:
            self.gpu_time_s[i] = gpu_time_s
        else:  # packed since (a step still in flight when its chunk filled)
            self._packed_arrays()["gpu_time_s"][self._packed_row(row)] = gpu_time_s

    def set_update(self, row: int, update_s: float, prefix_hit_tokens: int, prefix_query_tokens: int) -> None:
        """The step's output was applied at update_s (the step's duration ends there)."""
        i = row - self._num_packed
        if i >= 0:
            self.duration_s[i] = update_s - self.start_s[i]
            self.prefix_hit_tokens[i] = prefix_hit_tokens
            self.prefix_query_tokens[i] = prefix_query_tokens
            return
        packed = self._packed_arrays()
        r = self._packed_row(row)
        packed["duration_s"][r] = update_s - packed["start_s"][r]
        packed["prefix_hit_tokens"][r] = prefix_hit_tokens
        packed["prefix_query_tokens"][r] = prefix_query_tokens

    def _packed_row(self, row: int) -> int:
        """Where packed row `row` is in the arrays; an error for a row already folded."""
        if row < self._num_folded:
            raise RuntimeError(f"step row {row} completed after it was folded (more than FOLD_LAG={FOLD_LAG} "
                               "steps in flight)")
        return row - self._num_dropped

    def extend_decode_run(self, first_step: int, start_s: list[float], duration_s: list[float],
                          gpu_time_s: list[float], num_requests: int | list[int], kv_usage: Iterable[float],
                          num_running: int | list[int], num_waiting: int, prefix_hit_tokens: list[int],
                          prefix_query_tokens: list[int], num_decode_tokens: list[int] | None = None,
                          num_prefill_tokens: list[int] | None = None) -> None:
        """len(start_s) plain decode steps of num_requests requests each (a macro-step): no prefill
        tokens, no preemptions; the prefix-cache stats each step's update took (a waiting
        request's lookups: it stays blocked). duration_s may be one shorter than start_s (the last
        step's update is still to come: set_update completes it, prefix stats included).
        num_requests and num_running may be lists, a value per step (a run through finishes);
        num_decode_tokens a list when a step's requests schedule more than a token each (speculative
        verify steps), else each step's num_requests; num_prefill_tokens a list where a step
        computes a prompt too (a verify run's first step, a prompt joining it), else none."""
        if self._moved is not None or self._fold_done:
            raise RuntimeError("step rows added after the run's rows were folded or moved to columns")
        k = len(start_s)
        steps = self.step
        steps.extend(range(first_step, first_step + k))
        self.start_s.extend(start_s)
        self.duration_s.extend(duration_s)
        if len(duration_s) < k:
            self.duration_s.extend([0.0] * (k - len(duration_s)))
        self.gpu_time_s.extend(gpu_time_s)
        sizes = num_requests if isinstance(num_requests, list) else [num_requests] * k
        zeros = [0] * k
        self.num_requests.extend(sizes)
        self.num_prefill_tokens.extend(zeros if num_prefill_tokens is None else num_prefill_tokens)
        self.num_decode_tokens.extend(sizes if num_decode_tokens is None else num_decode_tokens)
        self.kv_usage.extend(kv_usage)
        self.num_running.extend(num_running if isinstance(num_running, list) else [num_running] * k)
        self.num_waiting.extend([num_waiting] * k)
        self.num_preemptions.extend(zeros)
        self.prefix_hit_tokens.extend(prefix_hit_tokens)
        self.prefix_query_tokens.extend(prefix_query_tokens)
        if len(steps) >= _CHUNK:
            self._pack()

    def _pack(self) -> None:
        """Move the rows waiting in the lists into the arrays (one struct conversion a column)."""
        packed = self._packed_arrays()
        n = len(self.step)
        if not n:
            return
        for name in STEP_COLUMNS:
            rows: list = getattr(self, name)
            if len(rows) != n:  # a caller broke the one-row-per-column invariant: say so, not shift rows
                raise ValueError(f"step table column {name!r} has {len(rows)} new rows, 'step' has {n}")
            packed[name].frombytes(struct.pack(f"{n}{_TYPECODES[name]}", *rows))
            rows.clear()
        self._num_packed += n
        if not self.keep_rows:
            self._fold_blocks(lag=FOLD_LAG)

    def _fold_blocks(self, lag: int) -> None:
        """Fold the packed rows in whole FOLD_BLOCK blocks, leaving at least `lag` unfolded; a table
        that does not keep its rows drops each block from its arrays once folded."""
        packed = self._packed_arrays()
        while self._num_packed - self._num_folded >= FOLD_BLOCK + lag:
            self._fold_rows(packed, self._num_folded, self._num_folded + FOLD_BLOCK)
        if not self.keep_rows and self._num_folded > self._num_dropped:
            drop = self._num_folded - self._num_dropped
            for arr in packed.values():
                del arr[:drop]
            self._num_dropped = self._num_folded

    def _fold_rows(self, packed: dict[str, array], start: int, stop: int) -> None:
        a, b = start - self._num_dropped, stop - self._num_dropped
        self.fold.fold({name: np.frombuffer(packed[name], dtype=_DTYPES[name])[a:b] for name in FOLDED_COLUMNS})
        self._num_folded = stop

    def finish_fold(self) -> StepFold:
        """Every row folded (the run is over: no row is completed after this): the table's fold."""
        if not self._fold_done:
            if self._moved is not None:
                raise RuntimeError("the table's rows moved to columns before they were folded")
            self._pack()
            packed = self._packed_arrays()
            self._fold_blocks(lag=0)
            if self._num_packed > self._num_folded:  # the last, shorter block
                self._fold_rows(packed, self._num_folded, self._num_packed)
            self._fold_done = True
        return self.fold

    def _drop_rows(self) -> None:
        """Empty the unpacked rows' lists (their rows were packed; appending is refused after)."""
        for name in STEP_COLUMNS:
            rows: list = getattr(self, name)
            rows.clear()

    def _packed_arrays(self) -> dict[str, array]:
        """The arrays of the rows packed so far (an error once the rows moved to columns)."""
        if self._packed is None:
            raise AttributeError("the table's rows moved to columns (move_to_columns)")
        return self._packed

    def _arrays(self) -> dict[str, array]:
        """Every row packed: the columns' arrays (the table keeps them)."""
        if not self.keep_rows:
            raise RuntimeError("the run kept no step rows (step_rows: false): read its fold (finish_fold)")
        self._pack()
        return self._packed_arrays()

    def column(self, name: str) -> array | np.ndarray:
        """One column's values (read only: the table owns the array, or the columns its rows moved to)."""
        return self._arrays()[name] if self._moved is None else self._moved.array(name)

    def columns(self) -> Columns:
        """The rows as new columns (copies: more rows may still be added to the table)."""
        if self._moved is not None:
            return Columns({name: self._moved.array(name).copy() for name in STEP_COLUMNS}, STEP_COLUMNS)
        arrays = self._arrays()
        return Columns({name: np.array(arrays[name], dtype=_DTYPES[name]) for name in STEP_COLUMNS}, STEP_COLUMNS)

    def frame(self) -> pd.DataFrame:
        """A new steps frame; an empty table gives typed empty columns (int and float, not object)."""
        return self.columns().frame()

    @staticmethod
    def move_to_columns(tables: list[StepTable], after_column: Callable[[], object] | None = None) -> Columns:
        """The rows of several tables, one table after another (a cluster's replicas), as one set of
        columns, each value copied once. The rows move: each column's arrays are freed as soon as
        they are copied (a cluster hour's ~17 M steps take ~1.8 GB, held once, not twice), and
        each table then answers len, column and columns from its rows of the result (views).
        `after_column` runs once each column's arrays are freed (e.g. to hand that memory back
        before the next column is copied: collector.release_freed_heap). One table's rows are
        not copied: the columns view its arrays (MetricsCollector.columns, after a run)."""
        if not tables:
            return StepTable().columns()
        for t in tables:  # what is read of the rows is folded before they move
            t.finish_fold()
        sizes = [len(t) for t in tables]
        arrays = [t._arrays() for t in tables]
        for t in tables:  # the table's own rows are gone (the views below keep what they need)
            t._packed = None
            t._drop_rows()
        cols: dict[str, np.ndarray | list] = {}
        for name in STEP_COLUMNS:
            parts = [np.frombuffer(a.pop(name), dtype=_DTYPES[name]) for a in arrays]
            # One table with rows (a single engine's run): its arrays viewed, no copy (the views
            # keep them alive; the table's columns are dropped as for several).
            cols[name] = parts[0] if len(parts) == 1 and sizes[0] else np.concatenate(parts)
            del parts
            if after_column is not None:
                after_column()
        moved = Columns(cols, STEP_COLUMNS)
        start = 0
        for t, n in zip(tables, sizes):
            t._moved = Columns({name: moved.array(name)[start:start + n] for name in STEP_COLUMNS}, STEP_COLUMNS)
            start += n
        return moved

    @staticmethod
    def move_to_frame(tables: list[StepTable], after_column: Callable[[], object] | None = None) -> pd.DataFrame:
        """move_to_columns' rows as one steps frame (viewing the columns: no second copy)."""
        return StepTable.move_to_columns(tables, after_column).frame()


_DTYPES = {name: ("float64" if name.endswith("_s") or name == "kv_usage" else "int64") for name in STEP_COLUMNS}
_TYPECODES = {name: ("d" if dtype == "float64" else "q") for name, dtype in _DTYPES.items()}
