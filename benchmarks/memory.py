"""Peak memory (max RSS) of whole CLI replays, each case in a fresh subprocess.

    python benchmarks/memory.py [--only synthetic_1m|mooncake] [--num-prompts N]

Cases:
- synthetic_1m: `servesim replay --dataset-name random` with 1,000,000 requests of 16 prompt and
  4 output tokens at 5,000 req/s (short, so the run finishes in minutes; what grows is the number of
  requests, the quantity issue 13 bounds), results written to a temporary folder.
- mooncake: the full Mooncake conversation trace (12,031 requests) with defaults.

Peak RSS is the child's ru_maxrss from os.wait4, so every case is measured alone, results writing
included.

Measured on the 2-core development machine (shared, so wall times are noisy), peak RSS:
                  before (0422afb)   after (token ids in int32 arrays, frames built once)
    synthetic_1m       2061 MiB          1767 MiB
    mooncake           4449 MiB          1170 MiB
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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=["synthetic_1m", "mooncake"])
    ap.add_argument("--num-prompts", type=int, default=1_000_000, help="requests of the synthetic case")
    args = ap.parse_args()
    for name, case_args in cases(args.num_prompts).items():
        if args.only in (None, name):
            if name == "mooncake" and not MOONCAKE.exists():
                print(f"{name}: skipped ({MOONCAKE} not found)")
                continue
            measure(name, case_args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
