"""Registry of trace formats by name (loaders register themselves with `register_format`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from servesim.scheduler.registry import Registry
from servesim.traces.errors import field_error
from servesim.traces.workload import Workload

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


# Built-ins: every module of traces/ is imported on the first lookup (canonical.py and external.py
# register the shipped formats), so a new format is one new file in traces/.
FORMATS: Registry[FormatInfo] = Registry("trace format", plugins="servesim.traces", error=field_error("fmt"))


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
        old = FORMATS.find(name)
        if old is not None and old.loader is loader:
            return loader  # a module re-imported: the same loader again
        doc_lines = (loader.__doc__ or "").strip().splitlines()
        FORMATS.add(name, FormatInfo(
            name=name,
            loader=loader,
            signatures=tuple(frozenset(s) for s in signatures),
            encodings=tuple(encodings),
            description=description or (doc_lines[0] if doc_lines else ""),
        ))
        return loader

    return wrap


def available_formats() -> list[str]:
    """Names accepted by `load_workload(fmt=...)`, besides "auto"."""
    return FORMATS.names()


def get_format(name: str) -> FormatInfo:
    return FORMATS.get(name, extra=("auto",))


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
