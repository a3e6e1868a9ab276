"""Load any supported trace by format name, or let "auto" sniff it.

    load_workload("conversation_trace.jsonl.gz")                 # sniffed: mooncake
    load_workload("sharegpt.csv.gz", fmt="lengths", rate_per_s=4)
    available_formats()  # ['azure', 'bailian', 'burstgpt', 'canonical', 'lengths', ..., 'sessions', 'sharegpt']

Sniffing looks at the encoding (from the extension, else the first byte) and the keys of the
first JSON line / the CSV header / the Parquet schema, and picks the format whose signature
columns are all present. When nothing or several formats match it says what it tried.
"""

from __future__ import annotations

import csv
import gzip
import inspect
import json
import zlib
from pathlib import Path
from typing import Any

from servesim.traces.errors import InputError, field_error
from servesim.traces.registry import FORMATS, FormatInfo, available_formats, encoding_of, get_format, register_format
from servesim.traces.rows import is_gzip, open_text
from servesim.traces.streams import is_stream, os_error, spooled
from servesim.traces.workload import Workload

__all__ = ["available_formats", "load_workload", "register_format", "sniff_format"]


def _first_keys(path: Path, encoding: str) -> list[str]:
    """Keys of the first JSON object / CSV header / Parquet schema ([] when unreadable)."""
    if encoding == "parquet":
        import pyarrow.parquet as pq

        try:
            return list(pq.read_schema(path).names)
        except Exception:  # not a Parquet file after all
            return []
    try:
        with open_text(path) as fh:
            if encoding == "csv":
                return next(csv.reader(fh), [])
            for text in fh:
                if text.strip():
                    if text.lstrip("\ufeff \t").startswith("["):  # a JSON array (raw ShareGPT)
                        return _first_element_keys(text + fh.read(_ARRAY_HEAD_CHARS))
                    obj = json.loads(text)
                    return list(obj) if isinstance(obj, dict) else []
    except (json.JSONDecodeError, UnicodeDecodeError, csv.Error, OSError, EOFError):
        return []
    return []


_ARRAY_HEAD_CHARS = 1 << 20  # a JSON array's first element is looked for in its first ~1 M characters


def _first_element_keys(head: str) -> list[str]:
    """Keys of the first object in a JSON array's opening text ([] when it is not one)."""
    start = head.find("[") + 1
    while start < len(head) and head[start] in " \t\r\n":
        start += 1
    try:
        obj, _end = json.JSONDecoder().raw_decode(head, start)
    except json.JSONDecodeError:
        return []
    return list(obj) if isinstance(obj, dict) else []


def _guess_encoding(path: Path) -> str:
    encoding = encoding_of(path)
    if encoding is not None:
        return encoding
    with open(path, "rb") as fh:
        if fh.read(4) == b"PAR1":
            return "parquet"
    try:
        with open_text(path) as fh:
            first = fh.read(1)
    except (UnicodeDecodeError, OSError, EOFError):
        return "csv"
    return "jsonl" if first in ("{", "[") else "csv"


def sniff_format(path: str | Path) -> str:
    """Name of the registered format that `path` looks like; InputError saying what was tried."""
    file = Path(path)
    if not file.is_file():
        raise InputError("file not found", path=str(file))
    encoding = _guess_encoding(file)
    keys = set(_first_keys(file, encoding))

    def specificity(_name: str, info: FormatInfo) -> int:
        # The largest signature the file has: a format naming more of its columns is more specific.
        if encoding not in info.encodings:
            return 0
        return max((len(sig) for sig in info.signatures if sig <= keys), default=0)

    def why_not(_name: str, info: FormatInfo) -> str:
        if encoding not in info.encodings:
            return f"{info.name} (reads {'/'.join(info.encodings)})"
        return f"{info.name} (needs {' or '.join('{' + ', '.join(sorted(s)) + '}' for s in info.signatures)})"

    found = ", ".join(sorted(keys)) if keys else "no readable keys/header"
    return FORMATS.detect(specificity, subject=f"a {encoding} file with {found}",
                          explicit="--format NAME (fmt= in Python)", tried=why_not, error=field_error("fmt", file))


def load_workload(path: str | Path, fmt: str = "auto", **options: Any) -> Workload:
    """Load a trace file as a Workload. `options` go to the format's loader (see its docstring).
    A stream (/dev/stdin, a FIFO, a process substitution) is read once, bounded (traces/streams.py)."""
    file = Path(path)
    if not is_stream(file):
        return _load_named(file, fmt, options, file)
    with spooled(file) as copy:
        wl = _load_named(copy, fmt, options, file)
    wl.source = f"{file} (a stream, read once)"
    return wl


def _load_named(file: Path, fmt: str, options: dict[str, Any], shown: Path) -> Workload:
    """_load, every error naming `shown` (the path the user gave) instead of a stream's copy."""
    try:
        return _load(file, fmt, options)
    except InputError as exc:
        if exc.path is not None and exc.path != str(file):
            raise
        # Errors raised without a file (options, request invariants) still name the file.
        raise InputError(exc.detail, path=str(shown), line=exc.line, field=exc.field,
                         allowed=exc.allowed) from None
    except OSError as exc:  # permission denied, a read error: named, never a traceback
        raise os_error(exc, shown, "read the trace") from None


def _load(file: Path, fmt: str, options: dict[str, Any]) -> Workload:
    if file.is_dir():
        raise InputError("this is a folder, not a trace file", path=str(file), allowed="a trace file")
    if not file.is_file():
        raise InputError("file not found", path=str(file))
    check_readable(file)
    name = sniff_format(file) if fmt == "auto" else fmt
    info = get_format(name)
    if fmt != "auto":
        _check_encoding(file, info)
    params = inspect.signature(info.loader).parameters
    accepted = [p for p in params if params[p].kind == inspect.Parameter.KEYWORD_ONLY]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise InputError(
            f"unknown option(s) {', '.join(unknown)} for format {name!r}", path=str(file),
            field=unknown[0], allowed=", ".join(accepted) or "no options",
        )
    try:
        return info.loader(file, **options)
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:  # damage past the first block
        raise InputError(f"corrupt or truncated gzip file ({exc})", path=str(file),
                         allowed="a complete .gz file (re-download or re-compress it)") from None


def check_readable(file: Path) -> None:
    """Empty files and damaged gzip/Parquet starts are named as such (not as a format problem)."""
    if file.stat().st_size == 0:
        raise InputError("the file is empty", path=str(file), allowed="a trace with at least one request")
    if is_gzip(file):
        try:
            with gzip.open(file, "rb") as fh:
                head = fh.read(1 << 16)
        except (EOFError, gzip.BadGzipFile, zlib.error, OSError) as exc:
            raise InputError(f"corrupt or truncated gzip file ({exc})", path=str(file),
                             allowed="a complete .gz file (re-download or re-compress it)") from None
        if not head.strip():
            raise InputError("the file is empty (after decompression)", path=str(file),
                             allowed="a trace with at least one request")


def _check_encoding(file: Path, info) -> None:
    """--format NAME on a file of another encoding: say so (not a parser's error about its content)."""
    encoding = _guess_encoding(file)
    if encoding in info.encodings:
        return
    try:
        looks = f"; it looks like format {sniff_format(file)!r}"
    except InputError:
        looks = ""
    raise InputError(f"format {info.name!r} reads {'/'.join(info.encodings)} files, but this is a {encoding} "
                     f"file{looks}", path=str(file), field="fmt",
                     allowed="auto, or a format that reads " + encoding)
