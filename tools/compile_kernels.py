"""Compile simulator/kernels.py with mypyc into build/mypyc_kernels/ (run by `make`; `--force` rebuilds).

The kernels are plain functions of floats and ints (a macro-step's per-step recurrences), which
mypyc turns into C loops over doubles: the same operations in the same order, so the same floats
(tests/test_kernels.py compares the two builds). The copy is compiled under a private module name
that is on no import path; simulator/kernel_impl.py loads it from its file while the MANIFEST's
source digest matches kernels.py, and runs kernels.py itself otherwise.

Exit status 0 when the build is up to date or was built; 1 when mypyc or the C compiler failed
(the Makefile then goes on with the pure-Python kernels and says so).
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import sys
import time
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from servesim import _native  # noqa: E402  (after the path insert: run as a script)
from servesim.simulator import kernel_impl  # noqa: E402

SOURCE = ROOT / "simulator" / "kernels.py"


def build(staging: Path) -> None:
    from mypyc.build import mypycify  # noqa: PLC0415 (only the build needs mypy)
    from setuptools import setup  # noqa: PLC0415

    shutil.copyfile(SOURCE, staging / f"{kernel_impl.MODULE}.py")
    cwd = os.getcwd()
    os.chdir(staging)
    try:
        ext = mypycify([f"{kernel_impl.MODULE}.py"], opt_level="3", target_dir="c")
        setup(name="servesim-simulator-kernels", ext_modules=ext,
              script_args=["-q", "build_ext", "--inplace", "--build-temp", "tmp"])
    finally:
        os.chdir(cwd)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--force", action="store_true", help="rebuild even when the build is up to date")
    args = ap.parse_args()
    live = ROOT / kernel_impl.BUILD_DIR
    live.parent.mkdir(parents=True, exist_ok=True)
    with open(live.parent / "mypyc_kernels.lock", "w") as lock:  # one build at a time
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build_if_stale(live, args.force)


def _build_if_stale(live: Path, force: bool) -> int:
    digest = kernel_impl.source_digest(SOURCE)
    path, _ = kernel_impl.find_build(ROOT, SOURCE)
    if not force and path is not None:
        print("compiled kernels: up to date")
        return 0
    started = time.monotonic()
    # Built beside the live folder and swapped in whole: the live build is never half-written.
    fresh = live.with_name(live.name + ".new")
    shutil.rmtree(fresh, ignore_errors=True)
    fresh.mkdir()
    try:
        build(fresh)
    except (Exception, SystemExit) as e:  # mypy errors surface as SystemExit from setup()
        print(f"compiled kernels: build failed ({type(e).__name__}: {e}); sources in {fresh}", file=sys.stderr)
        return 1
    if not (fresh / (kernel_impl.MODULE + EXTENSION_SUFFIXES[0])).is_file():
        print(f"compiled kernels: the build wrote no extension module in {fresh}", file=sys.stderr)
        return 1
    _native.publish_build(fresh, live, {"source": digest})  # kernel_impl reads the same MANIFEST format
    print(f"compiled kernels: built in {time.monotonic() - started:.0f} s ({live})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
