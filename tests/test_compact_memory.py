"""Memory layout that must not change results: compact token ids and result frames built once."""

from __future__ import annotations

import dataclasses
from array import array

import pytest

from servesim.scheduler.hashing import make_block_hasher
from servesim.scheduler.lazy_ids import LazyTokenIds
from servesim.scheduler.request import Request, SamplingParams
from servesim.simulator.config import SimConfig
from servesim.simulator.build import build_engine
from servesim.simulator.summary import summarize
from servesim.traces.bundled import load_bundled
from servesim.traces.workload import RequestSpec, Workload


def _pair(ids):
    hasher = make_block_hasher(4)
    sp = SamplingParams(max_tokens=20, ignore_eos=True)
    return Request("a", list(ids), sp, block_hasher=hasher), Request("b", array("q", ids), sp, block_hasher=hasher)


def test_array_and_list_prompts_give_the_same_ids_and_block_hashes():
    from_list, from_array = _pair(range(1000, 1011))
    for r in (from_list, from_array):
        r.append_output_token_ids(7)
        r.append_output_token_ids([8, 9])
    assert from_list.block_hashes == from_array.block_hashes and len(from_list.block_hashes) == 3
    assert list(from_list.all_token_ids) == list(range(1000, 1011)) + [7, 8, 9]
    assert type(from_list.all_token_ids) is array  # 4 bytes a token, no boxed ints
    wide = Request("w", [2**40, 1, 2, 3], SamplingParams(max_tokens=5), block_hasher=make_block_hasher(4))
    assert wide.all_token_ids.typecode == "q" and list(wide.all_token_ids) == [2**40, 1, 2, 3]
    narrow = Request("n", [1, 2, 3], SamplingParams(max_tokens=5))
    narrow.append_output_token_ids(2**40)  # widens to int64
    assert narrow.all_token_ids.typecode == "q" and list(narrow.all_token_ids) == [1, 2, 3, 2**40]
    assert list(from_array.prompt_token_ids) == list(range(1000, 1011))
    assert from_array.output_token_ids == [7, 8, 9]


def test_ids_beyond_int64_fall_back_to_python_ints():
    r = Request("a", [1, 2, 3], SamplingParams(max_tokens=10))
    r.append_output_token_ids([4, 2**70, 5])  # array.extend would have kept the 4
    assert list(r.all_token_ids) == [1, 2, 3, 4, 2**70, 5] and r.output_token_ids == [4, 2**70, 5]
    assert list(Request("b", [2**70], SamplingParams()).all_token_ids) == [2**70]


def test_spec_token_id_array_matches_token_ids():
    for spec in (RequestSpec("r", 0.0, 700, 3, prefix_hash_ids=(4, 5)),
                 RequestSpec("s", 0.0, 40, 3, prefix_group=2, prefix_len=10),
                 RequestSpec("t", 0.0, 3, 1, prompt_token_ids=(5, 6, 7))):
        assert list(spec.token_id_array()) == spec.token_ids()


def test_result_frames_are_built_once_and_equal_a_fresh_build():
    wl = load_bundled()
    wl = dataclasses.replace(wl, requests=wl.requests[:20])
    cfg = SimConfig()
    res = build_engine(cfg, wl).run()
    m = res.metrics
    summary = summarize(m, res.sim_duration_s, 1.0, cfg.slo, 20, res.prefix_hits, res.prefix_queries)
    tables = m.tables()
    assert m.tables() is tables  # summary, result files and Results share one build
    assert tables.timeseries(res.sim_duration_s) is tables.timeseries(res.sim_duration_s)
    assert tables.requests.equals(m.requests_frame()) and tables.steps.equals(m.steps_frame())
    assert tables.timeseries(res.sim_duration_s).equals(m.timeseries_frame(res.sim_duration_s))
    assert summary["num_steps"] == len(tables.steps) == res.num_steps


def test_block_hashes_equal_hashes_of_plain_int_lists():
    from servesim.scheduler.hashing import extra_keys_bytes, get_hash_fn, hash_block_tokens

    ids = [5, 2**31 - 1, 0, 17, 9, 9, 9, 9, 1, 2]
    r = Request("a", ids, SamplingParams(max_tokens=20, ignore_eos=True), lora_id=3, cache_salt="s",
                block_hasher=make_block_hasher(4))
    r.append_output_token_ids([2**40, 6])  # widens the storage to int64 mid-block
    parent, expected = None, []
    all_ids = ids + [2**40, 6]
    for start in range(0, 12, 4):
        parent = hash_block_tokens(get_hash_fn("sha256"), parent, all_ids[start:start + 4],
                                   extra_keys_bytes(r, start))
        expected.append(parent)
    assert r.block_hashes == expected


class _CountingBuild:
    """A lazy prompt's builder that counts its calls."""

    def __init__(self, ids):
        self.ids, self.calls = ids, 0

    def __call__(self):
        self.calls += 1
        return array("i", self.ids)


def test_lazy_prompt_behaves_as_the_eager_one_and_builds_its_ids_once():
    ids = list(range(300, 323))  # 23 ids: six full blocks of 4 with the outputs below
    for outputs in ([7, 8, 9], [2**40, 6], [4, 2**70, 5]):  # int32, widening to int64, beyond int64
        build = _CountingBuild(ids)
        hasher = make_block_hasher(4)
        sp = SamplingParams(max_tokens=20, ignore_eos=True)
        lazy = Request("a", LazyTokenIds(len(ids), build), sp, block_hasher=hasher)
        eager = Request("a", list(ids), sp, block_hasher=hasher)
        assert build.calls == 1  # the real-id hasher read the prompt's blocks at construction
        for r in (lazy, eager):
            r.append_output_token_ids(outputs[0])
            r.append_output_token_ids(outputs[1:])
        n = len(ids) + len(outputs)
        assert lazy.num_tokens == eager.num_tokens == n and lazy.num_tokens_with_spec == n
        assert lazy.block_hashes == eager.block_hashes and len(lazy.block_hashes) == 6
        assert list(lazy.all_token_ids) == list(eager.all_token_ids) == ids + outputs
        assert list(lazy.prompt_token_ids) == ids and lazy.output_token_ids == outputs
        assert build.calls == 1


def test_lazy_prompt_is_not_built_when_nothing_reads_its_ids():
    build = _CountingBuild(list(range(10)))
    r = Request("a", LazyTokenIds(10, build), SamplingParams(max_tokens=5))  # no hasher: keys elsewhere
    r.append_output_token_ids([1, 2])
    prompt = r.prompt_token_ids
    assert isinstance(prompt, LazyTokenIds) and len(prompt) == 10 and r.num_tokens == 12
    assert build.calls == 0
    assert list(prompt) == list(range(10)) and prompt[3] == 3 and build.calls == 1  # a reader builds them
    assert list(r.all_token_ids) == list(range(10)) + [1, 2] and build.calls == 1


def test_lazy_prompt_refuses_a_builder_that_breaks_its_count():
    with pytest.raises(ValueError, match="built 3 ids, declared 4"):
        LazyTokenIds(4, lambda: [1, 2, 3]).ids()
    with pytest.raises(ValueError, match="at least one token"):
        LazyTokenIds(0, list)


@pytest.mark.parametrize("keys", ["provenance", "token_ids"])
def test_simulated_replay_builds_synthetic_prompts_only_when_hashing_ids(keys, monkeypatch):
    """Provenance keys read no prompt id: no synthetic prompt is built; hashing the ids builds
    each prompt once. The results are the same either way (tests/test_block_keys.py)."""
    calls = []
    original = RequestSpec.token_id_array
    monkeypatch.setattr(RequestSpec, "token_id_array", lambda spec: calls.append(spec.request_id) or original(spec))
    # synthetic prompts of every provenance kind: the request's own stream, a shared-prefix group
    # (with hits) and Mooncake-style hash ids
    specs = [RequestSpec(f"r{i}", 0.05 * i, 100 + 37 * i, 5 + i % 7,
                         **([{"prefix_group": i % 3, "prefix_len": 64}, {"prefix_hash_ids": (1, 2, i), "prefix_block_len": 16}, {}][i % 3]))
             for i in range(30)]
    wl = Workload(specs, name="lazy", source="tests/test_compact_memory.py")
    res = build_engine(SimConfig(prefix_cache_keys=keys), wl).run()
    assert res.prefix_hits > 0
    assert res.num_steps > 0 and res.metrics.tables().requests["finish_s"].notna().all()
    if keys == "provenance":
        assert calls == []
    else:
        assert sorted(calls) == sorted(r.request_id for r in wl.requests)


def test_requests_frame_keeps_each_records_gaps_and_recomputes_stale_ones():
    """A record keeps the gaps its first frame computed (a cluster's merged frame reuses them);
    times appended later, or shifted by the frontend delay, are computed afresh."""
    import numpy as np

    from servesim.simulator.metrics import MetricsCollector

    m = MetricsCollector()
    m.on_arrival("a", 0.0, 10, 5)
    m.on_arrival("b", 0.0, 10, 5)
    m.on_decode_run(["a", "b"], [0.1, 0.25, 0.45])
    first = m.requests_frame()
    gaps_a = first["itl_s"][0]
    assert np.shares_memory(m.requests["a"].itl_s, gaps_a) and list(gaps_a) == list(np.diff([0.1, 0.25, 0.45]))
    again = m.requests_frame()
    assert np.shares_memory(again["itl_s"][1], first["itl_s"][1])  # reused, not recomputed
    m.on_decode_run(["a"], [0.7])  # a's times grew: its cached gaps are stale
    grown = m.requests_frame()
    assert list(grown["itl_s"][0]) == list(np.diff([0.1, 0.25, 0.45, 0.7]))
    m.delay_outputs(0.003)
    delayed = m.requests_frame()
    assert list(delayed["itl_s"][1]) == list(np.diff(np.array([0.1, 0.25, 0.45]) + 0.003))


def test_completed_requests_frame_by_column_equals_the_row_path(tmp_path):
    """All requests completed: the frame built a column at a time holds exactly the row path's
    values (same dtypes, same parquet bytes); one still-running request (no finish) included."""
    import pandas as pd

    from servesim.simulator import metrics as M
    from servesim.simulator import request_table as T

    eng = build_engine(SimConfig(), load_bundled())
    res = eng.run()
    m = res.metrics
    records = list(m.requests.values())
    assert all(r.status != "timed_out" and r.reject_reason is None for r in records)
    fast = m.requests_frame()
    rows = _rows(records)
    pd.testing.assert_frame_equal(fast, rows)
    fast.to_parquet(tmp_path / "a.parquet")
    rows.to_parquet(tmp_path / "b.parquet")
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()
    one = dataclasses.replace(records[0], finish_s=None, finish_reason=None)
    alone = M.MetricsCollector()
    alone.requests = {one.request_id: one}
    pd.testing.assert_frame_equal(alone.requests_frame(), _rows([one]))
    # every column built when called: those since arrival come from the columns, not from these
    assert set(T.completed_columns([one], [one.itl_s])) == set(T.REQUEST_COLUMNS) - set(T.SINCE_ARRIVAL)


def _rows(records):
    import pandas as pd

    from servesim.simulator import metrics as M
    from servesim.simulator import request_table as T

    cols = {c: [] for c in M.REQUEST_COLUMNS}
    for r in records:
        T.append_row(cols, r, r.itl_s)
    return pd.DataFrame(cols, columns=M.REQUEST_COLUMNS)
