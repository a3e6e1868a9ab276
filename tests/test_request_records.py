"""MetricsRecorder (simulator/request_records.py): the token times a step's outputs record."""

from __future__ import annotations

from servesim.scheduler.output import RequestOutput
from servesim.simulator.request_records import MetricsRecorder


def test_each_new_token_gets_its_steps_time_and_the_first_sets_ttft():
    rec = MetricsRecorder()
    for rid in ("a", "b", "c"):
        rec.on_arrival(rid, 0.0, prompt_len=8, output_len=16)
    t1, t2 = 0.1 + 0.2, 1.0 / 3.0  # not exactly representable: copied bit for bit
    rec.on_step_outputs([RequestOutput("a", [7], None, 0), RequestOutput("b", [], None, 0),
                         RequestOutput("c", [1, 2, 3], None, 0)], t1)  # c: accepted drafts
    rec.on_step_outputs([RequestOutput("a", [8], None, 0), RequestOutput("b", [5, 6], None, 0)], t2)
    times = {rid: list(r.token_times_s) for rid, r in rec.requests.items()}
    assert times == {"a": [t1, t2], "b": [t2, t2], "c": [t1, t1, t1]}
    assert [rec.requests[r].first_token_s for r in "abc"] == [t1, t2, t1]


def test_a_decode_run_appends_one_time_per_step_and_request():
    rec = MetricsRecorder()
    for rid in ("a", "b"):
        rec.on_arrival(rid, 0.0, prompt_len=8, output_len=16)
    rec.on_step_outputs([RequestOutput("a", [7], None, 0)], 0.5)
    rec.on_decode_run(["a", "b"], [0.75, 1.25, 1.5], counts=[3, 2])
    assert list(rec.requests["a"].token_times_s) == [0.5, 0.75, 1.25, 1.5]
    assert list(rec.requests["b"].token_times_s) == [0.75, 1.25]
    assert rec.requests["b"].first_token_s == 0.75
