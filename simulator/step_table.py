"""The per-step rows of a run, stored by column.

Why columns: an hour-long replay has ~400k steps, most of them applied in bulk by macro-steps
(simulator/macro_step.py). One object per step cost more to create and to transpose into the
steps frame than the steps took to simulate; a run of steps here is one `extend` per column, and
the frame is built from the columns as they are.

A step scheduled one at a time is appended when scheduled and completed at its update
(`set_gpu_time`, `set_update`), by the row number `append` returned.

Each column is an `array` of machine values (int64 or float64), not a list of Python objects: a
cluster hour has ~17 M steps, whose rows as lists held ~7 GB of boxed numbers; as arrays they take
8 bytes a value, and the frame copies each column in one memcpy.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import numpy as np

from servesim.simulator.columns import Columns

if TYPE_CHECKING:
    import pandas as pd

STEP_COLUMNS = ["step", "start_s", "duration_s", "gpu_time_s", "num_requests", "num_prefill_tokens",
                "num_decode_tokens", "kv_usage", "num_running", "num_waiting", "num_preemptions",
                "prefix_hit_tokens", "prefix_query_tokens"]


class StepTable:
    """Step rows (STEP_COLUMNS), one array per column, in step order.

    Units: `start_s` when the step was scheduled; `duration_s` schedule to output applied (GPU and
    CPU time charged to the step); `gpu_time_s` the GPU's share; `kv_usage` the fraction of usable
    blocks in use after the step was scheduled; `num_running` / `num_waiting` counted after the
    schedule; `prefix_*_tokens` the prefix-cache lookups applied with the step's output (vLLM's stats).
    """

    __slots__ = ("step", "start_s", "duration_s", "gpu_time_s", "num_requests", "num_prefill_tokens",
                 "num_decode_tokens", "kv_usage", "num_running", "num_waiting", "num_preemptions",
                 "prefix_hit_tokens", "prefix_query_tokens", "_moved")

    def __init__(self) -> None:
        for name in STEP_COLUMNS:
            setattr(self, name, array(_TYPECODES[name]))
        # After move_to_columns: this table's rows as views of the columns they moved to (its own
        # are then None: the run is over, and a row added after would fail loudly, not vanish).
        self._moved: Columns | None = None

    def __len__(self) -> int:
        return len(self.step) if self._moved is None else len(self._moved)

    def append(self, step: int, start_s: float, num_requests: int, num_prefill_tokens: int,
               num_decode_tokens: int, kv_usage: float, num_running: int, num_waiting: int,
               num_preemptions: int) -> int:
        """A step just scheduled; its times and prefix stats are filled in later. Returns its row."""
        self.step.append(step)
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
        return len(self.step) - 1

    def set_gpu_time(self, row: int, gpu_time_s: float) -> None:
        self.gpu_time_s[row] = gpu_time_s

    def set_update(self, row: int, update_s: float, prefix_hit_tokens: int, prefix_query_tokens: int) -> None:
        """The step's output was applied at update_s (the step's duration ends there)."""
        self.duration_s[row] = update_s - self.start_s[row]
        self.prefix_hit_tokens[row] = prefix_hit_tokens
        self.prefix_query_tokens[row] = prefix_query_tokens

    def extend_decode_run(self, first_step: int, start_s: list[float], duration_s: list[float],
                          gpu_time_s: list[float], num_requests: int | list[int], kv_usage: Iterable[float],
                          num_running: int | list[int], num_waiting: int, prefix_hit_tokens: list[int],
                          prefix_query_tokens: list[int]) -> None:
        """len(start_s) plain decode steps of num_requests requests each (a macro-step): no prefill
        tokens, no preemptions; the prefix-cache stats each step's update took (a waiting
        request's lookups: it stays blocked). duration_s may be one shorter than start_s (the last
        step's update is still to come: set_update completes it, prefix stats included).
        num_requests and num_running may be lists, a value per step (a run through finishes)."""
        k = len(start_s)
        # lists go in by fromlist (one typed C loop), repeated values as a repeated one-item array
        self.step.extend(array("q", range(first_step, first_step + k)))
        self.start_s.fromlist(start_s)
        self.duration_s.fromlist(duration_s)
        self.duration_s.extend(_ZERO_F * (k - len(duration_s)))
        self.gpu_time_s.fromlist(gpu_time_s)
        sizes = array("q", num_requests) if isinstance(num_requests, list) else array("q", (num_requests,)) * k
        self.num_requests.extend(sizes)
        self.num_prefill_tokens.extend(_ZERO_I * k)
        self.num_decode_tokens.extend(sizes)
        self.kv_usage.extend(array("d", kv_usage))
        self.num_running.extend(array("q", num_running) if isinstance(num_running, list)
                                else array("q", (num_running,)) * k)
        self.num_waiting.extend(array("q", (num_waiting,)) * k)
        self.num_preemptions.extend(_ZERO_I * k)
        self.prefix_hit_tokens.fromlist(prefix_hit_tokens)
        self.prefix_query_tokens.fromlist(prefix_query_tokens)

    def column(self, name: str) -> array | np.ndarray:
        """One column's values (read only: the table owns the array, or the columns its rows moved to)."""
        return getattr(self, name) if self._moved is None else self._moved[name]

    def columns(self) -> Columns:
        """The rows as new columns (copies: more rows may still be added to the table)."""
        if self._moved is not None:
            return Columns({name: self._moved[name].copy() for name in STEP_COLUMNS}, STEP_COLUMNS)
        return Columns({name: np.array(getattr(self, name), dtype=_DTYPES[name]) for name in STEP_COLUMNS},
                       STEP_COLUMNS)

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
        sizes = [len(t) for t in tables]
        cols: dict[str, np.ndarray | list] = {}
        for name in STEP_COLUMNS:
            parts = [np.frombuffer(getattr(t, name), dtype=_DTYPES[name]) for t in tables]
            # One table with rows (a single engine's run): its arrays viewed, no copy (the views
            # keep them alive; the table's columns are dropped below as for several).
            cols[name] = parts[0] if len(parts) == 1 and sizes[0] else np.concatenate(parts)
            for t in tables:
                setattr(t, name, None)
            if after_column is not None:
                after_column()
        moved = Columns(cols, STEP_COLUMNS)
        start = 0
        for t, n in zip(tables, sizes):
            t._moved = Columns({name: moved[name][start:start + n] for name in STEP_COLUMNS}, STEP_COLUMNS)
            start += n
        return moved

    @staticmethod
    def move_to_frame(tables: list[StepTable], after_column: Callable[[], object] | None = None) -> pd.DataFrame:
        """move_to_columns' rows as one steps frame (viewing the columns: no second copy)."""
        return StepTable.move_to_columns(tables, after_column).frame()


_DTYPES = {name: ("float64" if name.endswith("_s") or name == "kv_usage" else "int64") for name in STEP_COLUMNS}
_TYPECODES = {name: ("d" if dtype == "float64" else "q") for name, dtype in _DTYPES.items()}
_ZERO_I = array("q", (0,))
_ZERO_F = array("d", (0.0,))
