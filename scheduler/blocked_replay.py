"""The blocked-waits oracle's rules (tools/blocked_oracle.py) on the replay side of a step trace.

The oracle's workload carries `grammar_steps` (a structured-output request whose grammar resolves
right before the schedule() of step arrival_step + grammar_steps), `stream` (a streaming-input
session), and extra lines with the same req_id: `stream_chunk` (the session's next input chunk) and
`stream_close` (the input stream's close: a non-resumable request with prompt [0], AsyncLLM's final
request). Lines for a session that has already finished are dropped, as AsyncLLM cancels an aborted
session's input stream. The trace fields it adds follow the oracle's order (its docstring).
"""

from __future__ import annotations

from servesim.scheduler.request import Request, RequestStatus


def is_session_line(w: dict) -> bool:
    """A later line of a streaming session (a chunk or the close), not a new request."""
    return bool(w.get("stream_chunk") or w.get("stream_close"))


def request_kwargs(w: dict) -> dict:
    """Request(...) keywords of a workload line: structured output, resumable."""
    return {"structured_output": "grammar_steps" in w and not is_session_line(w),
            "resumable": bool(w.get("stream") or w.get("stream_chunk"))}


class BlockedReplay:
    """Grammar readiness and session lines for one replay; the oracle's trace fields."""

    __slots__ = ("grammar", "streaming", "async_scheduling", "_due", "_ready", "_stream_inputs")

    def __init__(self, grammar: bool, streaming: bool, async_scheduling: bool) -> None:
        self.grammar, self.streaming, self.async_scheduling = grammar, streaming, async_scheduling
        self._due: dict[int, list[str]] = {}  # step -> ids whose grammar resolves before its schedule()
        self._ready: list[str] = []
        self._stream_inputs: dict[str, str] = {}

    def add(self, sched, w: dict, request: Request, step: int) -> None:
        """add_request, as the oracle's driver does it for this line."""
        rid = w["req_id"]
        if is_session_line(w):
            live = sched.requests.get(rid)
            if live is None or live.is_finished():
                self._stream_inputs[rid] = "dropped"
                return
            self._stream_inputs[rid] = "close" if w.get("stream_close") else "chunk"
        elif "grammar_steps" in w:
            self._due.setdefault(step + int(w["grammar_steps"]), []).append(rid)
        sched.add_request(request)

    def before_schedule(self, sched, step: int) -> None:
        """Grammars due by this step become ready (the oracle resolves their futures here)."""
        for due in sorted(d for d in self._due if d <= step):
            for rid in self._due.pop(due):
                request = sched.requests.get(rid)
                if request is not None and request.status == RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR:
                    self._ready.append(rid)
                sched.mark_grammar_ready(rid)

    def fields(self, sched, out) -> dict:
        """The oracle's fields of this schedule() (appended after the update's fields)."""
        rec: dict = {}
        if self.grammar:
            rec["grammar_ready"] = self._ready
            rec["has_structured_output_requests"] = out.has_structured_output_requests
            if self.async_scheduling:
                rec["pending_structured_output_tokens"] = out.pending_structured_output_tokens
        rec["skipped_waiting"] = {r.request_id: r.status.name
                                  for r in sorted(sched.skipped_waiting, key=lambda r: r.request_id)}
        if self.streaming:
            rec["stream_inputs"] = self._stream_inputs
            rec["num_waiting_for_streaming_input"] = sched.num_waiting_for_streaming_input
            rec["num_unfinished"] = sched.get_num_unfinished_requests()
        self._ready, self._stream_inputs = [], {}
        return rec
