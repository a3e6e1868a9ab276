"""The engine's bookkeeping of each step and its liveness watchdog (mixed into Engine).

What happens around a scheduled step: its metrics row and step-trace record when scheduled
(`_on_schedule`), its output applied with finishes, prefix-cache stats and progress when its GPU
work ends (`_on_update`), client deadlines and rejections, and the watchdog that stops a run
making no progress (docs/LIVENESS.md). The state is the engine's own (simulator/engine.py);
the loop, macro-steps and an outside driver (engine_rank.py) call these alike.

The engine's mixins form one chain (Engine -> MacroStepMixin -> DeferredRunMixin ->
FinishRunMixin -> EngineRankMixin -> EngineStepsMixin -> EngineState, which declares the state),
each method typed `self: Engine`: mypyc compiles single inheritance only, against the class the
methods run on (tools/compile_simulator.py).
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Callable, Sequence
from typing import IO, TYPE_CHECKING

import simpy

from servesim.scheduler import CacheConfig, RequestStatus
from servesim.scheduler.interface import SchedulerInterface
from servesim.scheduler.oracle_trace import finish_record, step_record
from servesim.scheduler.output import ModelRunnerOutput, SchedulerOutput
from servesim.simulator.client import Clients
from servesim.simulator.config import SimConfig
from servesim.simulator.cost_model.cpu_overhead import CpuOverheadConfig
from servesim.simulator.executor import Executor, SimExecutor
from servesim.simulator.frontend import FrontendConfig
from servesim.simulator.kv_capacity import KvCapacity
from servesim.simulator.liveness import Admission, StallError, diagnose
from servesim.simulator.metrics import MetricsCollector
from servesim.simulator.pipeline_clock import PipelineClock
from servesim.traces.workload import Workload

if TYPE_CHECKING:
    from servesim.scheduler.bulk.interface import DecodeRuns
    from servesim.simulator.deferred_run import DeferredRun
    from servesim.simulator.engine import Engine, InFlight


class EngineState:
    """The engine's state, declared once for the whole mixin chain: each attribute's type here,
    its meaning where Engine.__init__ sets it (a compiled class's attributes are these)."""

    cfg: SimConfig
    workload: Workload | None
    name: str
    on_finish: Callable[[str, str | None], None] | None
    cache: CacheConfig
    kv_capacity: KvCapacity | None
    scheduler: SchedulerInterface
    executor: Executor
    _sim: SimExecutor | None
    _pipeline: PipelineClock | None
    _keys_from_provenance: bool
    admission: Admission
    cpu: CpuOverheadConfig
    env: simpy.Environment
    _frontend: FrontendConfig | None
    _outputs_delayed: bool
    clients: Clients
    metrics: MetricsCollector
    step_trace: IO[str] | None
    progress: Callable[[float, int], None] | None
    _wake: simpy.Event | None
    _arrived_since_step: list[str]
    _all_arrived: bool
    _num_done: int
    num_steps: int
    prefix_hits: int
    prefix_queries: int
    _gpu_free_at: float
    _next_arrival_s: float
    _arrival_bound: Callable[[int], float] | None
    _macro_until_s: float
    _collides: Callable[[Sequence[float]], int] | None
    _deferred: DeferredRun | None
    _in_flight: InFlight
    num_deferred_runs: int
    num_deferred_routed: int
    num_preemptions: int
    _max_steps_idle: int
    _max_s_idle: float
    _stall_step: int
    _stall_s: float
    _preemptions_at_progress: int
    _timeout_s: float | None
    _deadlines: list[tuple[float, int, str]]
    _num_submitted: int
    _decode_runs: DecodeRuns | None
    macro_fallback_reason: str | None
    _decode_run_extra: int
    _commuting_arrivals: bool
    num_macro_steps: int
    num_macro_runs: int
    num_runs_past_arrival: int
    num_bulk_finishes: int


class EngineStepsMixin(EngineState):
    def _on_schedule(self: Engine, so: SchedulerOutput, now: float) -> tuple[dict | None, int]:
        """Bookkeeping of a step just scheduled: (its step-trace record or None, its steps row)."""
        m = self.metrics.requests
        for nr in so.scheduled_new_reqs:
            if m[nr.req_id].first_scheduled_s is None:
                m[nr.req_id].first_scheduled_s = now
        for rid in so.preempted_req_ids:
            m[rid].num_preemptions += 1
        self.num_preemptions += len(so.preempted_req_ids)
        rec = None
        if self.step_trace is not None:
            rec = step_record(self.num_steps, self._arrived_since_step, so, self.scheduler)
        self._arrived_since_step = []
        sched = self.scheduler
        # A step's decode tokens: one token (and its drafts) of a cached request past its prompt
        # that was not just resumed; every other scheduled token is a prefill token.
        num_new, spec, cached = so.num_scheduled_tokens, so.scheduled_spec_decode_tokens, so.scheduled_cached_reqs
        requests, resumed = sched.requests, cached.resumed_req_ids
        shape_decode = 0
        for rid, computed in zip(cached.req_ids, cached.num_computed_tokens):
            if rid not in resumed and computed >= requests[rid].num_prompt_tokens:
                n = num_new[rid]
                if n - len(spec.get(rid, ())) == 1:
                    shape_decode += n
        shape_prefill = sum(num_new.values()) - shape_decode
        running, waiting = sched.get_request_counts()
        row = self.metrics.steps.append(self.num_steps, now, len(so.num_scheduled_tokens), shape_prefill,
                                        shape_decode, sched.kv_cache_manager.usage, running, waiting,
                                        len(so.preempted_req_ids))
        self.num_steps += 1
        return rec, row

    def _on_update(self: Engine, so: SchedulerOutput, mro: ModelRunnerOutput, rec: dict | None, row: int,
                   now: float | None = None) -> None:
        """Apply a step's output at `now` (default: the clock); `row` is its steps row."""
        if now is None:
            now = self.env.now
        eco = self.scheduler.update_from_output(so, mro, now_s=now)
        outputs = eco.outputs
        if outputs:
            self._mark_progress(now)
            self.metrics.on_step_outputs(outputs, now)  # token times first: a finish reads none of them
            for out in outputs:
                if out.finish_reason is not None:
                    self._finished(out.request_id, now, out.finish_reason, out.num_cached_tokens)
        ps = eco.scheduler_stats.prefix_cache_stats
        self.prefix_hits += ps.hits
        self.prefix_queries += ps.queries
        self.metrics.steps.set_update(row, now, ps.hits, ps.queries)  # duration: schedule to output applied
        if rec is not None:
            sampled = {rid: t[0] for rid, t in zip(mro.req_ids, mro.sampled_token_ids) if t}
            finish_record(rec, sampled, [o.request_id for o in eco.outputs if o.finish_reason is not None],
                          eco.scheduler_stats)
            self.step_trace.write(json.dumps(rec) + "\n")
        if self.progress is not None and self.num_steps % 256 == 0:
            self.progress(now, self._num_done)

    def _expire_deadlines(self: Engine, now: float) -> None:
        """Clients whose deadline passed disconnect; the server aborts their requests (vLLM's
        abort between engine steps: blocks are freed, the request never runs again)."""
        while self._deadlines and self._deadlines[0][0] <= now:
            _, _, rid = heapq.heappop(self._deadlines)
            if self.scheduler.finish_requests([rid], RequestStatus.FINISHED_ABORTED, now_s=now):
                self.metrics.on_timeout(rid)
                self._finished_elsewhere(rid)

    def _finished_elsewhere(self: Engine, request_id: str) -> None:
        """A client gave up: the request is done for the run (and that is progress)."""
        self._num_done += 1
        self.clients.on_done()
        self._mark_progress(self.env.now)
        if self.on_finish is not None:
            self.on_finish(request_id, "abort")

    def _rejected(self: Engine, request_id: str, reason: str) -> None:
        self.metrics.on_reject(request_id, reason)
        self._num_done += 1
        self.clients.on_done()
        self._mark_progress(self.env.now)
        if self.on_finish is not None:
            self.on_finish(request_id, None)

    # --- liveness watchdog -----------------------------------------------------------------------
    def _mark_progress(self: Engine, now: float) -> None:
        """Something advanced (a token, a finish, a rejection): restart the watchdog's window. The
        window only moves forward: a run may apply an update due after an arrival before that
        arrival's rejection is marked (macro_step.py), and stepping marks them in time order."""
        self._stall_step = self.num_steps + self._max_steps_idle
        self._stall_s = max(self._stall_s, now + self._max_s_idle)
        self._preemptions_at_progress = self.num_preemptions

    def _stall(self: Engine, now: float) -> None:
        live = self.cfg.liveness
        steps = self.num_steps - (self._stall_step - live.max_steps_without_progress)
        since = now - (self._stall_s - live.max_sim_s_without_progress)
        why = f"no progress for {steps} steps and {since:.1f} simulated s"
        self.raise_stall(why, "Limits: liveness.max_steps_without_progress="
                         f"{live.max_steps_without_progress}, liveness.max_sim_s_without_progress="
                         f"{live.max_sim_s_without_progress:g}.")

    def raise_stall(self: Engine, why: str, limit: str = "") -> None:
        raise StallError(diagnose(self.name, self.scheduler, why, self.num_preemptions - self._preemptions_at_progress,
                                  limit), field="liveness")

    def _finished(self: Engine, request_id: str, now: float, reason: str | None, num_cached: int) -> None:
        self.metrics.on_finish(request_id, now, reason, num_cached)
        self._num_done += 1
        self.clients.on_done()
        if self.on_finish is not None:
            self.on_finish(request_id, reason)

