"""Recording goldens with a project oracle driver (tools/offload_oracle.py, kv_groups_oracle.py,
blocked_oracle.py, encoder_oracle.py): the loop they share. Each golden folder gets workload.jsonl,
trace.jsonl.gz (gzip with mtime 0: byte-stable) and config.json, whose `trace_flags` are
StepTraceConfig's arguments for the replay (tests/test_sched_golden.py) and `workload_flags` the
rest of how the golden was made."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import sys
from collections.abc import Callable


def record_goldens(out_dir: str, oracle_dir: str, goldens: dict[str, dict], *, is_own: Callable[[str], bool],
                   parse_args: Callable, run: Callable, oracle: str, only=(),
                   is_trace_flag: Callable[[str], bool] | None = None) -> int:
    """Run `run(*parse_args(argv))` for each golden (its own flags before `--`, drive.py's after).
    is_own: the driver's own flags; is_trace_flag: which of them the replay takes (default all)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from golden_configs import TRACE_FLAGS
    from record_golden import argv_for

    for name, flags in goldens.items():
        if only and name not in only:
            continue
        d = os.path.join(out_dir, name)
        os.makedirs(d, exist_ok=True)
        trace = os.path.join(d, "trace.jsonl")
        own = {k: v for k, v in flags.items() if is_own(k)}
        drive_flags = {k: v for k, v in flags.items() if not is_own(k)}
        argv = ["--oracle-dir", oracle_dir, *argv_for(own), "--", *argv_for(drive_flags), "--out", trace,
                "--workload-out", os.path.join(d, "workload.jsonl")]
        run(*parse_args(argv))
        with open(trace, "rb") as fi, gzip.GzipFile(trace + ".gz", "wb", mtime=0) as fo:
            shutil.copyfileobj(fi, fo)
        os.remove(trace)
        traced = {k: v for k, v in own.items() if is_trace_flag is None or is_trace_flag(k)}
        trace_flags = {**traced, **{k: v for k, v in drive_flags.items() if k in TRACE_FLAGS}}
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump({"oracle": oracle, "trace_flags": dict(sorted(trace_flags.items())),
                       "workload_flags": dict(sorted((k, v) for k, v in flags.items() if k not in traced))},
                      f, indent=1)
    return 0


def run_patched_drive(drive, drive_argv: list[str], patches: dict[str, Callable], out_path: str,
                      records: Callable[[], list[dict]]) -> int:
    """drive.main with some of its functions replaced (the driver's scheduler wrapper, workload and
    request builders), restored afterwards; then each trace line extended by the driver's own
    record of that step (records(): one per line, in order)."""
    real = {name: getattr(drive, name) for name in patches}
    for name, fn in patches.items():
        setattr(drive, name, fn)
    try:
        rc = drive.main(drive_argv)
    finally:
        for name, fn in real.items():
            setattr(drive, name, fn)
    with open(out_path) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    extra = records()
    assert len(lines) == len(extra), (len(lines), len(extra))
    with open(out_path, "w") as f:
        for line, rec in zip(lines, extra):
            line.update(rec)
            f.write(json.dumps(line) + "\n")
    return rc
