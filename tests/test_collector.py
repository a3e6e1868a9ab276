"""The cyclic collector is paused for a run and restored after it (simulator/collector.py)."""

import gc

import pytest

from servesim.running import load_trace, run
from servesim.simulator.collector import collector_paused
from servesim.simulator.config import SimConfig


def test_paused_inside_restored_after_even_on_error():
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():  # nested: the inner exit leaves it off
            pass
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # a collector already off stays off
    finally:
        gc.enable()


def test_a_run_pauses_the_collector_and_gives_it_back(monkeypatch):
    import servesim.running as running

    seen = []
    real = running._run

    def spy(*args):
        seen.append(gc.isenabled())
        return real(*args)

    monkeypatch.setattr(running, "_run", spy)
    res = run(SimConfig(), load_trace(None, max_requests=5))
    assert seen == [False] and gc.isenabled() and res.summary["num_completed"] == 5


_FRAGMENTED_HEAP = """
import sys
from array import array

from servesim.simulator.collector import release_freed_heap


def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


# 64 KiB pieces (under glibc's mmap threshold: heap memory), each followed by a 1 KiB one (over
# pymalloc's 512 bytes: also from the C heap) that stays alive, so no freed piece joins the
# heap's top, which free() alone would trim.
pieces, pins = [], []
for _ in range(3000):
    pieces.append(array("d", bytes(65536)))
    pins.append(array("d", bytes(1024)))
held = rss_mib()
del pieces
freed = rss_mib()
ok = release_freed_heap()
print(held, freed, rss_mib(), ok)
"""


def test_freed_heap_goes_back_to_the_system():
    """Arrays grown inside the C heap and freed stay with the allocator (their space is not at the
    heap's top) until release_freed_heap asks glibc to return it, as build_result does after a
    cluster's step rows move into one frame. In a fresh interpreter: the heap's layout in this
    one depends on every test before."""
    import ctypes
    import subprocess
    import sys

    from servesim.simulator.collector import release_freed_heap

    if not sys.platform.startswith("linux") or not hasattr(ctypes.CDLL(None), "malloc_trim"):
        assert release_freed_heap() is False
        return
    out = subprocess.run([sys.executable, "-c", _FRAGMENTED_HEAP], capture_output=True, text=True, check=True)
    held, freed, released, ok = out.stdout.split()
    assert ok == "True"
    assert float(freed) > float(held) - 50  # freeing alone gave back little of the ~190 MiB
    assert float(released) < float(freed) - 100  # the release returned most of it
