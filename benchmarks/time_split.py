"""Where a case's wall time goes: start-up, the simulation split by SimPy process (each engine's
loop, the arrivals, and the plain-event callbacks no process runs: KV links, timers), and what
follows it (results, writing).

    python benchmarks/time_split.py --only pd-hour colocated-hour
    python benchmarks/time_split.py --only hour --requests 4000 --json split.json

A time split, not an instruction count (benchmarks/instructions.py): work bound by memory (cold
requests and blocks, a replica read by a router between its own steps) weighs here as it weighs
for the user. Each case is sim_speed.py's command run in a child Python that wraps SimPy's
Environment.run, Environment.step and Process._resume with a clock (~0.3 us a call on every event,
so the split is read as shares of the run, and cases compared are run alike). A process is named
by its generator (a compiled one by its type: `_engine_loop_Engine_gen`), numbered in start order:
the arrivals first, then each replica's engine loop in replica order. Each process's
resumes are counted in three bands: light (under 5 us: a wake that applies nothing, e.g. a paced
run's timeout), middling, and heavy (over 100 us: a stepped step, a run applied, a hand-off).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_speed import ROOT, Case, cases, child_env  # noqa: E402  (the benchmark's own cases and commands)

LIGHT_S = 5e-6
HEAVY_S = 100e-6


def _child(argv: list[str], out_json: str) -> None:
    """Run `servesim argv` here with SimPy's clock wrapped; write the split to out_json."""
    import atexit
    import time

    t0 = time.perf_counter()
    import simpy.core
    import simpy.events

    from servesim import cli

    clock = time.perf_counter
    procs: dict[int, dict] = {}  # id(process) -> its row
    phase = {"imports_s": clock() - t0, "first_run_s": None, "run_s": 0.0, "last_run_end_s": None, "step_s": 0.0}
    init, resume, step, run = (simpy.events.Process.__init__, simpy.events.Process._resume,
                               simpy.core.Environment.step, simpy.core.Environment.run)

    def wrapped_init(self, env, generator):
        init(self, env, generator)
        what = generator.__qualname__ if isinstance(generator, types.GeneratorType) else type(generator).__name__
        procs[id(self)] = {"name": f"{what} #{len(procs)}", "resumes": 0, "s": 0.0,
                           "light": 0, "light_s": 0.0, "heavy": 0, "heavy_s": 0.0}

    def wrapped_resume(self, event):
        t = clock()
        resume(self, event)
        d = clock() - t
        row = procs[id(self)]
        row["resumes"] += 1
        row["s"] += d
        if d < LIGHT_S:
            row["light"] += 1
            row["light_s"] += d
        elif d > HEAVY_S:
            row["heavy"] += 1
            row["heavy_s"] += d

    def wrapped_step(self):
        t = clock()
        step(self)
        phase["step_s"] += clock() - t

    def wrapped_run(self, until=None):
        t = clock()
        if phase["first_run_s"] is None:
            phase["first_run_s"] = t - t0
        try:
            return run(self, until)
        finally:
            phase["run_s"] += clock() - t
            phase["last_run_end_s"] = clock() - t0

    simpy.events.Process.__init__ = wrapped_init
    simpy.events.Process._resume = wrapped_resume
    simpy.core.Environment.step = wrapped_step
    simpy.core.Environment.run = wrapped_run

    def report() -> None:
        total = clock() - t0
        split = {"wall_s": total, **phase, "processes": list(procs.values()),
                 "outside_processes_s": phase["step_s"] - sum(p["s"] for p in procs.values())}
        Path(out_json).write_text(json.dumps(split))

    atexit.register(report)
    sys.argv = ["servesim", *argv]
    cli.main()


def split_case(case: Case, num_requests: int | None) -> dict:
    """The time split of one case (a child process; its results go to a temporary folder)."""
    with tempfile.TemporaryDirectory(prefix="servesim-split-") as tmp:
        argv = [case.command, *case.args, "--out", str(Path(tmp) / "out")]
        if num_requests is not None:
            argv += ["--max-requests", str(num_requests)]
        out_json = str(Path(tmp) / "split.json")
        proc = subprocess.run([sys.executable, __file__, "--child", out_json, "--", *argv], cwd=ROOT,
                              env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
            return {"case": case.name, "error": f"exit {proc.returncode}: {tail}"}
        return {"case": case.name, **json.loads(Path(out_json).read_text())}


def _print(split: dict) -> None:
    if "error" in split:
        print(f"{split['case']}: {split['error']}")
        return
    first = split["first_run_s"] or 0.0
    after = split["wall_s"] - (split["last_run_end_s"] or split["wall_s"])
    print(f"{split['case']}: {split['wall_s']:.2f} s = start-up {first:.2f} (imports {split['imports_s']:.2f}) "
          f"+ simulation {split['run_s']:.2f} + after it {after:.2f}")
    print(f"  {'process':32s} {'resumes':>9s} {'time s':>8s} {'light n':>9s} {'heavy n':>8s} {'heavy s':>8s}")
    for p in sorted(split["processes"], key=lambda p: -p["s"]):
        if p["resumes"]:
            print(f"  {p['name']:32s} {p['resumes']:9d} {p['s']:8.2f} {p['light']:9d} {p['heavy']:8d} {p['heavy_s']:8.2f}")
    print(f"  {'(events no process runs)':32s} {'':9s} {split['outside_processes_s']:8.2f}")


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        _child(sys.argv[4:], sys.argv[2])  # --child OUT_JSON -- servesim arguments
        return 0
    names = [c.name for c in cases()]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", choices=names, required=True, help="cases to split")
    ap.add_argument("--requests", type=int, help="only the trace's first N requests (--max-requests)")
    ap.add_argument("--json", help="also write the splits here")
    args = ap.parse_args()
    if args.requests is not None and args.requests < 1:
        ap.error(f"--requests: {args.requests} (allowed: a positive count)")
    chosen = [c for c in cases() if c.name in args.only]
    missing = [c.name for c in chosen if c.needs is not None and not c.needs.exists()]
    if missing:
        print(f"error: data missing for {', '.join(missing)} (../shared beside the checkout)", file=sys.stderr)
        return 2
    splits = []
    for case in chosen:
        split = split_case(case, args.requests)
        _print(split)
        splits.append(split)
    if args.json:
        Path(args.json).write_text(json.dumps(splits, indent=1))
    return 1 if any("error" in s for s in splits) else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")  # (the children inherit it: one set order everywhere)
    sys.exit(main())
