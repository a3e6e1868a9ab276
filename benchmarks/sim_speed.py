"""Simulation speed: simulated seconds per wall second, engine steps per wall second, peak memory.

    python benchmarks/sim_speed.py [--only default|saturating|hour] [--hour-trace PATH] [--sync] [--no-macro-steps]

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


def measure(name: str, wl, sync: bool = False, macro_steps: bool = True) -> None:
    import dataclasses

    t0 = time.perf_counter()
    cfg = SimConfig(macro_steps=macro_steps)
    if sync:
        cfg = dataclasses.replace(cfg, scheduler=dataclasses.replace(cfg.scheduler, async_scheduling=False))
    res = Engine(cfg, wl).run()
    wall = time.perf_counter() - t0
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    name = name + (" sync" if sync else "") + ("" if macro_steps else " plain")
    print(f"{name:16s} {len(wl.requests):6d} req  sim {res.sim_duration_s:8.1f} s  wall {wall:7.2f} s  "
          f"{res.sim_duration_s / wall:7.1f} sim-s/wall-s  {res.num_steps / wall:7.0f} steps/s  "
          f"({res.num_steps} steps)  peak RSS {peak_mib:.0f} MiB")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=["default", "saturating", "hour"])
    ap.add_argument("--sync", action="store_true", help="synchronous scheduling (default: async, vLLM 0.19's default)")
    ap.add_argument("--no-macro-steps", action="store_true", help="step one by one (macro_steps: false)")
    ap.add_argument("--hour-trace", default=str(ROOT.parent / "shared/data/traces/azure_llm_inference_2023/AzureLLMInferenceTrace_conv.csv"))
    args = ap.parse_args()
    print("Llama-3.1-8B on one H100 (roofline), vLLM 0.19 defaults (async scheduling unless --sync; "
          f"macro-steps {'off' if args.no_macro_steps else 'on'})")
    opts = {"sync": args.sync, "macro_steps": not args.no_macro_steps}
    if args.only in (None, "default"):
        measure("default", load_bundled(), **opts)
    if args.only in (None, "saturating"):
        wl = make_workload("poisson", {"num_requests": 3000, "arrival": {"rate_per_s": 50.0},
                                       "prompt_len": {"dist": "uniform", "low": 200, "high": 2000},
                                       "output_len": {"dist": "uniform", "low": 50, "high": 500}},
                           np.random.default_rng(0))
        measure("saturating", wl, **opts)
    if args.only in (None, "hour"):
        p = Path(args.hour_trace)
        if p.exists():
            measure("1-hour real", load_workload(p), **opts)
        else:
            print(f"1-hour real: skipped ({p} not found)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
