"""Grammar and streaming-input waits (scheduler/blocked_waits.py) by hand, and grammar compilation as
a timed blocker in simulated runs (simulator/structured_output.py). The step-for-step parity with
vLLM 0.19.1 is in tests/test_sched_golden.py (tests/golden/blocked_*)."""

from __future__ import annotations

import json

import pytest

from sched_helpers import make_sched, req, step
from servesim.scheduler import Request, RequestStatus, SamplingParams
from servesim.simulator.config import CostModelConfig, SimConfig
from servesim.simulator.config_values import apply_overrides
from servesim.scheduler.config import CacheConfig, SchedulerConfig
from servesim.simulator.engine import Engine
from servesim.simulator.fastpath import GRAMMAR_DECLINED, planner_for
from servesim.simulator.structured_output import XGRAMMAR_TTFM_P50_MS, StructuredOutputConfig
from servesim.traces.canonical import spec_from_row
from servesim.traces.errors import InputError
from servesim.traces.workload import RequestSpec, Workload


# --- grammar wait in the scheduler ------------------------------------------------------------------
def test_a_grammar_request_waits_in_skipped_waiting_until_its_grammar_is_ready():
    sched = make_sched()
    sched.add_request(req(sched, "g", 8, structured_output=True))
    sched.add_request(req(sched, "p", 8))
    assert sched.requests["g"].status == RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR
    assert [r.request_id for r in sched.skipped_waiting] == ["g"]
    out, _ = step(sched)
    assert list(out.num_scheduled_tokens) == ["p"]  # g was looked at first (FCFS: skipped first), stays
    assert [r.request_id for r in sched.skipped_waiting] == ["g"]
    assert not out.has_structured_output_requests
    sched.mark_grammar_ready("g")
    out, _ = step(sched)
    assert out.num_scheduled_tokens == {"p": 1, "g": 8}  # running first, then the promoted g
    assert [n.req_id for n in out.scheduled_new_reqs] == ["g"]
    assert out.has_structured_output_requests  # g samples this step: it needs a bitmask


def test_a_grammar_wait_counts_as_unfinished_work_and_abort_removes_it():
    sched = make_sched()
    sched.add_request(req(sched, "g", 8, structured_output=True))
    assert sched.get_num_unfinished_requests() == 1 and sched.has_unfinished_requests()
    assert sched.finish_requests("g", RequestStatus.FINISHED_ABORTED) == ["g"]
    assert not sched.skipped_waiting and "g" not in sched.requests
    sched.mark_grammar_ready("g")  # a compile ending after the abort changes nothing
    sched.check_invariants()


def test_priority_reads_the_skipped_head_only_when_it_ranks_first():
    sched = make_sched(policy="priority")
    sched.add_request(req(sched, "g", 4, structured_output=True, priority=0))
    sched.add_request(req(sched, "p", 4, priority=1))
    sched.mark_grammar_ready("g")
    out, _ = step(sched)
    assert list(out.num_scheduled_tokens) == ["g", "p"]  # g's priority 0 beats p's 1


# --- streaming-input sessions -------------------------------------------------------------------------
def _chunk(sched, rid: str, tokens: list[int], resumable: bool = True) -> Request:
    return Request(rid, tokens, SamplingParams(max_tokens=2), block_hasher=sched.block_hasher, resumable=resumable)


def test_a_session_parks_after_its_chunk_and_continues_with_the_next():
    sched = make_sched()
    sched.add_request(_chunk(sched, "s", [11, 12, 13]))
    step(sched, {"s": [50]})
    out, eco = step(sched, {"s": [51]})  # max_tokens 2: the chunk's generation stops
    assert [o.finish_reason for o in eco.outputs] == ["length"] and eco.finished_req_ids == []
    s = sched.requests["s"]
    assert s.status == RequestStatus.WAITING_FOR_STREAMING_REQ and sched.num_waiting_for_streaming_input == 1
    assert sched.get_num_unfinished_requests() == 0 and not sched.has_unfinished_requests()
    assert [r.request_id for r in sched.skipped_waiting] == ["s"]
    sched.add_request(_chunk(sched, "s", [20, 21]))  # the next chunk
    # computed tokens stay (the prompt and output 50); 51 was never computed and is dropped
    assert list(s.all_token_ids) == [11, 12, 13, 50, 20, 21] and s.num_prompt_tokens == 6
    assert s.num_computed_tokens == 4 and s.status == RequestStatus.WAITING
    out, _ = step(sched, {"s": [60]})
    assert [(n.req_id, n.num_computed_tokens) for n in out.scheduled_new_reqs] == [("s", 4)]
    assert out.num_scheduled_tokens == {"s": 2}


def test_the_stream_closing_finishes_a_parked_session_as_aborted_and_a_busy_one_when_it_stops():
    sched = make_sched()
    sched.add_request(_chunk(sched, "a", [1, 2, 3]))
    sched.add_request(_chunk(sched, "b", [4, 5, 6]))
    step(sched)
    sched.add_request(_chunk(sched, "b", [0], resumable=False))  # b's close arrives while it runs
    _, eco = step(sched)
    assert sorted(eco.finished_req_ids) == ["b"]  # b stopped and its stream was closed: finished
    assert sched.requests["a"].status == RequestStatus.WAITING_FOR_STREAMING_REQ
    sched.add_request(_chunk(sched, "a", [0], resumable=False))
    assert "a" not in sched.requests and sched.num_waiting_for_streaming_input == 0
    assert not sched.skipped_waiting and sched.finished_req_ids == {"a", "b"}


def test_a_chunk_arriving_while_the_session_runs_is_queued_until_it_stops():
    sched = make_sched()
    sched.add_request(_chunk(sched, "s", [1, 2, 3]))
    step(sched, {"s": [40]})
    sched.add_request(_chunk(sched, "s", [7]))
    assert len(sched.requests["s"].streaming_queue) == 1
    step(sched, {"s": [41]})  # stops: takes the queued chunk at once, back to waiting
    s = sched.requests["s"]
    assert s.status == RequestStatus.WAITING and [r.request_id for r in sched.waiting] == ["s"]
    assert list(s.all_token_ids) == [1, 2, 3, 40, 7]


def test_a_second_non_session_request_with_a_live_id_is_refused():
    sched = make_sched()
    sched.add_request(req(sched, "x", 4))
    with pytest.raises(ValueError, match="duplicate request id 'x'"):
        sched.add_request(req(sched, "x", 4))


# --- simulated runs: grammar compilation as a timed blocker ------------------------------------------
def _sim_cfg(**kw) -> SimConfig:
    return SimConfig(scheduler=SchedulerConfig(max_model_len=256, async_scheduling=False),
                     cache=CacheConfig(block_size=16, num_gpu_blocks=64), derive_num_gpu_blocks=False,
                     cost_model=CostModelConfig(name="roofline"), **kw)


def test_a_request_is_first_scheduled_after_its_grammar_compiled_and_the_fast_path_declines():
    specs = [RequestSpec("g", 0.0, 32, 4, grammar_compile_ms=250.0), RequestSpec("p", 0.0, 32, 4)]
    engine = Engine(_sim_cfg(), Workload(specs, name="t", source="test"))
    assert planner_for(engine).declined == GRAMMAR_DECLINED
    engine.run()
    recs = engine.metrics.requests
    assert recs["p"].first_scheduled_s == 0.0
    assert recs["g"].first_scheduled_s >= 0.25 and recs["g"].grammar_wait_s == 0.25
    assert recs["p"].grammar_wait_s is None and recs["g"].finish_reason == "length"
    frame = engine.metrics.requests_frame().set_index("request_id")
    assert frame.loc["g", "grammar_wait_s"] == 0.25


def test_structured_output_rate_draws_the_same_requests_every_run():
    cfg = _sim_cfg(structured_output=StructuredOutputConfig(rate=0.5, grammar_compile_ms=10.0))
    specs = [RequestSpec(f"r{i}", 0.01 * i, 16, 2) for i in range(20)]
    waits = []
    for _ in range(2):
        engine = Engine(cfg, Workload(list(specs), name="t", source="test"))
        engine.run()
        waits.append(sorted(r for r, rec in engine.metrics.requests.items() if rec.grammar_wait_s is not None))
    assert waits[0] == waits[1] and 4 <= len(waits[0]) <= 16


def test_the_default_compile_time_is_the_cited_xgrammar_median():
    assert StructuredOutputConfig().grammar_compile_ms == XGRAMMAR_TTFM_P50_MS == 535.498


# --- bad input -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [-1.0, float("nan"), float("inf")])
def test_a_bad_grammar_compile_time_names_the_request(value):
    with pytest.raises(InputError, match="request 'q'") as e:
        RequestSpec("q", 0.0, 4, 4, grammar_compile_ms=value)
    assert e.value.field == "grammar_compile_ms"


def test_a_canonical_row_with_a_bad_grammar_time_names_file_line_and_field(tmp_path):
    path = tmp_path / "t.jsonl"
    row = {"request_id": "q", "arrival_time_s": 0.0, "prompt_len": 4, "output_len": 2, "grammar_compile_ms": -3}
    with pytest.raises(InputError) as e:
        spec_from_row(row, path, 7)
    assert e.value.field == "grammar_compile_ms" and "t.jsonl" in str(e.value) and "7" in str(e.value)
    ok = spec_from_row(dict(row, grammar_compile_ms=12.5), path, 1)
    assert ok.grammar_compile_ms == 12.5


@pytest.mark.parametrize("sets, field", [({"structured_output.rate": 1.5}, "structured_output.rate"),
                                         ({"structured_output.grammar_compile_ms": -1},
                                          "structured_output.grammar_compile_ms"),
                                         ({"engine": "sglang", "structured_output.rate": 0.5},
                                          "structured_output.rate")])
def test_config_errors_name_the_field(sets, field):
    with pytest.raises(InputError) as e:
        apply_overrides(SimConfig(), sets)
    assert e.value.field == field


def test_canonical_traces_keep_the_grammar_field(tmp_path):
    from servesim.traces.canonical import load_canonical, save_workload

    path = save_workload(Workload([RequestSpec("q", 0.0, 4, 2, grammar_compile_ms=80.0)], name="t", source="test"),
                         tmp_path / "t.jsonl")
    assert json.loads(path.read_text().splitlines()[0])["grammar_compile_ms"] == 80.0
    assert load_canonical(path).requests[0].grammar_compile_ms == 80.0


@pytest.mark.parametrize("engine, has_planner", [("sglang", False), ("vllm", True)])
def test_a_grammar_where_the_run_cannot_model_it_is_refused_naming_the_request(engine, has_planner):
    from servesim.simulator.structured_output import GrammarTimes

    times = GrammarTimes(StructuredOutputConfig(), seed=0)
    assert times.compile_s(RequestSpec("n", 0.0, 4, 2), engine, has_planner) is None  # no grammar: fine
    with pytest.raises(InputError, match="request 'g'") as e:
        times.compile_s(RequestSpec("g", 0.0, 4, 2, grammar_compile_ms=5.0), engine, has_planner)
    assert e.value.field == "grammar_compile_ms"


# --- simulated runs: streaming-input sessions ----------------------------------------------------------
def test_a_session_generates_per_chunk_and_finishes_once_after_its_last_chunk():
    from servesim.simulator.fastpath import SESSIONS_DECLINED

    specs = [RequestSpec("s", 0.0, 32, 4, input_chunk_offsets_s=(1.0, 2.0), input_chunk_lens=(8, 5)),
             RequestSpec("p", 0.5, 32, 4)]
    for async_scheduling in (False, True):
        cfg = _sim_cfg()
        cfg.scheduler.async_scheduling = async_scheduling
        engine = Engine(cfg, Workload(list(specs), name="t", source="test"))
        assert planner_for(engine).declined == SESSIONS_DECLINED
        engine.run()
        s = engine.metrics.requests["s"]
        times = list(s.token_times_s)
        # 4 tokens per chunk (the first chunk's max_tokens), each chunk starting when it arrives
        assert len(times) == 12 and times[3] < 1.0 <= times[4] and times[7] < 2.0 <= times[8]
        assert s.finish_reason == "length" and s.finish_s == times[-1]
        # parked from its chunk's last token until the next chunk: (1.0 - times[3]) + (2.0 - times[7])
        assert s.input_wait_s == pytest.approx(3.0 - times[3] - times[7])
        assert engine.metrics.requests["p"].input_wait_s is None
        assert engine.metrics.requests["p"].finish_reason == "length"
        assert not engine.scheduler.requests  # nothing left parked


@pytest.mark.parametrize("kw, field", [
    ({"input_chunk_offsets_s": (1.0,)}, "input_chunk_lens"),  # lengths missing
    ({"input_chunk_offsets_s": (2.0, 1.0), "input_chunk_lens": (3, 3)}, "input_chunk_offsets_s"),
    ({"input_chunk_offsets_s": (0.0,), "input_chunk_lens": (3,)}, "input_chunk_offsets_s"),
    ({"input_chunk_offsets_s": (1.0,), "input_chunk_lens": (0,)}, "input_chunk_lens"),
    ({"input_chunk_offsets_s": (1.0,), "input_chunk_lens": (3,), "grammar_compile_ms": 1.0}, "input_chunk_lens"),
])
def test_bad_input_chunks_name_the_request_and_field(kw, field):
    with pytest.raises(InputError, match="request 'q'") as e:
        RequestSpec("q", 0.0, 4, 2, **kw)
    assert e.value.field == field


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".parquet"])
def test_canonical_traces_keep_input_chunks(tmp_path, suffix):
    from servesim.traces.canonical import load_canonical, save_workload

    spec = RequestSpec("q", 0.0, 4, 2, input_chunk_offsets_s=(0.25, 1.5), input_chunk_lens=(3, 9))
    path = save_workload(Workload([spec, RequestSpec("r", 0.1, 4, 2)], name="t", source="test"), tmp_path / f"t{suffix}")
    back = load_canonical(path).requests
    assert (back[0].input_chunk_offsets_s, back[0].input_chunk_lens) == ((0.25, 1.5), (3, 9))
    assert back[1].input_chunk_offsets_s is None and back[1].input_chunk_lens is None
