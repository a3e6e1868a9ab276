"""Per-request timelines: when a request arrived, waited, ran each chunk, was preempted and finished.

    spans = request_timelines(res.requests, res.steps, read_step_records("trace.jsonl"))
    spans["req-7"]  # [Span("queued", 0.0, 0.41), Span("prefill", 0.41, 0.47, 2048), ...]

From a run's tables alone (requests + steps) each request has three phases: `queued` (arrival to
first scheduled), `prefill` (to its first token) and `decode` (to its finish). With the run's step
trace (`replay --step-trace FILE`, the scheduler's output of every step) the spans are the steps
themselves: each `prefill` chunk (the tokens scheduled in that step), runs of consecutive decode
steps merged into one `decode` span, a `preempted` span from the step that preempted the request
to the start of the step that resumed it (its recomputation is `prefill` again), and `queued`
before the first chunk. A step's span is its [start_s, start_s + duration_s) in steps.parquet,
matched by step number. `finished` / `rejected` / `timed_out` end the list as a zero-length span.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from servesim.traces.errors import InputError

KINDS = ("queued", "prefill", "decode", "preempted", "finished", "rejected", "timed_out")


@dataclass(slots=True)
class Span:
    kind: str  # one of KINDS
    start_s: float
    end_s: float
    num_tokens: int = 0  # tokens scheduled (prefill chunk) or steps merged (decode)


def read_step_records(path: str | Path) -> Iterator[dict]:
    """The step trace's records (JSON lines), each with `step`, `num_scheduled_tokens`, `preempted`."""
    from servesim.traces.rows import iter_json_rows

    file = Path(path).expanduser()
    if not file.is_file():
        raise InputError("file not found", path=str(file), field="--step-trace")
    for line, rec in iter_json_rows(file):  # a bad line: InputError naming the file and line
        if "step" not in rec or "num_scheduled_tokens" not in rec:
            raise InputError("not a step-trace record", path=str(file), line=line, field="step",
                             allowed="the JSON lines `replay --step-trace` writes")
        yield rec


def _end(row) -> tuple[str, float]:
    status = row.get("status") or "finished"
    status = "finished" if status == "completed" else status
    end = row.get("finish_s")
    if end is None or (isinstance(end, float) and math.isnan(end)):
        end = row.get("arrival_s")
    return (status if status in KINDS else "finished"), float(end)


def _phases(row) -> list[Span]:
    arrival = float(row["arrival_s"])
    first_sched, first_tok = row.get("first_scheduled_s"), row.get("first_token_s")
    status, end = _end(row)
    spans = []
    have = [t for t in (first_sched, first_tok) if t is not None and not (isinstance(t, float) and math.isnan(t))]
    if len(have) == 2:
        spans += [Span("queued", arrival, float(first_sched)), Span("prefill", float(first_sched), float(first_tok)),
                  Span("decode", float(first_tok), end)]
    else:
        spans.append(Span("queued", arrival, end))
    return spans + [Span(status, end, end)]


def request_timelines(requests, steps, step_records: Iterable[dict] | None = None,
                      request_ids: Iterable[str] | None = None) -> dict[str, list[Span]]:
    """request_id -> its spans in time order (see the module docstring); `request_ids` limits the
    answer to those requests (the step trace is still read once, in order)."""
    rows = {r["request_id"]: r for r in requests.to_dict("records")}
    wanted = set(rows) if request_ids is None else set(request_ids)
    unknown = sorted(wanted - set(rows))
    if unknown:
        raise InputError(f"no request {unknown[0]!r} in the run", field="request_id",
                         allowed="a request_id of requests.parquet")
    if step_records is None:
        return {rid: _phases(rows[rid]) for rid in rows if rid in wanted}
    return _from_steps(rows, wanted, steps, step_records)


def _from_steps(rows: dict, wanted: set[str], steps, step_records: Iterable[dict]) -> dict[str, list[Span]]:
    start = dict(zip(np.asarray(steps["step"]).tolist(), np.asarray(steps["start_s"], dtype=float).tolist()))
    dur = dict(zip(np.asarray(steps["step"]).tolist(), np.asarray(steps["duration_s"], dtype=float).tolist()))
    spans: dict[str, list[Span]] = {rid: [] for rid in rows if rid in wanted}
    preempted_at: dict[str, float] = {}
    for rec in step_records:
        step = rec["step"]
        if step not in start:
            raise InputError(f"step {step} is not in the run's steps table", field="--step-trace",
                             allowed="the step trace written by this same run")
        t0, t1 = start[step], start[step] + dur[step]
        # A scheduled request is decoding when every token but its last output is computed (a new
        # or resumed one recomputes first: prefill, however few tokens the prefix cache leaves).
        cached = {c["req_id"]: c for c in rec.get("cached", ())}
        for rid, n in rec["num_scheduled_tokens"].items():
            out = spans.get(rid)
            if out is None:
                continue
            if rid in preempted_at:
                out.append(Span("preempted", preempted_at.pop(rid), t0))
            c = cached.get(rid)
            decoding = (c is not None and not c.get("resumed") and c.get("num_output_tokens", 0) >= 1
                        and c["num_computed_tokens"] >= int(rows[rid]["prompt_len"]) + c["num_output_tokens"] - 1)
            if decoding and out and out[-1].kind == "decode":
                out[-1].end_s, out[-1].num_tokens = t1, out[-1].num_tokens + 1
            else:
                out.append(Span("decode" if decoding else "prefill", t0, t1, 1 if decoding else int(n)))
        for rid in rec.get("preempted", ()):
            if rid in spans:
                preempted_at[rid] = t1
    for rid, out in spans.items():
        row = rows[rid]
        status, end = _end(row)
        first = out[0].start_s if out else end
        out.insert(0, Span("queued", float(row["arrival_s"]), first))
        if rid in preempted_at:
            out.append(Span("preempted", preempted_at[rid], end))
        out.append(Span(status, end, end))
    return spans


__all__ = ["KINDS", "Span", "read_step_records", "request_timelines"]
