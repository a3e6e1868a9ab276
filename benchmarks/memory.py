"""Peak memory (max RSS) of whole CLI replays, each case in a fresh subprocess.

    python benchmarks/memory.py [--only synthetic_1m|mooncake] [--num-prompts N]

Cases:
- synthetic_1m: `servesim replay --dataset-name random` with 1,000,000 requests of 16 prompt and
  4 output tokens at 5,000 req/s (short, so the run finishes in minutes; what grows is the number of
  requests, the quantity issue 13 bounds), results written to a temporary folder.
- mooncake: the full Mooncake conversation trace (12,031 requests) with defaults.

Peak RSS is the child's ru_maxrss from os.wait4, so every case is measured alone, results writing
included.

    python benchmarks/memory.py --writing [--num-prompts N]

Writing's share: the synthetic case through the Python API (servesim.api.run) in two fresh
children, one that only simulates (and builds the summary) and one that also writes the result
folder; prints both peaks and their ratio (issue 42's bound: writing within 25 % of the
simulation's own peak).

Measured on the 2-core development machine (shared, so wall times are noisy), peak RSS:
                  before (0422afb)   after (token ids in int32 arrays, frames built once)
    synthetic_1m       2061 MiB          1767 MiB
    mooncake           4449 MiB          1170 MiB
synthetic_1m with the records let go as they become the requests table (a chunk of rows at a
time, no view per request's gaps: MetricsCollector.columns(release=True)), compiled, the machine
loaded: 1873 MiB at 1262eb6, 1820 MiB after. By phase (RSS, one process, compiled): workload
built 648 MiB, simulated 1518, requests table built 1690 (1791 before), summary 1772, written
1836 (1859 before): the simulation alone passes 1.5 GB, and the records' freed memory is not
reused by the table's arrays, so 1.5 GB needs the records kept as columns from each finish on.
With the workload as columns (traces/spec_columns.py), completed records moved into columns at
their finish (simulator/finished_records.py) and the KV manager's key roots as words
(scheduler/kv/root_set.py), compiled, the machine loaded, runs alternated with a build of
eff0cfd: synthetic_1m 1821, 1821 MiB at eff0cfd; 1385, 1357 MiB after. What is left is the scheduler's Requests in flight: this traffic offers more than the
engine serves, so most requests wait at once (100 k requests: 54 k in the scheduler at the peak).
--writing, 1,000,000 requests (pure Python, the machine loaded): simulated 1764 MiB, simulated and
written 1779 MiB (ratio 1.01), with results written a Parquet row group at a time and no copies of
an all-finished table; before those, a 200,000-request run's stages peaked at 329 MiB simulated and
458 MiB written (1.39).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sim_speed import Case, run_servesim  # benchmarks/ is on sys.path when run as a script

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE = ROOT.parent / "shared/data/traces/mooncake_fast25/conversation_trace.jsonl.gz"


def cases(num_prompts: int) -> dict[str, list[str]]:
    return {
        "synthetic_1m": ["--dataset-name", "random", "--num-prompts", str(num_prompts), "--random-input-len", "16",
                         "--random-output-len", "4", "--request-rate", "5000"],
        "mooncake": [str(MOONCAKE)],
    }


def measure(name: str, args: list[str]) -> None:
    m = run_servesim(Case(name, tuple(args)), [])  # one fresh child per case: its own ru_maxrss
    state = "ok" if m.error is None else m.error
    print(f"{name:14s} peak RSS {m.peak_rss_mib:7.0f} MiB  wall {m.wall_s:7.1f} s  {state}", flush=True)


_API_CHILD = """
import sys, tempfile
from pathlib import Path
from servesim.api import run
from servesim.simulator.config import SimConfig
from servesim.traces.bench import BenchConfig, bench_workload
wl = bench_workload(BenchConfig(dataset_name="random", num_prompts=int(sys.argv[1]), random_input_len=16,
                                random_output_len=4, request_rate=5000))
with tempfile.TemporaryDirectory(prefix="servesim-memory-") as tmp:
    run(SimConfig(), wl, out_dir=Path(tmp) / "out" if sys.argv[2] == "write" else None)
"""


def measure_writing(num_prompts: int) -> None:
    """Peak RSS of the synthetic case simulated alone, then simulated and written."""
    from sim_speed import ROOT as CHECKOUT, _child, child_env

    peaks = {}
    for mode in ("simulate", "write"):
        wall, rss, code, err = _child([sys.executable, "-c", _API_CHILD, str(num_prompts), mode], CHECKOUT, child_env())
        peaks[mode] = rss
        print(f"{num_prompts} requests, {mode:8s}: peak RSS {rss:7.0f} MiB  wall {wall:6.1f} s  "
              f"{'ok' if code == 0 else err}", flush=True)
    print(f"writing's peak / simulation's peak: {peaks['write'] / peaks['simulate']:.2f}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=["synthetic_1m", "mooncake"])
    ap.add_argument("--num-prompts", type=int, default=1_000_000, help="requests of the synthetic case")
    ap.add_argument("--writing", action="store_true", help="the synthetic case with and without writing results")
    args = ap.parse_args()
    if args.writing:
        measure_writing(args.num_prompts)
        return 0
    for name, case_args in cases(args.num_prompts).items():
        if args.only in (None, name):
            if name == "mooncake" and not MOONCAKE.exists():
                print(f"{name}: skipped ({MOONCAKE} not found)")
                continue
            measure(name, case_args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
