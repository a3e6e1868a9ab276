"""Registry of trace formats by name (loaders register themselves with `register_format`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from traces.errors import InputError
from traces.workload import Workload

ENCODINGS = ("jsonl", "csv", "parquet")

Loader = Callable[..., Workload]  # loader(path: Path, **options) -> Workload


@dataclass(frozen=True, slots=True)
class FormatInfo:
    name: str
    loader: Loader
    # Sniffing: the format matches a file whose keys/columns include one of these sets.
    signatures: tuple[frozenset[str], ...]
    encodings: tuple[str, ...]  # subset of ENCODINGS the loader reads
    description: str


_FORMATS: dict[str, FormatInfo] = {}


def register_format(
    name: str,
    *,
    signatures: tuple[tuple[str, ...], ...],
    encodings: tuple[str, ...],
    description: str = "",
) -> Callable[[Loader], Loader]:
    """Decorator: register `loader(path, **options) -> Workload` under `name`."""
    bad = [e for e in encodings if e not in ENCODINGS]
    if bad:
        raise ValueError(f"format {name!r}: unknown encodings {bad}; valid: {ENCODINGS}")

    def wrap(loader: Loader) -> Loader:
        if name in _FORMATS and _FORMATS[name].loader is not loader:
            raise ValueError(f"trace format {name!r} is already registered")
        doc_lines = (loader.__doc__ or "").strip().splitlines()
        _FORMATS[name] = FormatInfo(
            name=name,
            loader=loader,
            signatures=tuple(frozenset(s) for s in signatures),
            encodings=tuple(encodings),
            description=description or (doc_lines[0] if doc_lines else ""),
        )
        return loader

    return wrap


def _ensure_builtin_loaders() -> None:
    # Imported lazily so that the loader modules can import this one without a cycle.
    import traces.canonical  # noqa: F401
    import traces.external  # noqa: F401


def available_formats() -> list[str]:
    """Names accepted by `load_workload(fmt=...)`, besides "auto"."""
    _ensure_builtin_loaders()
    return sorted(_FORMATS)


def get_format(name: str) -> FormatInfo:
    _ensure_builtin_loaders()
    try:
        return _FORMATS[name]
    except KeyError:
        raise InputError(
            f"unknown trace format {name!r}", field="fmt",
            allowed=", ".join(["auto", *sorted(_FORMATS)]),
        ) from None


def all_formats() -> list[FormatInfo]:
    _ensure_builtin_loaders()
    return [_FORMATS[n] for n in sorted(_FORMATS)]


def encoding_of(path: Path) -> str | None:
    """Encoding implied by the file name (".gz" is ignored); None when the extension is unknown."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
    ext = suffixes[-1] if suffixes else ""
    if ext in (".jsonl", ".ndjson", ".json"):
        return "jsonl"
    if ext in (".csv",):
        return "csv"
    if ext in (".parquet", ".pq"):
        return "parquet"
    return None
