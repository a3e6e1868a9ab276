"""Cluster simulation speed: 100 requests/s over 32 Llama-3.1-8B/H100 replicas, on one core.

    python benchmarks/cluster_speed.py                  # scaled down: 60 s of traffic (6000 requests)
    python benchmarks/cluster_speed.py --duration 3600  # the full target: 1 hour (360k requests)
    python benchmarks/cluster_speed.py --sync --router prefix_aware   # sync scheduling
    python benchmarks/cluster_speed.py --no-macro-steps               # step one by one (macro_steps: false)

Traffic: Poisson arrivals; prompts lognormal (median 300, sigma 0.5, <= 2000 tokens), outputs
lognormal (median 150, sigma 0.6, <= 1000 tokens) -- the lengths of scenarios/prefix_caching_onoff.yaml.
Prints simulated vs wall time, engine steps per wall second, peak RSS, and the wall time the full hour
would take at the measured rate (steps and tokens grow linearly with the trace length at steady load).
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

from servesim.simulator.cluster import ClusterConfig, ReplicaGroup, RouterConfig, run_cluster, sim_config_from_dict  # noqa: E402
from servesim.traces.synthetic import make_workload  # noqa: E402


def workload(rate: float, duration_s: float, seed: int = 0):
    return make_workload("poisson", {
        "num_requests": int(rate * duration_s), "arrival": {"rate_per_s": rate},
        "prompt_len": {"dist": "lognormal", "median": 300, "sigma": 0.5, "max_value": 2000},
        "output_len": {"dist": "lognormal", "median": 150, "sigma": 0.6, "max_value": 1000},
    }, np.random.default_rng(seed))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of traffic (3600 = the full target)")
    ap.add_argument("--rate", type=float, default=100.0, help="requests per second")
    ap.add_argument("--replicas", type=int, default=32)
    ap.add_argument("--router", default="least_outstanding")
    ap.add_argument("--sync", action="store_true", help="synchronous scheduling (default: async)")
    ap.add_argument("--no-macro-steps", action="store_true", help="macro_steps: false (step one by one)")
    args = ap.parse_args()
    wl = workload(args.rate, args.duration)
    sim = sim_config_from_dict({"scheduler.async_scheduling": not args.sync, "macro_steps": not args.no_macro_steps})
    cfg = ClusterConfig(replicas=[ReplicaGroup(args.replicas, sim)], router=RouterConfig(args.router),
                        routing_latency_s=0.001)
    t0 = time.perf_counter()
    res = run_cluster(cfg, wl)
    wall = time.perf_counter() - t0
    s = res.summary
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    tokens = int(res.requests["output_len"].sum())
    print(f"{len(wl.requests)} requests at {args.rate:g}/s over {args.replicas} replicas ({args.router}"
          f"{', sync' if args.sync else ''}{', plain steps' if args.no_macro_steps else ''}): sim {s['sim_duration_s']:.1f} s, wall {wall:.1f} s "
          f"({s['sim_duration_s'] / wall:.2f} sim-s/wall-s), {s['num_steps']} steps ({s['num_steps'] / wall:.0f}/s), "
          f"{tokens} output tokens ({tokens / wall:.0f}/s), peak RSS {peak:.0f} MiB")
    print(f"  TTFT p50 {1e3 * s['ttft_s']['p50']:.1f} ms, TPOT p50 {1e3 * s['tpot_s']['p50']:.1f} ms, "
          f"{100 * s['goodput']['fraction_meeting_slo']:.0f} % meet the default SLO")
    if args.duration < 3600:
        print(f"  1 hour at this rate: ~{wall * 3600 / args.duration / 60:.0f} min wall (linear extrapolation)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
