"""The Continuum policy: keep a finished turn's KV pinned across an agent's tool call.

When a non-final turn of a job finishes, its blocks stay referenced for a TTL so the job's next
turn (its prompt extends this one) hits the prefix cache instead of recomputing it. The TTL comes
from a per-job estimate of the tool-call gap learned online; no pin when the predicted gap
exceeds the threshold (the pin would expire before the next turn arrives anyway).

Time is passed in by the caller (simulated seconds); nothing here reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scheduler.kv.manager import KVCacheManager
    from scheduler.request import Request


class ToolCallEstimator:
    """Predicts the gap between a turn's finish and the job's next arrival (seconds).

    Per job: the mean of the gaps observed for that job. Before a job has any observation, the
    mean over all jobs is used, and before anything was observed, `default_gap_s`.
    """

    def __init__(self, default_gap_s: float = 1.0) -> None:
        self.default_gap_s = default_gap_s
        self._last_finish_s: dict[str, float] = {}  # job_id -> finish time of its latest turn
        self._job_sum_s: dict[str, float] = {}
        self._job_count: dict[str, int] = {}
        self._all_sum_s = 0.0
        self._all_count = 0

    def request_arrives(self, request: Request, now_s: float) -> None:
        job = request.job_id
        if job is None or job not in self._last_finish_s:
            return
        gap = max(0.0, now_s - self._last_finish_s.pop(job))
        self._job_sum_s[job] = self._job_sum_s.get(job, 0.0) + gap
        self._job_count[job] = self._job_count.get(job, 0) + 1
        self._all_sum_s += gap
        self._all_count += 1

    def request_finished(self, request: Request, now_s: float) -> None:
        if request.job_id is not None:
            self._last_finish_s[request.job_id] = now_s

    def predict_gap_s(self, job_id: str) -> float:
        n = self._job_count.get(job_id, 0)
        if n:
            return self._job_sum_s[job_id] / n
        if self._all_count:
            return self._all_sum_s / self._all_count
        return self.default_gap_s


@dataclass(slots=True)
class Pin:
    request: Request
    unpin_at_s: float  # simulated time at which the blocks are released


class ContinuumPinner:
    """Pinned turns; at most one per job (a newer pin replaces the job's older one)."""

    def __init__(self, kv_cache_manager: KVCacheManager, requests: dict, threshold_s: float,
                 default_gap_s: float) -> None:
        self.kv = kv_cache_manager
        self.requests = requests  # the scheduler's req_id -> Request map (pinned ones stay in it)
        self.threshold_s = threshold_s
        self.estimator = ToolCallEstimator(default_gap_s)
        self.pins: list[Pin] = []
        self.num_pins_created = 0
        self.num_pins_expired = 0

    def pin_ttl_s(self, request: Request) -> float:
        """0 when pinning is not worth it; else twice the predicted gap, capped at the threshold."""
        predicted = self.estimator.predict_gap_s(request.job_id)
        if predicted > self.threshold_s:
            return 0.0
        return min(max(2.0 * predicted, 1e-3), self.threshold_s)

    def maybe_pin(self, request: Request, now_s: float) -> bool:
        """Called instead of freeing a finished request. True if its blocks are now pinned."""
        if request.is_last_step or request.job_id is None:
            return False
        self.estimator.request_finished(request, now_s)
        ttl = self.pin_ttl_s(request)
        if ttl <= 0.0:
            return False
        for pin in [p for p in self.pins if p.request.job_id == request.job_id]:
            self._unpin(pin)
        self.pins.append(Pin(request, now_s + ttl))
        self.num_pins_created += 1
        return True

    def sweep(self, now_s: float) -> None:
        """Release expired pins (before any allocation decision of the step)."""
        for pin in [p for p in self.pins if now_s >= p.unpin_at_s]:
            self._unpin(pin)
            self.num_pins_expired += 1

    def _unpin(self, pin: Pin) -> None:
        self.pins.remove(pin)
        self.kv.free(pin.request)
        self.requests.pop(pin.request.request_id, None)

    def pinned_job_ids(self) -> set[str]:
        return {p.request.job_id for p in self.pins}

    def pinned_request_ids(self) -> set[str]:
        return {p.request.request_id for p in self.pins}

    def num_pinned_blocks(self) -> int:
        return sum(self.kv.num_blocks_held(p.request.request_id) for p in self.pins)
