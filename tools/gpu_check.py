"""`make gpu-check`: one command, no network, that proves the GPU path on a CUDA machine.

    python3 tools/gpu_check.py [--device cuda|cpu] [--out FOLDER]      # make gpu-check [DEVICE=cpu]
    python3 tools/gpu_check.py --make-carry                           # make gpu-carry (here, once)

Parts, each time-boxed (seconds on one H100/H200; a part that reaches its budget stops where it
is, says so in the report and counts as failed), about 7.3 minutes at most in all, so a rerun
fits in the 15 minutes a device loan gives:

1. environment (10 s): GPU, driver, torch, triton, Python, which servesim build is in use;
2. kernels (120 s, ~36 Triton compiles on a fresh machine among them): the runner's Triton
   kernels against the torch reference on the device (every dtype and block size the CPU tests
   cover; decode, prefill, chunk over a cached prefix, varlen mixed batches, padding tokens) and
   the tiny model, Triton vs torch, over 3 mixed steps;
3. lock step (120 s): a small real trace (the bundled ShareGPT trace's first requests) replayed by
   the simulated executor and by `--executor gpu --clock model` with random-weight Llama-3.1-8B
   shapes, then with SmolLM2-135M's real weights (the carried cut, carry.py); the step traces
   compared field for field (tools/compare_traces.py) and the cut's logits checked against the
   CPU's;
4. wall clock (60 s): the same replay on `--clock measured`; each step's measured time against the
   cost models' price of the same batch (median and p90 relative error by step kind);
5. calibration (120 s): `servesim calibrate`'s sweep on a bounded grid, `servesim fit`, and the
   fit compared with the shipped profile of this GPU kind;
6. report (10 s): report.md beside everything else in one output folder.

Exit status: 0 when every part passed; 1 when a kernel check failed, the traces differ or a part
ran out of time; 2 on bad arguments. `--device cpu` is the rehearsal CI runs (tests/
test_gpu_check.py): the same parts on the CPU with the Triton interpreter at reduced sizes
(tiny-llama instead of 8B shapes, fewer requests, the quick calibration grid).

Runs from a bare checkout (no install): the checkout's root goes on sys.path, and the packages
the GPU machine lacks come from the carry folder (.gpu-carry/, made by --make-carry). How to run
it on the device machine: docs/GPU_RUNNER.md, "gpu-check".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def bootstrap(carry: Path) -> None:
    """The checkout's servesim and this folder's gpucheck first; the carried zips last (the
    machine's own packages win where it has them)."""
    for p in (str(ROOT / "tools"), str(ROOT)):
        if p not in sys.path:
            sys.path.insert(0, p)
    sys.path.extend(str(z) for z in sorted(carry.glob("*.zip")) if str(z) not in sys.path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gpu_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--out", type=Path, default=None,
                    help="result folder (new; default runs/gpu-check-DEVICE-UTCSTAMP)")
    ap.add_argument("--make-carry", action="store_true", help="fill the carry folder here and exit")
    ap.add_argument("--carry", type=Path, default=ROOT / ".gpu-carry", help="the carry folder (default .gpu-carry)")
    ap.add_argument("--gguf", type=Path, default=None, help="with --make-carry: the SmolLM2 GGUF "
                    "(default: the test weights make test fetches)")
    args = ap.parse_args(argv)
    bootstrap(args.carry)
    if args.make_carry:
        from gpucheck.carry import make_carry

        for f in make_carry(args.carry, args.gguf):
            print(f"{f}  {f.stat().st_size / 2**20:.1f} MiB")
        return 0
    from gpucheck.run import run_check
    from servesim.traces.errors import InputError

    try:
        return run_check(args.device, args.out, ROOT, args.carry)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
