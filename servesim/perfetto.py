"""The simulated timeline as a Chrome trace (JSON), which ui.perfetto.dev and chrome://tracing open.

    servesim export-trace runs/replay --out trace.json [--step-trace steps.jsonl]
    servesim replay ... --trace-events trace.json

Chrome's Trace Event Format (the JSON object form: {"traceEvents": [...], "displayTimeUnit": "ms"};
times `ts` / `dur` in microseconds of simulated time):

- a process per replica ("replica N"; one for a single engine) with metadata events (`ph: M`);
- engine steps as complete slices (`ph: X`) on its "engine steps" thread, the batch in `args`
  (requests, prefill and decode tokens, preemptions, KV usage); a step that starts before the
  previous one ended (async scheduling overlaps them) goes on a second lane, as slices on one
  thread must nest;
- counters (`ph: C`): "KV cache usage" (%) and "requests" (running, waiting) at each step;
- each request as an async slice (`ph: b` / `e`, category "request", its own id) with its spans
  (servesim/timeline.py) nested inside: queued, prefill chunks, decode, preempted; the end state
  (finished, rejected, timed_out) as an async instant (`ph: n`).

Bounded size: a run with more than `max_requests` requests keeps every k-th (k the smallest stride
that fits; the same requests each time), and more than `max_steps` steps keeps every k-th step and
counter sample; `metadata.sampled` says what was kept. Without a step trace the requests have their
three phases only (the step trace adds each chunk and preemption).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from servesim.timeline import request_timelines

MAX_REQUESTS = 20_000  # ~6 events a request: a few MB of JSON, which the Perfetto UI opens quickly
MAX_STEPS = 50_000  # ~20 MB of JSON, written in ~4 s
_US = 1e6


def _stride(n: int, limit: int) -> int:
    return max(1, math.ceil(n / limit))


def _replicas(table) -> np.ndarray:
    return np.asarray(table["replica"], dtype=np.int64) if "replica" in table.columns else np.zeros(len(table), np.int64)


def _step_events(steps, max_steps: int) -> tuple[list[dict], int]:
    stride = _stride(len(steps), max_steps)
    # Python lists of the kept rows: one conversion per column, not one numpy scalar per cell
    cols = {c: np.asarray(steps[c])[::stride].tolist()
            for c in ("step", "start_s", "duration_s", "num_requests", "num_prefill_tokens", "num_decode_tokens",
                      "num_preemptions", "kv_usage", "num_running", "num_waiting")}
    replica = _replicas(steps)[::stride].tolist()
    events = []
    lanes: dict[int, list[float]] = {}  # replica -> each lane's last step end (us)
    for i in range(len(replica)):
        pid, ts = replica[i] + 1, cols["start_s"][i] * _US
        dur = cols["duration_s"][i] * _US
        # Slices on one thread must nest: a step that starts before the previous one ended (async
        # scheduling overlaps them) goes on the first lane free by then.
        ends = lanes.setdefault(pid, [])
        lane = next((k for k, end in enumerate(ends) if end <= ts), len(ends))
        if lane == len(ends):
            ends.append(0.0)
        ends[lane] = ts + dur
        prefill, decode = int(cols["num_prefill_tokens"][i]), int(cols["num_decode_tokens"][i])
        kv = cols["kv_usage"][i]
        name = "prefill+decode" if prefill and decode else "prefill" if prefill else "decode"
        events.append({"name": name, "cat": "step", "ph": "X", "pid": pid, "tid": lane + 1, "ts": ts, "dur": dur,
                       "args": {"step": int(cols["step"][i]), "num_requests": int(cols["num_requests"][i]),
                                "num_prefill_tokens": prefill, "num_decode_tokens": decode,
                                "num_preemptions": int(cols["num_preemptions"][i]), "kv_usage": kv}})
        events.append({"name": "KV cache usage (%)", "ph": "C", "pid": pid, "ts": ts,
                       "args": {"kv_usage_pct": round(100.0 * kv, 3)}})
        events.append({"name": "requests", "ph": "C", "pid": pid, "ts": ts,
                       "args": {"running": int(cols["num_running"][i]), "waiting": int(cols["num_waiting"][i])}})
    return events, stride, {pid: len(ends) for pid, ends in lanes.items()}


def _request_events(requests, steps, step_records, max_requests: int) -> tuple[list[dict], int]:
    stride = _stride(len(requests), max_requests)
    ids = np.asarray(requests["request_id"]).tolist()[::stride]
    replica = dict(zip(np.asarray(requests["request_id"]).tolist(), _replicas(requests).tolist()))
    rows = {r["request_id"]: r for r in requests.to_dict("records")} if len(ids) else {}
    spans = request_timelines(requests, steps, step_records, request_ids=ids)
    events = []
    for n, rid in enumerate(ids):
        pid, row, key = replica[rid] + 1, rows[rid], hex(n + 1)
        timeline = spans[rid]
        begin, end = timeline[0].start_s * _US, timeline[-1].end_s * _US
        base = {"cat": "request", "id": key, "pid": pid}
        events.append({**base, "name": str(rid), "ph": "b", "ts": begin,
                       "args": {"prompt_len": int(row["prompt_len"]), "output_len": int(row["output_len"]),
                                "num_preemptions": int(row["num_preemptions"]),
                                "num_cached_tokens": int(row.get("num_cached_tokens") or 0)}})
        last = begin
        for span in timeline[:-1]:
            # Async slices of one id must nest: a chunk scheduled while the previous one still ran
            # (async scheduling) starts, in the trace, where that one ended.
            start = max(span.start_s * _US, last)
            last = max(span.end_s * _US, start)
            args = {"num_tokens": span.num_tokens} if span.num_tokens else {}
            events.append({**base, "name": span.kind, "ph": "b", "ts": start, "args": args})
            events.append({**base, "name": span.kind, "ph": "e", "ts": last})
        events.append({**base, "name": timeline[-1].kind, "ph": "n", "ts": end})
        events.append({**base, "name": str(rid), "ph": "e", "ts": end})
    return events, stride


def chrome_trace(requests, steps, step_records=None, *, title: str = "servesim run",
                 max_requests: int = MAX_REQUESTS, max_steps: int = MAX_STEPS) -> dict:
    """The run's timeline as a Chrome trace object (see the module docstring)."""
    step_events, step_stride, lanes = _step_events(steps, max_steps)
    request_events, request_stride = _request_events(requests, steps, step_records, max_requests)
    pids = sorted({e["pid"] for e in step_events + request_events} or {1})
    meta = []
    for pid in pids:
        meta.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"replica {pid - 1}"}})
        for lane in range(max(lanes.get(pid, 1), 1)):
            name = "engine steps" + (f" (overlapping, lane {lane + 1})" if lane else "")
            meta.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": lane + 1, "args": {"name": name}})
    return {"traceEvents": meta + step_events + request_events, "displayTimeUnit": "ms",
            "metadata": {"title": title, "clock": "simulated time (us)",
                         "detail": "per step (step trace)" if step_records is not None else "phases only",
                         "sampled": {"requests": f"every {request_stride}", "steps": f"every {step_stride}"},
                         "num_requests": int(len(requests)), "num_steps": int(len(steps))}}


def write_chrome_trace(folder: str | Path, out: str | Path, step_trace: str | Path | None = None,
                       overwrite: bool = False, max_requests: int = MAX_REQUESTS, max_steps: int = MAX_STEPS) -> Path:
    """A finished run's folder as a Chrome trace file at `out` (replaced only with overwrite)."""
    from servesim.scenario.results import load_results
    from servesim.simulator.outfile import atomic_text, check_output_file
    from servesim.timeline import read_step_records
    from servesim.traces.errors import InputError

    for name, value in (("--max-requests", max_requests), ("--max-steps", max_steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"got {value!r}", field=name, allowed="an integer >= 1")
    path = check_output_file(out, overwrite=overwrite, flag="--out")
    try:
        res = load_results(folder)
    except FileNotFoundError as exc:
        raise InputError(str(exc), path=str(folder), allowed="a finished run's folder (servesim replay --out)") from None
    from servesim.simulator.summary import step_rows_kept

    if not step_rows_kept(res.summary):
        raise InputError("the run kept no step rows (step_rows: false), and a trace's engine slices are its steps",
                         path=str(folder), allowed="a run with step_rows: true (the default)")
    records = None if step_trace is None else read_step_records(step_trace)
    trace = chrome_trace(res.requests, res.steps, records, title=f"servesim: {Path(folder).name}",
                         max_requests=max_requests, max_steps=max_steps)
    atomic_text(path, json.dumps(trace, separators=(",", ":")))
    return path


__all__ = ["MAX_REQUESTS", "MAX_STEPS", "chrome_trace", "write_chrome_trace"]
