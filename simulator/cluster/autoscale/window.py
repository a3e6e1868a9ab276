"""A pool's sliding metrics window: requests routed, first tokens and finishes over the last window_s.

The controller tells it each request routed to the pool (`routed`) and asks at each decision
(`sample`). Requests not yet answered wait in `_pending`; a decision moves those whose first token
or finish came since into time-stamped deques, so each decision costs the requests in flight plus
those that left the window, never a scan of the whole run.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from servesim.simulator.engine import Engine
from servesim.simulator.request_records import RequestRecord


@dataclass(slots=True)
class WindowSample:
    request_rate_per_s: float
    mean_prompt_len: float | None
    mean_output_len: float | None
    ttft_s: float | None  # percentile of the TTFTs whose first token came in the window
    itl_s: float | None  # percentile of per-request mean ITL over requests finished in the window
    slo_attainment: float | None  # fraction of requests finished (or refused) in the window meeting the SLO


@dataclass(slots=True)
class _Pending:
    request_id: str
    arrival_s: float  # the cluster arrival (TTFT counts the routing latency, as the summary does)
    engine: Engine
    first_token_seen: bool = False


class PoolWindow:
    def __init__(self, window_s: float, percentile: float, ttft_slo_s: float, tpot_slo_s: float) -> None:
        self.window_s, self.percentile = window_s, percentile
        self.ttft_slo_s, self.tpot_slo_s = ttft_slo_s, tpot_slo_s
        self._routed: deque[tuple[float, int, int]] = deque()  # (time, prompt_len, output_len)
        self._pending: list[_Pending] = []
        self._ttft: deque[tuple[float, float]] = deque()  # (first token time, ttft)
        self._done: deque[tuple[float, float | None, bool]] = deque()  # (finish time, mean ITL, met the SLO)

    def routed(self, now_s: float, request_id: str, arrival_s: float, prompt_len: int, output_len: int,
               engine: Engine) -> None:
        self._routed.append((now_s, prompt_len, output_len))
        self._pending.append(_Pending(request_id, arrival_s, engine))

    def _collect(self) -> None:
        keep: list[_Pending] = []
        for p in self._pending:
            rec: RequestRecord = p.engine.metrics.requests[p.request_id]
            if not p.first_token_seen and rec.first_token_s is not None:
                p.first_token_seen = True
                self._ttft.append((rec.first_token_s, rec.first_token_s - p.arrival_s))
            if rec.finish_s is not None or rec.reject_reason is not None or rec.status == "timed_out":
                self._done.append(_finished(rec, p.arrival_s, self.ttft_slo_s, self.tpot_slo_s))
            else:
                keep.append(p)
        self._pending = keep
        # Finishes are appended in decision order, not time order: sort what came in this round.
        if len(self._ttft) > 1:
            self._ttft = deque(sorted(self._ttft))
        if len(self._done) > 1:
            self._done = deque(sorted(self._done, key=lambda d: d[0]))

    def sample(self, now_s: float) -> WindowSample:
        self._collect()
        cutoff = now_s - self.window_s
        for q in (self._routed, self._ttft, self._done):
            while q and q[0][0] <= cutoff:
                q.popleft()
        n = len(self._routed)
        prompt = sum(r[1] for r in self._routed) / n if n else None
        output = sum(r[2] for r in self._routed) / n if n else None
        ttft = float(np.percentile([t for _, t in self._ttft], self.percentile)) if self._ttft else None
        itls = [d[1] for d in self._done if d[1] is not None]
        itl = float(np.percentile(itls, self.percentile)) if itls else None
        met = sum(d[2] for d in self._done) / len(self._done) if self._done else None
        return WindowSample(n / self.window_s, prompt, output, ttft, itl, met)


def _finished(rec: RequestRecord, arrival_s: float, ttft_slo_s: float, tpot_slo_s: float
              ) -> tuple[float, float | None, bool]:
    """(when it left, its mean ITL or None, whether it met TTFT and TPOT), as the summary's goodput counts."""
    n = len(rec.token_times_s)
    end = rec.finish_s if rec.finish_s is not None else rec.first_token_s if rec.first_token_s is not None else arrival_s
    if rec.first_token_s is None:
        return end, None, False
    itl = (rec.finish_s - rec.first_token_s) / (n - 1) if n > 1 and rec.finish_s is not None else None
    met = rec.first_token_s - arrival_s <= ttft_slo_s and (itl or 0.0) <= tpot_slo_s
    return end, itl, met
