"""Instructions a case's requests cost (valgrind's callgrind): a count that does not drift with the machine.

    python benchmarks/instructions.py --only hour pd-hour                 # this checkout
    python benchmarks/instructions.py --only pd-hour --vs ../before       # A/B against another checkout
    python benchmarks/instructions.py --only hour --requests 1000 --json out.json

Wall time on a shared 2-core machine drifts by more than most changes gain (docs/SPEED_CHECKS.md);
an instruction count hardly does (the children run with one hash seed; two runs of one
checkout differ by ~0.05 %). So small changes to a hot path are measured here and confirmed with
`sim_speed.py` pairs. A count is not a time: work bound by memory (allocations, cache misses on
a large pool) weighs more in time than in instructions, and a trace's first N requests are not
its busiest part, so a count says which side does less work on the slice, not by how much the
whole run speeds up.

Each case is sim_speed.py's command (same arguments) on the trace's first `--requests` requests, run
under `valgrind --tool=callgrind` twice: with those requests and with one. The difference is what
the requests cost (simulation, result tables and files), start-up and imports cancelled out; both
counts are printed. With `--vs`, the other checkout (its own compiled build, or its pure-Python
sources, whatever it loads) runs the same commands, the two are compared case by case, and each
side's requests.parquet, steps.parquet and timeseries.csv are compared byte for byte (a speed
change must not change a result). The build column says what each side ran: a source edited after
`make compile` makes servesim fall back to its pure-Python modules ("pure"), whose count means
nothing for the compiled build. A checkout without bytecode compiles its modules in every run:
run `make compile` (or tools/precompile.py) in each first, as the script warns.

Where both cases of one of sim_speed.py's paired goals were counted (PAIRS: P/D against colocated
replicas on the same traffic, ...), the ratio of their requests' instructions per simulated second
follows, for each checkout: the goal's measure without the machine's drift (memory-bound work
weighs less in it than in time, above).

Under callgrind a case runs ~50x slower: 3,000 requests of the Azure hour take ~1.5 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_speed import ROOT, Case, cases, pair_lines  # noqa: E402  (the benchmark's own cases and commands)

COMPARED_FILES = ("requests.parquet", "steps.parquet", "timeseries.csv")
_COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")


def _count(root: Path, case: Case, num_requests: int, out: Path) -> tuple[int, str]:
    """Instructions of one run of the case in checkout `root` (its results go to `out`), and the
    build it ran: "compiled", or "pure" (servesim warned that it fell back to the pure-Python
    modules, e.g. a source edited since the build: not the code meant to be measured)."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit("error: valgrind not found (install it: apt-get install valgrind)")
    with tempfile.TemporaryDirectory(prefix="servesim-instr-") as tmp:
        cmd = [valgrind, "--tool=callgrind", f"--callgrind-out-file={tmp}/callgrind.out",
               sys.executable, "-m", "servesim", case.command, *case.args,
               "--max-requests", str(num_requests), "--out", str(out), "--overwrite"]
        # One hash seed for every run: a set of strings is walked in its hash order, so a random
        # seed moves the count by ~0.2 % from run to run (results never depend on it).
        env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   PYTHONHASHSEED="0")
        res = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    found = _COLLECTED.search(res.stderr)
    if res.returncode != 0 or found is None:
        tail = " | ".join(res.stderr.strip().splitlines()[-3:])
        raise SystemExit(f"error: {case.name} in {root} failed (exit {res.returncode}): {tail}")
    return int(found.group(1)), "pure" if "using the pure-Python modules" in res.stderr else "compiled"


def _bytecode_missing(root: Path) -> bool:
    """Whether the checkout's configuration module (always interpreted) has no bytecode: then every
    run compiles the sources of the modules it imports (tools/precompile.py writes them)."""
    return not any((root / "simulator" / "__pycache__").glob("config.*.pyc"))


def _same_results(a: Path, b: Path) -> list[str]:
    """The compared result files that differ between two runs' folders."""
    return [name for name in COMPARED_FILES
            if (a / name).exists() != (b / name).exists()
            or ((a / name).exists() and (a / name).read_bytes() != (b / name).read_bytes())]


def measure(root: Path, case: Case, num_requests: int, tmp: Path, tag: str) -> dict:
    base, build_base = _count(root, case, 1, tmp / f"{tag}-{case.name}-1")
    out = tmp / f"{tag}-{case.name}"
    full, build = _count(root, case, num_requests, out)
    if build != build_base:  # the build changed between the two runs: the difference means nothing
        build = "mixed"
    sim_s = json.loads((out / "summary.json").read_text())["sim_duration_s"]
    return {"checkout": str(root), "build": build, "instructions": full, "startup_instructions": base,
            "request_instructions": full - base, "sim_s": sim_s, "out": str(out)}


def main() -> int:
    names = [c.name for c in cases() if c.name != "vidur"]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", choices=names, required=True, help="cases to count")
    ap.add_argument("--requests", type=int, default=3000, help="the trace's first N requests (default 3000)")
    ap.add_argument("--vs", type=Path, help="another checkout to compare with (A: this one, B: that one)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    if args.requests < 2:
        ap.error(f"--requests: got {args.requests} (allowed: an integer >= 2)")
    roots = [ROOT] + ([args.vs.resolve()] if args.vs else [])
    for root in roots:
        if not (root / "servesim").is_dir():
            ap.error(f"--vs: {root} is not a servesim checkout (no servesim/ folder)")
        if _bytecode_missing(root):
            print(f"warning: {root} has no bytecode for its modules: each run compiles them (make compile)",
                  file=sys.stderr)
    figures: dict[str, dict] = {}
    print(f"{'case':16s} {'checkout':>10s} {'requests':>9s} {'instructions':>15s} {'start-up':>15s} "
          f"{'per request':>12s} {'build':>9s}")
    with tempfile.TemporaryDirectory(prefix="servesim-instr-") as tmp_name:
        tmp = Path(tmp_name)
        for case in cases():
            if case.name not in args.only:
                continue
            if case.needs is not None and not case.needs.exists():
                print(f"{case.name:16s} skipped ({case.needs} not found)")
                continue
            sides = {}
            for tag, root in zip("AB", roots):
                m = measure(root, case, args.requests, tmp, tag)
                sides[tag] = m
                print(f"{case.name:16s} {tag:>10s} {args.requests:9d} {m['request_instructions']:15,d} "
                      f"{m['startup_instructions']:15,d} {m['request_instructions'] / args.requests:12,.0f} "
                      f"{m['build']:>9s}", flush=True)
            if "B" in sides:
                ratio = sides["A"]["request_instructions"] / sides["B"]["request_instructions"]
                differ = _same_results(Path(sides["A"]["out"]), Path(sides["B"]["out"]))
                builds = "" if sides["A"]["build"] == sides["B"]["build"] else \
                    f" (builds differ: A {sides['A']['build']}, B {sides['B']['build']})"
                print(f"{case.name:16s} {'A/B':>10s} {ratio:9.4f}  results: "
                      + ("identical" if not differ else "DIFFER in " + ", ".join(differ)) + builds, flush=True)
                sides["ratio"] = {"request_instructions": ratio, "results_differ": differ}
            figures[case.name] = sides
    for tag, root in zip("AB", roots):
        costs = {name: sides[tag]["request_instructions"] / sides[tag]["sim_s"]
                 for name, sides in figures.items() if sides[tag]["sim_s"]}
        for line in pair_lines(costs, f"{tag}, {root.name}: the requests' instructions per simulated s"):
            print(line)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
