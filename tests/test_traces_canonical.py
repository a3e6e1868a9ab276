"""Canonical format: lossless save/load in JSONL, CSV and Parquet; the vLLM-oracle loader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim.traces import RequestSpec, Workload, load_bundled, load_workload, save_workload, sniff_format

ENCODINGS = ("w.jsonl", "w.jsonl.gz", "w.csv", "w.csv.gz", "w.parquet")

# Text without surrogates (not encodable as UTF-8) or NUL; commas, quotes, newlines are fine.
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
               min_size=1, max_size=12)
INT64 = st.integers(-(2**62), 2**62)


@st.composite
def request_specs(draw, index: int) -> RequestSpec:
    ids = draw(st.one_of(st.none(), st.lists(st.integers(0, 2**31 - 1), min_size=1,
                                              max_size=20).map(tuple)))
    prompt_len = len(ids) if ids is not None else draw(st.integers(1, 5000))
    group = draw(st.one_of(st.none(), st.integers(0, 1000)))
    hashes = draw(st.one_of(st.none(), st.lists(st.integers(0, 2**40), min_size=1,
                                                max_size=3).map(tuple)))
    block_len = draw(st.integers(max(1, -(-prompt_len // 3)), 4096)) if hashes else 512
    if hashes:
        hashes = hashes[: -(-prompt_len // block_len)]
    return RequestSpec(
        request_id=f"{index}:{draw(TEXT)}",  # unique by construction
        arrival_time_s=draw(st.floats(0, 1e7, allow_nan=False, allow_infinity=False)),
        prompt_len=prompt_len,
        output_len=draw(st.integers(1, 10**6)),
        prompt_token_ids=ids,
        prefix_hash_ids=hashes,
        prefix_block_len=block_len,
        prefix_group=group,
        prefix_len=draw(st.integers(0, prompt_len)) if group is not None else 0,
        priority=draw(INT64),
        session_id=draw(st.one_of(st.none(), TEXT)),
        is_last_turn=draw(st.booleans()),
        lora_id=draw(st.one_of(st.none(), INT64)),
        arrival_step=draw(st.one_of(st.none(), st.integers(0, 2**40))),
    )


@st.composite
def workloads(draw) -> Workload:
    count = draw(st.integers(1, 6))
    specs = [draw(request_specs(i)) for i in range(count)]
    return Workload.from_unsorted(specs, name="w", source="hypothesis")


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(workload=workloads())
@pytest.mark.parametrize("filename", ENCODINGS)
@pytest.mark.slow
def test_round_trip_all_encodings(tmp_path, filename, workload):
    path = save_workload(workload, tmp_path / filename)
    assert sniff_format(path) == "canonical"
    loaded = load_workload(path)
    assert loaded.requests == workload.requests
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp files


@pytest.mark.slow
def test_round_trip_of_a_real_trace(tmp_path):
    workload = load_bundled("sharegpt-300")
    for filename in ("s.jsonl.gz", "s.csv.gz", "s.parquet"):
        assert load_workload(save_workload(workload, tmp_path / filename)).requests == \
            workload.requests


def test_canonical_sorts_stably_and_writes_compact_jsonl(tmp_path):
    rows = [
        {"request_id": "b", "arrival_time_s": 2.0, "prompt_len": 4, "output_len": 1},
        {"request_id": "a", "arrival_time_s": 1.0, "prompt_len": 4, "output_len": 1},
        {"request_id": "c", "arrival_time_s": 1.0, "prompt_len": 4, "output_len": 1},
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    loaded = load_workload(path)
    assert [r.request_id for r in loaded.requests] == ["a", "c", "b"]
    out = save_workload(loaded, tmp_path / "out.jsonl")
    first = json.loads(out.read_text().splitlines()[0])
    assert set(first) == {"request_id", "arrival_time_s", "prompt_len", "output_len"}


def test_save_rejects_unknown_extension(tmp_path):
    from servesim.traces import InputError

    with pytest.raises(InputError, match="encoding"):
        save_workload(load_bundled(), tmp_path / "w.txt")


def test_oracle_format(tmp_path: Path):
    rows = [
        {"req_id": "r2", "prompt_token_ids": [1, 2, 3], "max_tokens": 4, "arrival_step": 3,
         "priority": 1, "prefix_group": 0},
        {"req_id": 7, "prompt_token_ids": [1, 2, 9], "max_tokens": 2, "arrival_step": 0,
         "priority": 0, "prefix_group": None},
        {"req_id": "r3", "prompt_token_ids": [5], "max_tokens": 1, "arrival_step": 3},
    ]
    path = tmp_path / "oracle.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert sniff_format(path) == "oracle"
    w = load_workload(path, seconds_per_step=0.01)
    assert [r.request_id for r in w.requests] == ["7", "r2", "r3"]  # by step, then file order
    assert [r.arrival_step for r in w.requests] == [0, 3, 3]
    assert w.requests[1].arrival_time_s == pytest.approx(0.03)
    assert w.requests[1].prefix_group == 0 and w.requests[1].priority == 1
    assert w.requests[1].token_ids() == [1, 2, 3] and w.requests[1].output_len == 4
    assert all(r.arrival_time_s == 0.0 for r in load_workload(path).requests)
