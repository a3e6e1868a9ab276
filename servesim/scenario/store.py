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
moment leaves only complete variants (and staging debris that the next run removes). One run at a
time holds OUT (simulator.outdir.locked); publishing is still safe when two processes publish the
same variant (the first complete folder wins, the other's copy is dropped).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from pathlib import Path

from servesim.simulator.outdir import share_like_umask

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


def _staging(root: Path, prefix: str) -> Path:
    (root / STAGING).mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=root / STAGING))
    share_like_umask(tmp)
    return tmp


SCRATCH = "servesim-variant-"  # per-variant scratch folders in the system temp dir: SCRATCH<pid>-XXXX


def scratch_prefix() -> str:
    return f"{SCRATCH}{os.getpid()}-"


def clean_dead_scratch() -> None:
    """Remove scratch folders of worker processes that no longer exist (killed mid-variant)."""
    for p in Path(tempfile.gettempdir()).glob(f"{SCRATCH}*-*"):
        pid = p.name[len(SCRATCH):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(p, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def publish(root: str | Path, name: str, files: dict[str, bytes]) -> Path:
    """Write `files` as variants/<name>/ atomically (summary.json last, then one rename).

    A complete folder already there (another process published it first) is kept and ours dropped;
    an incomplete one (an earlier failed attempt) is replaced. A rename that loses a race with
    another publisher is retried against what that publisher left."""
    root = Path(root)
    (root / VARIANTS).mkdir(parents=True, exist_ok=True)
    final = variant_dir(root, name)
    tmp = _staging(root, f"{name[-24:]}.")
    try:
        for fname in sorted(files, key=lambda f: f == SUMMARY):
            data = files[fname]
            (tmp / fname).write_bytes(data if isinstance(data, bytes) else data.encode())
        for _ in range(100):
            if is_complete(final):
                break  # already published complete (by another process): a result is never replaced
            if final.exists():  # an earlier failed attempt (no summary.json): move it aside
                old = _staging(root, "old.")
                with contextlib.suppress(FileNotFoundError):
                    os.replace(final, old / "x")
                shutil.rmtree(old, ignore_errors=True)
            try:
                os.replace(tmp, final)
                return final
            except OSError as e:  # another publisher renamed its folder in first
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
        return final
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def read_files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in Path(folder).iterdir() if p.is_file()}


def write_atomic(path: Path, data: bytes | str) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_bytes(data if isinstance(data, bytes) else data.encode())
    os.replace(tmp, path)


def load_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())
