"""Reading and validating trace rows: every problem becomes an InputError naming file, line, field.

Line numbers are 1-based physical lines of the file (for CSV the header is line 1, so data row i,
0-based, is line i + 2); for Parquet they are 1-based row numbers.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np

from servesim.traces.errors import InputError

_GZIP_MAGIC = b"\x1f\x8b"


def is_gzip(path: Path) -> bool:
    """True when the file starts with the gzip magic bytes (whatever its extension says)."""
    with open(path, "rb") as fh:
        return fh.read(2) == _GZIP_MAGIC


def open_text(path: Path) -> IO[str]:
    """Open a text file, transparently gunzipping it; missing files raise InputError."""
    if not path.is_file():
        raise InputError("file not found", path=str(path))
    if is_gzip(path):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


def iter_json_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (1-based line, object) for each non-blank line of a JSON-lines file."""
    with open_text(path) as fh:
        for line_no, text in enumerate(fh, start=1):
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise InputError(
                    f"not valid JSON ({exc.msg} at column {exc.colno})",
                    path=str(path), line=line_no, allowed="one JSON object per line",
                ) from None
            if not isinstance(obj, dict):
                raise InputError(
                    f"expected a JSON object, got {type(obj).__name__}",
                    path=str(path), line=line_no, allowed="one JSON object per line",
                )
            yield line_no, obj


def require_keys(obj: dict[str, Any], keys: tuple[str, ...], path: Path, line: int) -> None:
    """Raise naming the first missing key."""
    for key in keys:
        if key not in obj:
            raise InputError(
                f"missing field '{key}' (present: {', '.join(sorted(obj)) or 'none'})",
                path=str(path), line=line, field=key, allowed=f"rows with {', '.join(keys)}",
            )


def as_int(value: Any, *, path: Path, line: int, field: str, min_value: int | None) -> int:
    """Validate an integer (integral floats like 12.0 are accepted; bools and strings are not)."""
    ok = isinstance(value, int) and not isinstance(value, bool)
    if not ok and isinstance(value, float) and value.is_integer():
        value, ok = int(value), True
    allowed = "an integer" if min_value is None else f"an integer >= {min_value}"
    if not ok:
        raise InputError(f"non-integer value {value!r}", path=str(path), line=line,
                         field=field, allowed=allowed)
    if min_value is not None and value < min_value:
        raise InputError(f"value {value} is too small", path=str(path), line=line,
                         field=field, allowed=allowed)
    return int(value)


def as_float(value: Any, *, path: Path, line: int, field: str, min_value: float = 0.0) -> float:
    """Validate a finite number >= min_value."""
    allowed = f"a finite number >= {min_value:g}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"non-numeric value {value!r}", path=str(path), line=line,
                         field=field, allowed=allowed)
    number = float(value)
    if not math.isfinite(number) or number < min_value:
        raise InputError(f"value {value!r} is out of range", path=str(path), line=line,
                         field=field, allowed=allowed)
    return number


def as_int_tuple(value: Any, *, path: Path, line: int, field: str, upper: int | None = None
                 ) -> tuple[int, ...]:
    """Validate a list of non-negative integers (below `upper` when given)."""
    allowed = "a list of integers >= 0" + (f" and < {upper}" if upper is not None else "")
    if not isinstance(value, (list, tuple)):
        raise InputError(f"expected a list, got {value!r:.60}", path=str(path), line=line,
                         field=field, allowed=allowed)
    # The common case checked in C (a type set, min, max): a per-element Python loop over every prompt's
    # token ids was half the bundled trace's load time. Only a bad list is walked, to name its element.
    if value and not (set(map(type, value)) == {int} and min(value) >= 0
                      and (upper is None or max(value) < upper)):
        for item in value:
            if type(item) is not int or item < 0 or (upper is not None and item >= upper):
                raise InputError(f"bad element {item!r}", path=str(path), line=line,
                                 field=field, allowed=allowed)
    return tuple(value)


def check_sorted(times: list[float], lines: list[int], path: Path, field: str, note: str) -> None:
    """Raise at the first row whose time is smaller than the previous row's."""
    for i in range(1, len(times)):
        if times[i] < times[i - 1]:
            raise InputError(
                f"timestamp {times[i]:g} is smaller than the previous row's "
                f"{times[i - 1]:g}; {note}",
                path=str(path), line=lines[i], field=field, allowed="non-decreasing timestamps",
            )


def require_rows(count: int, path: Path) -> None:
    if count == 0:
        raise InputError("file has no requests (empty)", path=str(path),
                         allowed="at least one data row")


# --- CSV formats -------------------------------------------------------------------------------
# Read with the csv module, every cell a string, as pandas' read_csv(dtype=str, keep_default_na=False)
# reads them (blank lines skipped, a short row's missing cells empty): a replay never imports
# pandas (~0.2 s of every process).


class CsvTable:
    """A CSV file's cells as strings: `columns` (the header), `t[name]` (a column's cells), len()."""

    __slots__ = ("columns", "_cells")

    def __init__(self, columns: list[str], cells: dict[str, list[str]]) -> None:
        self.columns = columns
        self._cells = cells

    def __len__(self) -> int:
        return len(self._cells[self.columns[0]]) if self.columns else 0

    def __getitem__(self, name: str) -> list[str]:
        return self._cells[name]

    def head(self, n: int) -> CsvTable:
        """The first n rows."""
        return CsvTable(self.columns, {name: cells[:n] for name, cells in self._cells.items()})


def read_csv(path: Path, required: tuple[str, ...]) -> CsvTable:
    """Read a CSV (optionally gzipped) as strings and check the header has `required` columns."""
    try:
        with open_text(path) as fh:
            rows = [row for row in csv.reader(fh) if row]
    except UnicodeDecodeError as exc:
        raise InputError(f"cannot parse CSV: {exc}", path=str(path)) from None
    except csv.Error as exc:
        raise InputError(f"cannot parse CSV: {exc}", path=str(path)) from None
    if not rows:
        raise InputError("file is empty", path=str(path), allowed="a CSV header and rows")
    header = _unique_names([rows[0][0].removeprefix("\ufeff"), *rows[0][1:]])  # a byte-order mark
    width = len(header)
    for i, row in enumerate(rows[1:]):
        if len(row) > width:
            raise InputError(f"cannot parse CSV: expected {width} fields, saw {len(row)}", path=str(path),
                             line=i + 2, allowed=f"rows of the header's {width} fields")
    cells = {name: [row[j] if j < len(row) else "" for row in rows[1:]] for j, name in enumerate(header)}
    table = CsvTable(header, cells)
    missing = [c for c in required if c not in table.columns]
    if missing:
        raise InputError(
            f"missing column(s) {', '.join(missing)}; "
            f"header has {_clip(', '.join(table.columns))}",
            path=str(path), line=1, field=missing[0], allowed=f"columns {', '.join(required)}",
        )
    require_rows(len(table), path)
    return table


def _unique_names(header: list[str]) -> list[str]:
    """Header names, a repeated one suffixed .1, .2, ... (as pandas names them)."""
    seen: dict[str, int] = {}
    names = []
    for name in header:
        count = seen.get(name, 0)
        names.append(name if not count else f"{name}.{count}")
        seen[name] = count + 1
    return names


def _numbers(cells: list[str]) -> np.ndarray:
    """Cells as float64, NaN where a cell is not a number pandas' to_numeric reads (it refuses the
    digit separators and non-ASCII digits Python's float() also takes)."""
    try:
        values = np.array(cells, dtype=np.float64)
    except ValueError:
        values = np.array([_number(c) for c in cells], dtype=np.float64)
    if "_" in "".join(cells) or not "".join(cells).isascii():
        odd = [i for i, c in enumerate(cells) if "_" in c or not c.isascii()]
        values[odd] = np.nan
    return values


def _number(cell: str) -> float:
    try:
        return float(cell)
    except ValueError:
        return math.nan


def int_column(table: CsvTable, column: str, path: Path, min_value: int) -> np.ndarray:
    """Column as int64, raising at the first non-integer or too-small cell (CSV line numbers)."""
    raw = table[column]
    numbers = _numbers(raw)
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(numbers) | (numbers != np.floor(numbers)) | (numbers < min_value)
    if bad.any():
        row = int(np.argmax(bad))
        raise InputError(
            f"bad value {raw[row]!r}", path=str(path), line=row + 2, field=column,
            allowed=f"an integer >= {min_value}",
        )
    return numbers.astype(np.int64)


def float_column(table: CsvTable, column: str, path: Path, min_value: float) -> np.ndarray:
    """Column as float64, raising at the first non-numeric or too-small cell."""
    raw = table[column]
    numbers = _numbers(raw)
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(numbers) | (numbers < min_value)
    if bad.any():
        row = int(np.argmax(bad))
        raise InputError(
            f"bad value {raw[row]!r}", path=str(path), line=row + 2, field=column,
            allowed=f"a finite number >= {min_value:g}",
        )
    return numbers


def datetime_ns_column(table: CsvTable, column: str) -> np.ndarray:
    """Column of ISO 8601 date-times as int64 nanoseconds, NaT (the int64 minimum) where a cell is
    not one. Time-zone-free cells are parsed by numpy; anything else by pandas' ISO 8601 parser
    (imported only then), whose result this is."""
    import warnings

    raw = table[column]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # numpy only warns about a time zone: pandas reads those
            return np.array(raw, dtype="datetime64[ns]").astype(np.int64)
    except (ValueError, Warning, OverflowError):
        import pandas as pd

        stamps = pd.to_datetime(pd.Series(raw, dtype=str), format="ISO8601", errors="coerce")
        return stamps.to_numpy(dtype="datetime64[ns]").astype(np.int64)


def check_sorted_column(values: np.ndarray, path: Path, field: str, note: str) -> None:
    """Vectorised check_sorted for CSV columns (line = row + 2)."""
    drops = np.flatnonzero(np.diff(values) < 0)
    if drops.size:
        row = int(drops[0]) + 1
        raise InputError(
            f"timestamp at this row is earlier than the previous row's; {note}",
            path=str(path), line=row + 2, field=field, allowed="non-decreasing timestamps",
        )


def _clip(text: str, limit: int = 200) -> str:
    """A header quoted in a message: long ones (a JSON line read as CSV) cut, not pasted whole."""
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"
