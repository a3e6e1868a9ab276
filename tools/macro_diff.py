"""Differential harness from the command line: macro-stepped vs plain, byte for byte.

    PYTHONPATH=. python tools/macro_diff.py [--only SUBSTRING] [--list] [--keep DIR]

Runs servesim.differential.cases() (every shipped scenario, cluster config, trace sample and golden
workload) with macro-steps on and off and prints one line per case; exit status 1 if any differs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from servesim.differential import cases, compare  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", default=[], help="run the cases whose name contains this (repeatable)")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument("--keep", type=Path, help="keep the outputs under this folder")
    args = ap.parse_args()
    todo = [c for c in cases() if not args.only or any(s in c.name for s in args.only)]
    if args.list:
        print("\n".join(c.name for c in todo))
        return 0
    failed = 0
    for case in todo:
        t0 = time.perf_counter()
        if args.keep is not None:
            work = args.keep / case.name.replace(":", "_").replace("/", "_")
            work.mkdir(parents=True, exist_ok=True)
            out = compare(case, work)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                out = compare(case, Path(tmp))
        status = "same" if out.ok else "DIFFERS"
        failed += not out.ok
        detail = f"  differ: {', '.join(out.mismatches)}" if out.mismatches else ""
        if not out.files:
            detail = "  (no result files written)"
        print(f"{status:8s} {case.name:55s} {len(out.files):3d} files  {time.perf_counter() - t0:6.1f} s{detail}",
              flush=True)
    print(f"{len(todo) - failed}/{len(todo)} cases identical")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
