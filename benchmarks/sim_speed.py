"""Simulation speed: simulated seconds per wall second, engine steps per wall second, peak memory.

    python benchmarks/sim_speed.py [--only default|saturating|hour] [--hour-trace PATH]

Cases: the bundled default replay; a saturating synthetic Poisson load; a 1-hour real trace
(Azure LLM inference 2023 conversation trace from ../shared, ~19k requests).
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from servesim.simulator.config import SimConfig  # noqa: E402
from servesim.simulator.engine import Engine  # noqa: E402
from servesim.traces.bundled import load_bundled  # noqa: E402
from servesim.traces.formats import load_workload  # noqa: E402
from servesim.traces.synthetic import make_workload  # noqa: E402


def measure(name: str, wl, fast_forward: bool = False) -> None:
    import dataclasses

    t0 = time.perf_counter()
    cfg = SimConfig()
    if fast_forward:  # fast-forward covers the synchronous loop only
        cfg = dataclasses.replace(cfg, fast_forward=True,
                                  scheduler=dataclasses.replace(cfg.scheduler, async_scheduling=False))
    res = Engine(cfg, wl).run()
    wall = time.perf_counter() - t0
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    name = name + (" sync+ff" if fast_forward else "")
    print(f"{name:16s} {len(wl.requests):6d} req  sim {res.sim_duration_s:8.1f} s  wall {wall:7.2f} s  "
          f"{res.sim_duration_s / wall:7.1f} sim-s/wall-s  {res.num_steps / wall:7.0f} steps/s  "
          f"({res.num_steps} steps)  peak RSS {peak_mib:.0f} MiB")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=["default", "saturating", "hour"])
    ap.add_argument("--fast-forward", action="store_true", help="exact fast-forward over plain decode steps")
    ap.add_argument("--hour-trace", default=str(ROOT.parent / "shared/data/traces/azure_llm_inference_2023/AzureLLMInferenceTrace_conv.csv"))
    args = ap.parse_args()
    print("Llama-3.1-8B on one H100 (roofline), vLLM 0.19 defaults (async scheduling; sync with --fast-forward)")
    if args.only in (None, "default"):
        measure("default", load_bundled(), args.fast_forward)
    if args.only in (None, "saturating"):
        wl = make_workload("poisson", {"num_requests": 3000, "arrival": {"rate_per_s": 50.0},
                                       "prompt_len": {"dist": "uniform", "low": 200, "high": 2000},
                                       "output_len": {"dist": "uniform", "low": 50, "high": 500}},
                           np.random.default_rng(0))
        measure("saturating", wl, args.fast_forward)
    if args.only in (None, "hour"):
        p = Path(args.hour_trace)
        if p.exists():
            measure("1-hour real", load_workload(p), args.fast_forward)
        else:
            print(f"1-hour real: skipped ({p} not found)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
