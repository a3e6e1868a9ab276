"""Importers: turn each public profile format into the tidy table of ``profile_schema``.

``import_profile(source, path)`` dispatches by name; ``source="auto"`` recognises the format from
the file name and header. Each importer reads the real upstream files as they are laid out under
``/work/shared/data/gpu_profiles`` (see docs/PROFILE_SCHEMA.md for the mapping of every column).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING


from servesim.scheduler.registry import Registry
from servesim.traces.errors import InputError, field_error

from ...specs import find_gpu, resolve_model
from ..profile_schema import read_profile, validate_profile

if TYPE_CHECKING:
    import pandas as pd

Importer = Callable[[Path], "pd.DataFrame"]
Detector = Callable[[Path], bool]
# Built-ins: the own format below, then every module of this folder (imported on the first lookup),
# so a new importer is one new file here.
IMPORTERS: Registry[tuple[Importer, Detector]] = Registry(
    "profile source", plugins="servesim.simulator.cost_model.importers", error=field_error("source"),
    normalize=lambda s: s.strip().lower())


def register_importer(name: str, detect: Detector) -> Callable[[Importer], Importer]:
    def wrap(fn: Importer) -> Importer:
        IMPORTERS.add(name, (fn, detect))
        return fn

    return wrap


def available_importers() -> list[str]:
    return IMPORTERS.names()


def detect_source(path: str | Path) -> str:
    """The one importer whose detector recognises `path` (several or none: an InputError)."""
    path = Path(path)

    def matches(_name: str, entry: tuple[Importer, Detector]) -> bool:
        try:
            return bool(entry[1](path))
        except (OSError, ValueError):  # unreadable for this importer: not its format
            return False

    return IMPORTERS.detect(matches, subject=path.name, explicit="--source NAME", error=field_error("source", path))


def import_profile(source: str, path: str | Path) -> pd.DataFrame:
    """Read ``path`` with the importer named ``source`` ("auto" detects it); schema-validated."""
    path = Path(path)
    if not path.exists():
        raise InputError("profile path does not exist", path=str(path))
    name = detect_source(path) if source == "auto" else source
    return validate_profile(IMPORTERS.get(name, extra=("auto",))[0](path), str(path))


def header(path: Path) -> list[str]:
    """Column names of a CSV (gzip or not) without reading the body."""
    import pandas as pd
    return list(pd.read_csv(path, nrows=0).columns)


def read_table(path: Path, required: tuple[str, ...]) -> pd.DataFrame:
    """Read a CSV and insist on the columns an importer relies on."""
    import pandas as pd
    try:
        df = pd.read_csv(path)
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read: {exc}", path=str(path)) from None
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise InputError(f"missing columns {missing}; is this the right source?", path=str(path),
                         allowed=", ".join(required))
    return df


def gpu_label(name: str) -> str:
    """Canonical GPU id when we know the device, else the raw label lowercased (kept, not guessed)."""
    spec = find_gpu(name)
    return spec.name if spec else name.strip().lower()


def model_label(name: str) -> str:
    try:
        return resolve_model(name).name
    except InputError:
        return name.strip().lower()


def is_csv(path: Path) -> bool:
    return path.is_file() and path.name.lower().endswith((".csv", ".csv.gz"))


@register_importer("servesim", lambda p: is_csv(p) and {"op", "latency_s"} <= set(header(p))
                   or p.name.endswith((".parquet", ".jsonl", ".jsonl.gz")))
def _import_own(path: Path) -> pd.DataFrame:
    return read_profile(path)


__all__ = ["available_importers", "detect_source", "import_profile", "register_importer"]
