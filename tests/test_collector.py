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
