"""The free-block queue under the Azure conversation hour's churn: ns per block popped, freed, touched.

    python benchmarks/free_queue_speed.py              # compiled when the checkout is built
    python benchmarks/free_queue_speed.py --cold 0     # caches left warm between operations

A BlockPool of 28,000 blocks (the hour's Llama-3.1-8B / H100 pool) with caching on. Each round
pops 60-100 blocks (get_new_blocks) and deals them out to 32 requests in flight, as a step's
allocations interleave; while more than 5 % of the pool is in use (the hour keeps 3-5 %) a random
request finishes (free_blocks, tail first) and a third of the newcomers take a prefix hit on a
recently finished request's blocks (touch: removals from the middle of the free queue). After a
while the queue's order is the order of frees, scattered over the blocks in memory. With --cold N
(default 64) an array of N MiB is read between rounds, so each round finds the blocks out of cache
as the simulator does (it touches far more memory between two allocations); only the pool's calls
are timed, and each reports the median over its calls of ns per block (the machine is shared: a
preempted call says nothing of the pool). The choices are seeded: the same operations every build.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections import deque
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's servesim (and its build)

from servesim.scheduler.kv.block import KVCacheBlock
from servesim.scheduler.kv.block_pool import BlockPool


def run(num_blocks: int, num_rounds: int, cold_mib: int, seed: int) -> dict[str, float]:
    pool = BlockPool(num_blocks, enable_caching=True)
    rng = random.Random(seed)
    active: list[list[KVCacheBlock]] = [[] for _ in range(32)]  # requests in flight: their blocks
    recent: deque[list[KVCacheBlock]] = deque(maxlen=200)  # finished requests' blocks, a hit's source
    max_held = num_blocks // 20  # the hour keeps 3-5 % of its pool in use
    evict = np.ones(cold_mib << 17, dtype=np.float64) if cold_mib else None
    per_block: dict[str, list[float]] = {"alloc": [], "free": [], "touch": []}  # each call's ns per block
    for _ in range(num_rounds):
        if evict is not None:
            evict.sum()
        while pool.num_gpu_blocks - 1 - pool.get_num_free_blocks() > max_held:
            # a request finishes: its blocks are freed tail first and a new one takes its seat
            i = rng.randrange(len(active))
            blocks = active[i]
            t0 = time.perf_counter_ns()
            pool.free_blocks(reversed(blocks))
            if blocks:
                per_block["free"].append((time.perf_counter_ns() - t0) / len(blocks))
            if blocks:
                recent.append(blocks)
            active[i] = []
            if recent and rng.random() < 1 / 3:  # the newcomer hits a finished request's prefix
                src = recent[rng.randrange(len(recent))]
                hit = src[: rng.randint(1, len(src))]
                t0 = time.perf_counter_ns()
                pool.touch(hit)
                per_block["touch"].append((time.perf_counter_ns() - t0) / len(hit))
                active[i] = list(hit)
        n = rng.randint(60, 100)
        t0 = time.perf_counter_ns()
        new = pool.get_new_blocks(n)
        per_block["alloc"].append((time.perf_counter_ns() - t0) / n)
        # spread over the requests in flight, as a step's allocations interleave: frees then scatter
        for j, block in enumerate(new):
            active[(j * 7 + n) % len(active)].append(block)
    # medians: a call the shared machine preempts (tens of microseconds) says nothing of the pool
    return {k: statistics.median(v) for k, v in per_block.items()}


def main() -> None:
    from servesim._native import scheduler_mode

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", type=int, default=28_000)
    ap.add_argument("--rounds", type=int, default=3_000)
    ap.add_argument("--cold", type=int, default=64, help="MiB read between rounds (0: warm caches)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    r = run(args.blocks, args.rounds, args.cold, args.seed)
    print(f"{scheduler_mode()}: ns per block: get_new_blocks {r['alloc']:.1f}, free_blocks {r['free']:.1f}, "
          f"touch {r['touch']:.1f} (medians over calls)")


if __name__ == "__main__":
    main()
