"""Per-request timelines (servesim/timeline.py) and the Chrome trace export (servesim/perfetto.py)."""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from servesim.perfetto import chrome_trace
from servesim.timeline import Span, request_timelines
from servesim.traces.errors import InputError


def _tables():
    """Request a: prompt 4, chunked 3 + 1, two decode steps, preempted, recomputed, one more decode.
    Request b: rejected, never scheduled."""
    requests = pd.DataFrame({"request_id": ["a", "b"], "arrival_s": [0.0, 0.5], "prompt_len": [4, 9],
                             "output_len": [4, 0], "first_scheduled_s": [1.0, np.nan],
                             "first_token_s": [3.0, np.nan], "finish_s": [8.0, np.nan], "num_preemptions": [1, 0],
                             "num_cached_tokens": [0, 0], "status": ["completed", "rejected"]})
    steps = pd.DataFrame({"step": np.arange(7), "start_s": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0],
                          "duration_s": [1.0] * 7, "num_requests": [1, 1, 1, 1, 0, 1, 1],
                          "num_prefill_tokens": [3, 1, 0, 0, 0, 6, 0], "num_decode_tokens": [0, 0, 1, 1, 0, 0, 1],
                          "num_preemptions": [0, 0, 0, 1, 0, 0, 0], "kv_usage": [0.1, 0.2, 0.2, 0.3, 0.0, 0.3, 0.3],
                          "num_running": [1, 1, 1, 1, 0, 1, 1], "num_waiting": [1, 1, 1, 0, 1, 0, 0]})

    def cached(computed, outputs, resumed=False):
        return [{"req_id": "a", "resumed": resumed, "num_computed_tokens": computed, "num_output_tokens": outputs}]

    records = [{"step": 0, "new": [{"req_id": "a"}], "cached": [], "num_scheduled_tokens": {"a": 3}, "preempted": []},
               {"step": 1, "cached": cached(3, 0), "num_scheduled_tokens": {"a": 1}, "preempted": []},
               {"step": 2, "cached": cached(4, 1), "num_scheduled_tokens": {"a": 1}, "preempted": []},
               {"step": 3, "cached": cached(5, 2), "num_scheduled_tokens": {"a": 1}, "preempted": ["a"]},
               {"step": 4, "cached": [], "num_scheduled_tokens": {}, "preempted": []},
               {"step": 5, "cached": cached(0, 3, resumed=True), "num_scheduled_tokens": {"a": 6}, "preempted": []},
               {"step": 6, "cached": cached(6, 3), "num_scheduled_tokens": {"a": 1}, "preempted": []}]
    return requests, steps, records


def test_timeline_from_the_step_trace_exact():
    requests, steps, records = _tables()
    spans = request_timelines(requests, steps, records)
    assert spans["a"] == [Span("queued", 0.0, 1.0), Span("prefill", 1.0, 2.0, 3), Span("prefill", 2.0, 3.0, 1),
                          Span("decode", 3.0, 5.0, 2), Span("preempted", 5.0, 6.0), Span("prefill", 6.0, 7.0, 6),
                          Span("decode", 7.0, 8.0, 1), Span("finished", 8.0, 8.0)]
    assert spans["b"] == [Span("queued", 0.5, 0.5), Span("rejected", 0.5, 0.5)]


def test_timeline_phases_without_a_step_trace_and_bad_ids():
    requests, steps, _ = _tables()
    spans = request_timelines(requests, steps, request_ids=["a"])
    assert spans == {"a": [Span("queued", 0.0, 1.0), Span("prefill", 1.0, 3.0), Span("decode", 3.0, 8.0),
                           Span("finished", 8.0, 8.0)]}
    with pytest.raises(InputError, match="no request 'zz'"):
        request_timelines(requests, steps, request_ids=["zz"])
    with pytest.raises(InputError, match="step 9 is not in the run's steps table"):
        request_timelines(requests, steps, [{"step": 9, "num_scheduled_tokens": {}}])


def _check_structure(trace: dict) -> dict:
    """Valid Chrome trace JSON: every async begin closed by an end of the same name (LIFO per id),
    complete slices of one thread nested (here: disjoint), counters with numeric args."""
    events = json.loads(json.dumps(trace))["traceEvents"]
    stacks, last_end, kinds = defaultdict(list), {}, defaultdict(int)
    for e in events:  # in file order, which is each request's time order
        kinds[e["ph"]] += 1
        assert e["ph"] in "MXCben" and isinstance(e["pid"], int)
        if e["ph"] == "b":
            assert not stacks[e["id"]] or stacks[e["id"]][-1][1] <= e["ts"]
            stacks[e["id"]].append((e["name"], e["ts"]))
        elif e["ph"] == "e":
            name, ts = stacks[e["id"]].pop()
            assert name == e["name"] and e["ts"] >= ts
        elif e["ph"] == "X":
            assert e["dur"] >= 0 and e["ts"] >= last_end.get((e["pid"], e["tid"]), -1) - 1e-6
            last_end[(e["pid"], e["tid"])] = e["ts"] + e["dur"]
        elif e["ph"] == "C":
            assert all(isinstance(v, (int, float)) for v in e["args"].values())
    assert all(not s for s in stacks.values())
    return kinds


def test_chrome_trace_events_and_sampling():
    requests, steps, records = _tables()
    trace = chrome_trace(requests, steps, records, title="t")
    kinds = _check_structure(trace)
    assert kinds["X"] == 7 and kinds["C"] == 14 and kinds["n"] == 2
    assert kinds["b"] == kinds["e"] == 2 + 7 + 1  # two requests, a's 7 spans, b's one
    x = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert [e["name"] for e in x][:3] == ["prefill", "prefill", "decode"] and x[0]["dur"] == 1e6
    assert x[3]["args"]["num_preemptions"] == 1
    kv = [e["args"]["kv_usage_pct"] for e in trace["traceEvents"] if e["name"] == "KV cache usage (%)"]
    assert kv[:2] == [10.0, 20.0]
    small = chrome_trace(requests, steps, None, max_requests=1, max_steps=3)
    assert small["metadata"]["sampled"] == {"requests": "every 2", "steps": "every 3"}
    assert sum(e["ph"] == "X" for e in small["traceEvents"]) == 3
    assert [e["name"] for e in small["traceEvents"] if e["ph"] == "b"][0] == "a"


def test_replay_writes_a_trace_of_overlapping_async_steps(tmp_path):
    from servesim.cli import _register, app

    _register()
    out, steps, trace = tmp_path / "r", tmp_path / "steps.jsonl", tmp_path / "trace.json"
    args = ["replay", "--max-requests", "12", "--step-trace", str(steps), "--trace-events", str(trace),
            "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads(trace.read_text())
    kinds = _check_structure(data)
    assert kinds["n"] == 12 and data["metadata"]["detail"] == "per step (step trace)"
    assert data["displayTimeUnit"] == "ms"
    again = CliRunner().invoke(app, ["export-trace", str(out), "--out", str(trace)])
    assert again.exit_code == 2 and "already exists" in again.output
    bad = CliRunner().invoke(app, ["export-trace", str(tmp_path), "--out", str(tmp_path / "t.json")])
    assert bad.exit_code == 2 and "no completed run" in bad.output
    zero = CliRunner().invoke(app, ["export-trace", str(out), "--out", str(tmp_path / "t.json"), "--max-steps", "0"])
    assert zero.exit_code == 2 and "--max-steps" in zero.output


@pytest.mark.slow  # draws every figure of a run (~8 s here)
def test_report_names_the_run_and_draws_request_timelines(tmp_path):
    from servesim.plots import plot_results
    from servesim.plots.context import run_context
    from servesim.plots.timeline import shown_requests

    from servesim.running import load_trace, run
    from servesim.simulator.config import SimConfig

    res = run(SimConfig(), load_trace(None, max_requests=30), out_dir=tmp_path / "r")
    line = run_context(tmp_path / "r")
    assert line.startswith("llama-3.1-8b on h100 (TP 1, PP 1), vllm 0.19.1 engine; trace sharegpt-300 (first 30)")
    assert "seed 0; servesim " in line
    pngs, report = plot_results(tmp_path / "r")
    text = report.read_text()
    assert "llama-3.1-8b on h100" in text and "Request timelines" in text
    assert any(p.name == "request_timelines.png" for p in pngs)
    picked = shown_requests(res.requests, limit=8)
    assert len(picked) == 8 and picked == sorted(picked, key=res.requests["request_id"].tolist().index)
    assert run_context(tmp_path) == ""  # not a result: nothing to name


def test_request_gantt_draws_each_phase():
    from servesim.plots.timeline import request_gantt

    class Res:
        requests, steps, _ = _tables()

    Res.requests = Res.requests.assign(e2e_s=[8.0, np.nan])
    fig = request_gantt(Res, _tables()[2])
    bars = [p for p in fig.axes[0].patches if p.get_width() > 0]
    assert len(bars) == 7  # a's queued, 2 prefill chunks, decode, preempted, prefill, decode; b has no span
    assert [t.get_text().strip() for t in fig.axes[0].texts] == ["1x preempted", "rejected"]
