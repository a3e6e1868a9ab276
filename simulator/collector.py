"""Pausing Python's cyclic garbage collector for the length of a simulation, and handing freed
heap memory back to the operating system.

Why: a run builds millions of long-lived objects (KV block pools, requests, token times, step
columns) and the collector walked all of them again at each full collection while finding almost
nothing to free: building, running and summarising a run leaves (next to) no cyclic garbage.
Measured: a 32-replica cluster (`benchmarks/cluster_speed.py`) spent 1.5-2.3 s of 8-11 s CPU in
the collector, and gc.collect() after a run with the collector off found 0 unreachable objects on
every shipped cluster config (P/D included); the single-engine Azure conversation hour spent
0.54 s in 404 collections and left 5 unreachable objects. Everything is still freed by reference
counting, and the collector runs again afterwards. Results do not depend on the collector.

Freed memory: a cluster's ~17 M step rows live in many arrays that grew step by step inside the C
heap; when they move into one frame (StepTable.move_to_frame) the C allocator keeps the freed
space for reuse rather than returning it, so the result's large numpy buffers (mapped separately)
came on top of it. release_freed_heap() asks glibc to return it (malloc_trim; cluster results call it
after each moved column): 32 replicas x 900 s (benchmarks/cluster_speed.py --duration 900), peak
RSS 2,034 MiB with the rows moved, 1,506 MiB with the heap returned after each column (3 ms a
call; the summary's gaps also released earlier). Elsewhere it does nothing.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """The collector off inside the block; nested use and a collector already off are left as
    they were."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def release_freed_heap() -> bool:
    """Return the C heap's free pages to the operating system (glibc's malloc_trim(0)); False where
    the C library has no such call (not Linux with glibc). Changes no Python object."""
    trim = _malloc_trim()
    return bool(trim is not None and trim(0))


@functools.cache  # looked up once: a cluster's results call it after each moved column
def _malloc_trim():
    if not sys.platform.startswith("linux"):
        return None
    try:
        process = ctypes.CDLL(None)  # the symbols already loaded: the C library among them
    except OSError:
        return None
    return getattr(process, "malloc_trim", None)  # glibc only (musl has none)
