"""A finished run's tables as named numpy columns, read without pandas.

Why: a replay's summary, its result files and the plug-in metrics read a few columns each, and
pandas itself costs ~0.2-0.6 s to import, ~5 % of the Azure conversation hour's whole process
(docs/SPEED.md). A `Columns` is what they read instead; `frame()` builds the pandas DataFrame for
whoever wants one (servesim.api's Results, the cluster's frames, a plug-in that needs pandas),
the very frame the run's columns always made.

A column is a 1-D numpy array (numbers: int64, float64 with NaN where a value is missing) or a
list (objects: ids, reasons, a request's inter-token gaps). `t[name]` always answers an array
(an object array for a list, built once); `t[mask]` keeps the rows where a boolean array is true
(the table itself when it is true everywhere). A Columns is read-only: no reader changes a column
in place (the arrays are shared between a table and its selections).

A list column of float arrays may come with its values laid end to end in one buffer (`flat`: a
FlatList, e.g. every request's inter-token gaps, which the summary pools and the result file
stores as one list array): readers of every row take the buffer rather than concatenating the
rows again, and a row range (`rows`) keeps its part of it.

An integer column with missing values (a cluster request's decode replica: none for a request
the gateway refused) is stored as the result file stores it, int64 while every value is there and
float64 with NaN otherwise; `nullable_ints` names such columns, which the frame shows as pandas'
nullable Int64.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(slots=True, frozen=True)
class FlatList:
    """A list column's float arrays laid end to end: row i is values[offsets[i]:offsets[i + 1]]
    (offsets int64, one more than the rows, offsets[0] == 0). Read-only: the rows are views of it."""

    values: np.ndarray
    offsets: np.ndarray

    def rows(self, start: int, stop: int) -> FlatList:
        first, last = int(self.offsets[start]), int(self.offsets[stop])
        return FlatList(self.values[first:last], self.offsets[start:stop + 1] - first)

    def row_list(self) -> list[np.ndarray | list]:
        """Each row as a view of the buffer; [] for a row with no value (so a column with no value
        at all keeps its parquet type, as a list of empty lists)."""
        values, ends = self.values, self.offsets.tolist()
        return [values[a:b] if b > a else [] for a, b in zip(ends[:-1], ends[1:])]


class Columns:
    """Named columns of one length, in order (see the module docstring)."""

    __slots__ = ("columns", "_data", "_arrays", "_len", "_none", "_flat", "_nullable_ints")

    def __init__(self, data: dict[str, np.ndarray | list], columns: Sequence[str] | None = None,
                 none_in_frame: Iterable[str] = (), flat: dict[str, FlatList] | None = None,
                 nullable_ints: Iterable[str] = ()) -> None:
        """`none_in_frame`: float columns whose every value is missing, which the frame shows as
        None (object), as pandas types a column of None alone (float_column says which). `flat`:
        list columns whose rows are exactly the slices of a FlatList (the rows' values as they are
        in the list: the FlatList is the same values, not other ones); such a column may be left
        out of `data`: its list of row views is then built when first read (never, for a replay's
        summary and result files, which read the buffer: 1 M requests' views are ~0.1 GB).
        `nullable_ints`: integer columns with missing values (the module docstring)."""
        self.columns: list[str] = list(data) if columns is None else list(columns)
        flat = dict(flat or {})
        lengths = {len(data[name]) if name in data else len(flat[name].offsets) - 1 for name in self.columns}
        if len(lengths) > 1:
            raise ValueError(f"columns of different lengths: {sorted(lengths)}")
        self._data = data
        self._arrays: dict[str, np.ndarray] = {}
        self._len = lengths.pop() if lengths else 0
        self._none = frozenset(none_in_frame)
        self._flat = flat
        self._nullable_ints = frozenset(nullable_ints)
        for name, fl in self._flat.items():
            if len(fl.offsets) != self._len + 1:
                raise ValueError(f"column {name!r}: {len(fl.offsets) - 1} flat rows, the table has {self._len}")

    @staticmethod
    def of_frame(frame) -> Columns:
        """A pandas DataFrame's columns: numbers as their arrays, the rest as lists (a nullable
        Int64 column as int64, or float64 with NaN where values are missing)."""
        data: dict[str, np.ndarray | list] = {}
        for name in frame.columns:
            values = frame[name].to_numpy()
            data[str(name)] = values if values.dtype.kind in "biuf" else values.tolist()
        nullable = [str(name) for name in frame.columns if str(frame[name].dtype) == "Int64"]
        return Columns(data, [str(name) for name in frame.columns], nullable_ints=nullable)

    def __len__(self) -> int:
        return self._len

    def __contains__(self, name: object) -> bool:
        return name in self._data or name in self._flat

    @property
    def none_in_frame(self) -> frozenset[str]:
        """Float columns whose every value is missing: the frame shows them as None (object)."""
        return self._none

    @property
    def empty(self) -> bool:
        return self._len == 0

    def flat(self, name: str) -> FlatList | None:
        """The list column's rows laid end to end in one buffer, where the table has it (None: not kept)."""
        return self._flat.get(name)

    def rows(self, start: int, stop: int) -> Columns:
        """Rows start..stop-1 (slices: views of the arrays, flat buffers kept)."""
        data = {name: self._data[name][start:stop] for name in self.columns if name in self._data}
        return Columns(data, self.columns, self._none, {n: fl.rows(start, stop) for n, fl in self._flat.items()},
                       self._nullable_ints)

    def inserted(self, position: int, new: dict[str, np.ndarray | list], nullable_ints: Iterable[str] = ()) -> Columns:
        """A table with the `new` columns (in order) placed before the column at `position`; the
        existing columns are shared, not copied."""
        if set(new) & set(self.columns):
            raise ValueError(f"columns already present: {sorted(set(new) & set(self.columns))}")
        data = {name: self._data[name] for name in self.columns if name in self._data}
        data.update(new)
        order = [*self.columns[:position], *new, *self.columns[position:]]
        return Columns(data, order, self._none, self._flat, self._nullable_ints | frozenset(nullable_ints))

    def raw(self, name: str) -> np.ndarray | list:
        """The column as stored (a list stays a list)."""
        return self._column(name)

    def _column(self, name: str) -> np.ndarray | list:
        values = self._data.get(name)
        if values is None:
            if name not in self._flat:
                raise KeyError(name)
            values = self._data[name] = self._flat[name].row_list()
        return values

    def __getitem__(self, key: str | np.ndarray) -> np.ndarray | Columns:
        if isinstance(key, str):
            return self.array(key)
        return self.take(np.asarray(key))

    def array(self, name: str) -> np.ndarray:
        """The column as a numpy array (object dtype for a list; built once)."""
        values = self._column(name)
        if isinstance(values, np.ndarray):
            return values
        out = self._arrays.get(name)
        if out is None:
            # fromiter: an item that is itself a sequence (a request's gaps) stays one object
            out = self._arrays[name] = np.fromiter(values, dtype=object, count=len(values))
        return out

    def take(self, mask: np.ndarray) -> Columns:
        """The rows where the boolean mask is true, in order."""
        if mask.dtype != np.bool_ or mask.shape != (self._len,):
            raise ValueError(f"a row mask is a boolean array of {self._len} values")
        if mask.all():  # every row: this very table (read-only), not a copy of each column
            return self  # (every request finished: the summary's and the bench figures' selections)
        rows = np.flatnonzero(mask).tolist()
        data: dict[str, np.ndarray | list] = {}
        for name in self.columns:
            values = self._column(name)
            data[name] = values[mask] if isinstance(values, np.ndarray) else [values[i] for i in rows]
        return Columns(data, self.columns, self._none, nullable_ints=self._nullable_ints)

    def frame(self):
        """The pandas DataFrame of these columns (pandas imported here, on first use)."""
        import pandas as pd

        data = {name: [None] * self._len if name in self._none else self._column(name) for name in self.columns}
        for name in self._nullable_ints:  # NaN: a missing value (the module docstring)
            data[name] = pd.array(data[name], dtype="Int64")
        return pd.DataFrame(data, columns=self.columns, copy=False)


def float_column(values: list[float | None]) -> tuple[np.ndarray, bool]:
    """A float column's values (None where missing) as float64 with NaN for None, and whether
    every value is None (pandas types such a column as object: Columns' none_in_frame)."""
    return np.array(values, dtype=np.float64), bool(values) and all(v is None for v in values)


def notna(values: np.ndarray) -> np.ndarray:
    """Where values are present: not NaN (numbers), neither None nor NaN (objects)."""
    if values.dtype.kind == "f":
        return ~np.isnan(values)
    if values.dtype.kind != "O":
        return np.ones(values.shape, dtype=bool)
    return np.fromiter((v is not None and v == v for v in values), dtype=bool, count=len(values))
