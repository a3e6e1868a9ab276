"""continuum: keep a finished turn's KV pinned across an agent's tool call.

When a non-final turn of a job finishes, its blocks stay referenced for a TTL so the job's next
turn (its prompt extends this one) hits the prefix cache instead of recomputing it. The TTL comes
from a per-job estimate of the tool-call gap learned online; no pin when the predicted gap
exceeds the threshold (the pin would expire before the next turn arrives anyway).

Order: FCFS, except that the oldest waiting turn of a pinned job goes first (its prefix is warm,
and the pin is wasted if it waits), and preemption spares jobs with a warm pin.

Time is passed in by the caller (simulated seconds); nothing here reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from servesim.scheduler.policies.base import SCHEDULING_POLICIES
from servesim.scheduler.policies.fcfs import FCFSPolicy, FCFSRequestQueue
from servesim.scheduler.queues import RequestQueue
from servesim.scheduler.request import Request, RequestStatus

if TYPE_CHECKING:
    from servesim.scheduler.config import SchedulerConfig
    from servesim.scheduler.kv.manager import KVCacheManager


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


class ContinuumRequestQueue(FCFSRequestQueue):
    """FCFS, but the oldest request of a pinned job is served before the head."""

    __slots__ = ("_pinned",)

    def __init__(self) -> None:
        super().__init__()
        self._pinned: set[str] = set()

    def set_pinned_jobs(self, pinned_job_ids: set[str]) -> None:
        self._pinned = pinned_job_ids

    def _first_warm(self) -> Request | None:
        if self._pinned:
            for r in self._dq:
                if r.job_id is not None and r.job_id in self._pinned:
                    return r
        return None

    def peek_request(self) -> Request:
        warm = self._first_warm()
        return warm if warm is not None else super().peek_request()

    def pop_request(self) -> Request:
        warm = self._first_warm()
        if warm is None:
            return self._dq.popleft()
        self._dq.remove(warm)
        return warm


@SCHEDULING_POLICIES.register("continuum")
class ContinuumPolicy(FCFSPolicy):
    """Pinned turns; at most one per job (a newer pin replaces the job's older one)."""

    # Pins expire in on_step: skipping schedule() calls would delay the release.
    fast_forward_safe = False

    def __init__(self, config: SchedulerConfig, kv_cache_manager: KVCacheManager, requests: dict) -> None:
        self.kv = kv_cache_manager
        self.requests = requests  # the scheduler's req_id -> Request map (pinned ones stay in it)
        self.threshold_s = config.continuum_pin_threshold_s
        self.estimator = ToolCallEstimator(config.continuum_default_gap_s)
        self.pins: list[Pin] = []
        self.num_pins_created = 0
        self.num_pins_expired = 0
        self._waiting: ContinuumRequestQueue | None = None

    # --- queues and victims --------------------------------------------------------------------
    def make_waiting_queue(self) -> RequestQueue:
        self._waiting = ContinuumRequestQueue()
        return self._waiting

    def make_skipped_queue(self) -> RequestQueue:
        # Skipped requests are served in plain FCFS order (only the main queue jumps warm turns).
        return FCFSRequestQueue()

    def pick_victim(self, running: list[Request]) -> Request:
        # Prefer the last running request of a job with no warm pin.
        pinned = self.pinned_job_ids()
        for r in reversed(running):
            if r.job_id is None or r.job_id not in pinned:
                return r
        return running[-1]

    # --- hooks ---------------------------------------------------------------------------------
    def on_step(self, now_s: float) -> None:
        """Release expired pins (before any allocation decision of the step)."""
        for pin in [p for p in self.pins if now_s >= p.unpin_at_s]:
            self._unpin(pin)
            self.num_pins_expired += 1
        if self._waiting is not None:
            self._waiting.set_pinned_jobs(self.pinned_job_ids())

    def on_arrival(self, request: Request, now_s: float) -> None:
        self.estimator.request_arrives(request, now_s)

    def on_finish(self, request: Request, now_s: float) -> bool:
        """Pin instead of freeing a finished non-final turn (never an aborted one)."""
        if request.status == RequestStatus.FINISHED_ABORTED:
            return False
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

    def next_event_s(self) -> float | None:
        return min(p.unpin_at_s for p in self.pins) if self.pins else None

    def pin_ttl_s(self, request: Request) -> float:
        """0 when pinning is not worth it; else twice the predicted gap, capped at the threshold."""
        predicted = self.estimator.predict_gap_s(request.job_id)
        if predicted > self.threshold_s:
            return 0.0
        return min(max(2.0 * predicted, 1e-3), self.threshold_s)

    def _unpin(self, pin: Pin) -> None:
        self.pins.remove(pin)
        self.kv.free(pin.request)
        self.requests.pop(pin.request.request_id, None)

    # --- queries -------------------------------------------------------------------------------
    def pinned_job_ids(self) -> set[str]:
        return {p.request.job_id for p in self.pins}

    def held_request_ids(self) -> set[str]:
        return {p.request.request_id for p in self.pins}

    def num_held_requests(self) -> int:
        return len(self.pins)

    def num_pinned_blocks(self) -> int:
        return sum(self.kv.num_blocks_held(p.request.request_id) for p in self.pins)

    def trace_fields(self) -> dict:
        return {"num_pinned": len(self.pins), "pinned_blocks": self.num_pinned_blocks(),
                "pinned_job_ids": sorted(self.pinned_job_ids())}
