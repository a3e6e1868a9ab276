"""What a run records as it goes: each request's times (RequestRecord) and the step rows.

The engine calls MetricsRecorder at every arrival, step update and macro-step run, so this module
is compiled with the engine (tools/build_native.py; the interpreted copy is the reference);
simulator/metrics.py's MetricsCollector adds what is built from the records after the run.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from servesim.scheduler.output import RequestOutput
from servesim.simulator.step_table import StepTable

if TYPE_CHECKING:
    import numpy as np


def _no_times() -> array:
    return array("d")


@dataclass(slots=True)
class RequestRecord:
    request_id: str
    arrival_s: float
    prompt_len: int  # tokens
    output_len_target: int  # tokens the trace asks for
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    finish_s: float | None = None
    # When each output token was produced: float64 values, not boxed floats (a cluster hour
    # streams ~65 M tokens, ~2 GB as a list and 0.5 GB as an array).
    token_times_s: array = field(default_factory=_no_times)
    num_preemptions: int = 0
    num_cached_tokens: int = 0  # prefix-cache hit at first admission
    finish_reason: str | None = None
    # Why the request could never run (rejected at arrival: simulator/liveness.py) or never finish
    # (aborted as stranded: "stranded_<why>", scheduler/stranded.py).
    reject_reason: str | None = None
    # "timed_out" once the client gave up, "aborted" once the engine aborted it as stranded;
    # otherwise derived in requests_frame
    status: str | None = None
    grammar_wait_s: float | None = None  # structured output: its grammar's compile time (None: no grammar)
    input_wait_s: float | None = None  # streaming input: time parked waiting for its next chunk (None: none)
    # Inter-token gaps (s) as the first requests frame built from this record computed them (a view
    # of that frame's one gaps array; None before): a cluster's merged frame reuses its replicas'
    # instead of computing every gap again. Valid while len == max(len(token_times_s) - 1, 0) and
    # the times are unchanged (delay_outputs resets it).
    itl_s: np.ndarray | list | None = None
    order: int = 0  # arrivals recorded before this one (its row in the requests table)


class RetiredRecords(Protocol):
    """Where completed records go at their finish (simulator/finished_records.py's FinishedRecords),
    for a run whose caller reads no record afterwards."""

    def takes(self, rec: RequestRecord) -> bool:
        """Whether rec is complete for good: nothing writes it after its finish."""
        ...

    def add(self, rec: RequestRecord) -> None:
        """Keep rec's values (the recorder then drops rec)."""
        ...

    def last_finish_s(self) -> float | None:
        """The latest finish kept (None: none)."""
        ...

    def delay(self, delay_s: float) -> None:
        """Every output kept reaches the client delay_s later (as delay_outputs does to a record)."""
        ...

    def __len__(self) -> int:
        ...


class MetricsRecorder:
    """Per-request records (`requests`: request_id -> RequestRecord) and step rows (`steps`) of
    one engine's run, filled as the engine goes."""

    def __init__(self, keep_step_rows: bool = True) -> None:
        self.requests: dict[str, RequestRecord] = {}
        # keep_step_rows False: the rows are folded as they go (StepTable), not kept
        self.steps = StepTable(keep_step_rows)
        self.prefix_queries = 0  # tokens looked up in the prefix cache (first admissions and resumes)
        self.prefix_hits = 0
        # Completed requests' records moved out of `requests` at their finish (None: they stay;
        # retire_finished turns it on)
        self.finished: RetiredRecords | None = None
        self._num_arrived = 0

    def retire_finished(self, store: RetiredRecords) -> None:
        """From now on a completed request's record leaves `requests` at its finish, into `store`
        (columns: simulator/finished_records.py): for a caller that reads no record after the run
        and whose engine writes none after a finish (Engine.retire_finished_records)."""
        if self.finished is None:
            self.finished = store

    def on_arrival(self, request_id: str, t: float, prompt_len: int, output_len: int) -> None:
        self.requests[request_id] = RequestRecord(request_id, t, prompt_len, output_len, order=self._num_arrived)
        self._num_arrived += 1

    def on_step_outputs(self, outputs: Sequence[RequestOutput], t: float) -> None:
        """One step's outputs (RequestOutputs: request_id, new_token_ids) applied at t: their token
        times, in one call (a step's update carries every running request)."""
        requests = self.requests
        # t converted once, then concatenated onto each request's times: array.append(t) converts
        # the float again for every request (a format-parsing call), and a method call (frombytes)
        # costs a name lookup and an argument parse that `+=` (the type's own slot) does not
        t_once = array("d", (t,))
        for out in outputs:
            n = len(out.new_token_ids)
            if n:
                rec = requests[out.request_id]
                if rec.first_token_s is None:
                    rec.first_token_s = t
                rec.token_times_s += t_once if n == 1 else t_once * n

    def on_decode_run(self, request_ids: list[str], times_s: list[float], counts: list[int] | None = None) -> None:
        """Each request got one token at each of times_s (a run of plain decode steps); with
        `counts`, request i at the first counts[i] of them (>= 1; a run through finishes)."""
        if not times_s:
            return
        requests = self.requests
        times = array("d", times_s)  # converted once; each request's extend is then one memcpy
        for i, rid in enumerate(request_ids):
            rec = requests[rid]
            if rec.first_token_s is None:
                rec.first_token_s = times_s[0]
            rec.token_times_s += times if counts is None else times[:counts[i]]

    def on_reject(self, request_id: str, reason: str) -> None:
        self.requests[request_id].reject_reason = reason

    def on_finish(self, request_id: str, t: float, reason: str | None, num_cached_tokens: int) -> None:
        rec = self.requests[request_id]
        rec.finish_s = t
        rec.finish_reason = reason
        rec.num_cached_tokens = num_cached_tokens
        finished = self.finished
        if finished is not None and finished.takes(rec):
            finished.add(rec)
            del self.requests[request_id]

    def last_finish_s(self) -> float:
        """The latest finish recorded (0.0: none)."""
        end = max([r.finish_s for r in self.requests.values() if r.finish_s is not None], default=0.0)
        retired = self.finished.last_finish_s() if self.finished is not None else None
        return end if retired is None else max(end, retired)

    def on_stranded(self, request_id: str, reason: str) -> None:
        """The engine aborted the request: it could never be admitted (what it streamed stays recorded)."""
        rec = self.requests[request_id]
        rec.finish_reason = "abort"
        rec.status = "aborted"
        rec.reject_reason = reason

    def on_timeout(self, request_id: str) -> None:
        """The client gave up; the server aborted the request (what it streamed stays recorded)."""
        rec = self.requests[request_id]
        rec.finish_reason = "abort"
        rec.status = "timed_out"

    def delay_outputs(self, delay_s: float) -> None:
        """Every output the engine produced reaches the client delay_s later (the frontend's return
        trip); arrivals are already client send times."""
        for rec in self.requests.values():
            if rec.first_token_s is not None:
                rec.first_token_s += delay_s
                rec.token_times_s = array("d", [t + delay_s for t in rec.token_times_s])
                rec.itl_s = None
            if rec.finish_s is not None:
                rec.finish_s += delay_s
        if self.finished is not None:
            self.finished.delay(delay_s)
