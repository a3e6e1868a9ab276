"""A workload's requests kept as columns (traces/spec_columns.py): every spec reads back equal."""

from __future__ import annotations

import numpy as np
import pytest

from servesim.traces.bench import BenchConfig, arrival_schedule, bench_workload
from servesim.traces.errors import InputError
from servesim.traces.spec_columns import SpecColumns
from servesim.traces.workload import RequestSpec, Workload


def _specs() -> list[RequestSpec]:
    return [
        RequestSpec("a", 0.0, 5, 2),
        RequestSpec("b", 0.5, 8, 3, prefix_group=1, prefix_len=4, priority=2, session_id="s"),
        RequestSpec("c", 0.5, 7, 1, prefix_hash_ids=(4, 5), prefix_block_len=4, is_last_turn=False,
                    tenant="t", timeout_s=3.0),
        RequestSpec("d", 2.25, 6, 4, prompt_token_ids=(1, 2, 3, 4, 5, 6), grammar_compile_ms=1.5),
    ]


def test_every_spec_reads_back_equal_in_order():
    specs = _specs()
    wl = Workload(specs, name="w", source="hand")
    assert isinstance(wl.requests, SpecColumns)
    assert len(wl.requests) == 4
    assert list(wl.requests) == specs
    assert [wl.requests[i] for i in range(4)] == specs
    assert wl.requests[-1] == specs[-1] and wl.requests[-1] is not specs[-1]
    assert wl.requests == specs  # equal to the list it was built from
    with pytest.raises(IndexError):
        wl.requests[4]


def test_slices_are_lists_of_the_same_specs_and_rows_are_columns():
    wl = Workload(_specs(), name="w", source="hand")
    part = wl.requests[1:3]
    assert isinstance(part, list) and part == _specs()[1:3]
    part[0] = _specs()[0]  # the caller's own list
    assert wl.requests[1] == _specs()[1]
    assert wl.requests[::-2] == _specs()[::-2]
    assert wl.requests + _specs()[:1] == _specs() + _specs()[:1] and _specs()[:1] + wl.requests == _specs()[:1] + _specs()
    rows = wl.columns.rows(slice(1, 3))
    assert isinstance(rows, SpecColumns) and list(rows) == _specs()[1:3]


def test_a_field_gets_a_column_only_once_some_request_sets_it():
    cols = SpecColumns.of(_specs())
    assert cols.column("prefix_block_len") == [512, 512, 4, 512]
    assert cols.column("session_id") == [None, "s", None, None]
    assert cols.column("lora_id") is None and not cols.any_set("lora_id")
    assert cols.any_set("tenant") and cols.any_set("is_last_turn") and cols.any_set("grammar_compile_ms")
    assert not cols.any_set("mm_items") and not cols.any_set("parent_request_id")
    assert list(cols.column("arrival_time_s")) == [0.0, 0.5, 0.5, 2.25]
    assert list(cols.column("output_len")) == [2, 3, 1, 4]
    with pytest.raises(KeyError, match="no field 'nope'"):
        cols.column("nope")


def test_columns_are_taken_as_they_are_and_not_given_anything_else():
    cols = SpecColumns.of(_specs())
    assert SpecColumns.of(cols) is cols
    assert Workload(cols, name="w", source="hand").requests is cols
    with pytest.raises(TypeError, match="RequestSpecs, got dict"):
        SpecColumns.of([{"request_id": "x"}])


def test_unsorted_and_epoch_workloads_as_before():
    with pytest.raises(InputError, match="not sorted"):
        Workload([RequestSpec("a", 1.0, 5, 2), RequestSpec("b", 0.5, 5, 2)], name="w", source="hand")
    wl = Workload([RequestSpec("a", 1.7e9, 5, 2), RequestSpec("b", 1.7e9 + 0.25, 5, 2, session_id="s")],
                  name="w", source="hand")
    assert [r.arrival_time_s for r in wl.requests] == [0.0, 0.25]
    assert wl.requests[1].session_id == "s" and "rebased" in wl.source
    assert wl.duration_s == 0.25


def test_bench_workload_columns_hold_the_schedule_and_lengths():
    cfg = BenchConfig(dataset_name="random", num_prompts=50, request_rate=10.0, random_input_len=16,
                      random_output_len=4)
    wl = bench_workload(cfg)
    send_s = arrival_schedule(cfg, np.random.default_rng(cfg.seed))
    assert list(wl.columns.arrival_times_s) == send_s.tolist()
    assert [r.arrival_time_s for r in wl.requests] == send_s.tolist()
    assert set(wl.columns.prompt_lens) == {16} and set(wl.columns.output_lens) == {4}
    assert wl.requests[7].request_id == "bench-random-7"
    assert wl.summary()["mean_prompt_len"] == 16.0


def test_shared_prefix_bench_sets_its_columns():
    cfg = BenchConfig(dataset_name="shared_prefix", num_prompts=6, num_groups=2, users_per_group=2,
                      system_prompt_len=32, question_len=8)
    wl = bench_workload(cfg)
    assert wl.columns.column("prefix_group") == [0, 0, 1, 1, 0, 0]
    assert wl.columns.column("session_id")[4] == "shared-prefix-user-0"
    assert set(wl.columns.prompt_lens) == {40}
