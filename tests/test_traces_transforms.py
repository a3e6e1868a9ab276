"""Transforms (pure, new Workloads) and the bundled trace samples."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from servesim.traces import (
    DEFAULT_TRACE,
    InputError,
    RequestSpec,
    Workload,
    available_bundled_traces,
    bundled_trace_path,
    load_bundled,
    rate_scale,
    request_limit,
    time_limit,
    time_window,
)

DATA = Path(__file__).resolve().parents[1] / "traces" / "data"


def small() -> Workload:
    specs = [RequestSpec(f"r{i}", float(t), 10, 2) for i, t in enumerate([0, 1, 1, 2.5, 4, 8])]
    return Workload(specs, name="small", source="test")


def times(w: Workload) -> list[float]:
    return [r.arrival_time_s for r in w.requests]


def test_rate_scale():
    w = small()
    doubled = rate_scale(w, 2.0)
    assert times(doubled) == [0, 0.5, 0.5, 1.25, 2, 4]
    assert times(w) == [0, 1, 1, 2.5, 4, 8]  # input untouched
    assert times(rate_scale(w, 0.5)) == [0, 2, 2, 5, 8, 16]
    assert "rate x2" in doubled.source and doubled.name == w.name
    for bad in (0, -1, float("inf"), float("nan")):
        with pytest.raises(InputError):
            rate_scale(w, bad)


def test_limits_and_window():
    w = small()
    assert times(time_limit(w, 2.5)) == [0, 1, 1]
    assert len(time_limit(w, 0)) == 0
    assert [r.request_id for r in request_limit(w, 2).requests] == ["r0", "r1"]
    assert len(request_limit(w, 100)) == 6
    window = time_window(w, 1.0, 4.0)
    assert times(window) == [0, 0, 1.5]
    assert times(time_window(w, 1.0, 4.0, rebase=False)) == [1, 1, 2.5]
    with pytest.raises(InputError):
        time_window(w, 3.0, 1.0)
    with pytest.raises(InputError):
        request_limit(w, -1)


def test_step_indexed_workloads_refuse_time_moves():
    specs = [RequestSpec("a", 0.0, 3, 1, arrival_step=0), RequestSpec("b", 0.0, 3, 1,
                                                                       arrival_step=2)]
    w = Workload(specs, name="oracle", source="test")
    with pytest.raises(InputError, match="step-indexed"):
        rate_scale(w, 2.0)
    assert len(request_limit(w, 1)) == 1


def test_workload_must_be_sorted():
    specs = [RequestSpec("a", 2.0, 3, 1), RequestSpec("b", 1.0, 3, 1)]
    with pytest.raises(InputError, match="not sorted"):
        Workload(specs, name="x", source="test")
    assert [r.request_id for r in Workload.from_unsorted(specs, "x", "t").requests] == ["b", "a"]


def test_bundled_default_trace():
    assert DEFAULT_TRACE in available_bundled_traces()
    w = load_bundled()
    assert w.name == DEFAULT_TRACE and len(w) == 300
    assert "CASYS Lab at KAIST" in w.attribution
    assert all(r.prompt_token_ids is not None for r in w.requests)


def test_bundled_mooncake_sample_is_the_first_five_minutes():
    w = load_bundled("mooncake-conversation-5min")
    assert len(w) == 918 and w.duration_s < 300.0
    assert "Apache-2.0" in w.attribution
    with gzip.open(bundled_trace_path("mooncake-conversation-5min"), "rt") as fh:
        first = json.loads(fh.readline())
    assert first["input_length"] == w.requests[0].prompt_len == 6758


def test_bundled_unknown_name_lists_valid_ones():
    with pytest.raises(InputError) as err:
        bundled_trace_path("sharegpt")
    assert "sharegpt-300" in err.value.allowed


def test_bundled_data_is_small_and_attributed():
    files = [p for p in DATA.rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) < 1_000_000
    names = {p.name for p in files}
    assert {"README.md", "MIT-LLMServingSim.txt", "Apache-2.0.txt"} <= names
    assert "Copyright (c) 2024, CASYS Lab at KAIST" in (DATA / "LICENSES" /
                                                       "MIT-LLMServingSim.txt").read_text()


def mixed() -> Workload:
    """Specs with sparse fields set on some requests, ties and arrivals on the cut points."""
    specs = [RequestSpec("a", 0.0, 5, 1), RequestSpec("b", 0.3, 7, 2, priority=2, lora_id=1),
             RequestSpec("c", 1.0, 3, 4, session_id="s", is_last_turn=False),
             RequestSpec("d", 1.0, 9, 1, prompt_token_ids=tuple(range(9)), timeout_s=4.0),
             RequestSpec("e", 2.7, 4, 3, prefix_group=1, prefix_len=2), RequestSpec("f", 3.0, 6, 6)]
    return Workload(specs, name="mixed", source="test")


@pytest.mark.parametrize("factor", [0.3, 1.0, 3.0, 1e300])
def test_rate_scale_is_replace_per_spec(factor):
    from dataclasses import replace

    w = mixed()
    got = rate_scale(w, factor)
    assert list(got.requests) == [replace(r, arrival_time_s=r.arrival_time_s / factor) for r in w.requests]
    assert list(w.requests) == list(mixed().requests)  # the input is untouched


@pytest.mark.parametrize("limit_s", [0.0, 0.3, 1.0, 1.5, 3.0, 99.0])
def test_time_limit_keeps_the_arrivals_before(limit_s):
    w = mixed()
    assert list(time_limit(w, limit_s).requests) == [r for r in w.requests if r.arrival_time_s < limit_s]


@pytest.mark.parametrize(("start_s", "end_s"), [(0.0, 0.0), (0.3, 1.0), (1.0, 1.0), (1.0, 3.0), (0.5, 99.0)])
@pytest.mark.parametrize("rebase", [True, False])
def test_time_window_is_the_per_spec_filter(start_s, end_s, rebase):
    from dataclasses import replace

    w = mixed()
    kept = [r for r in w.requests if start_s <= r.arrival_time_s < end_s]
    if rebase and start_s > 0:
        kept = [replace(r, arrival_time_s=max(r.arrival_time_s - start_s, 0.0)) for r in kept]
    assert list(time_window(w, start_s, end_s, rebase=rebase).requests) == kept
