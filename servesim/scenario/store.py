"""The result folder of a sweep, and how a variant's files get there without ever looking complete
before they are.

    OUT/
      scenario.yaml        the scenario as resolved (after extends and --set), with its sweep
      sweep.json           axes and variant folders, in sweep order
      sweep.parquet        one row per variant: swept parameters + flattened summary metrics
      variants/<name>/     one variant: requests.parquet, steps.parquet, timeseries.csv, config.yaml,
                           variant.yaml, request_meta.parquet, breakdown.json, summary.json (last)
                           or, when it failed: error.txt and variant.yaml (no summary.json)

A variant folder is published by renaming a fully written staging folder, so a sweep killed at any
moment leaves only complete variants (and staging debris that the next run removes).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

VARIANTS = "variants"
STAGING = ".staging"
SUMMARY = "summary.json"  # present = the variant completed; always written last


def variant_dir(root: Path, name: str) -> Path:
    return Path(root) / VARIANTS / name


def is_complete(folder: Path) -> bool:
    return (Path(folder) / SUMMARY).is_file()


def clean_staging(root: Path) -> None:
    """Remove what a killed run left half-written (never a published variant)."""
    shutil.rmtree(Path(root) / STAGING, ignore_errors=True)


def publish(root: str | Path, name: str, files: dict[str, bytes]) -> Path:
    """Write `files` as variants/<name>/ atomically (summary.json last, then one rename)."""
    root = Path(root)
    (root / STAGING).mkdir(parents=True, exist_ok=True)
    (root / VARIANTS).mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{name[-24:]}.", dir=root / STAGING))
    try:
        for fname in sorted(files, key=lambda f: f == SUMMARY):
            data = files[fname]
            (tmp / fname).write_bytes(data if isinstance(data, bytes) else data.encode())
        final = variant_dir(root, name)
        if final.exists():  # an earlier failed attempt (no summary.json): replace it
            old = Path(tempfile.mkdtemp(prefix="old.", dir=root / STAGING))
            os.replace(final, old / "x")
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        return final
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def read_files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in Path(folder).iterdir() if p.is_file()}


def write_atomic(path: Path, data: bytes | str) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_bytes(data if isinstance(data, bytes) else data.encode())
    os.replace(tmp, path)


def load_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())
