"""The P/D schedulers: vLLM's Scheduler and AsyncScheduler with a P/D connector set, and aware of
stalls, one class per side and scheduling mode (PrefillScheduler, PrefillAsyncScheduler,
DecodeScheduler, DecodeAsyncScheduler).

A stall: the engine loop runs while `has_unfinished_requests()`. A P/D scheduler can have
unfinished requests and still nothing to run: a decode side whose requests all wait for KV (or for
blocks such requests hold), a prefill side whose pool is full of finished prompts' KV not yet read.
A step that scheduled nothing with nothing running repeats identically until an outside event (a
new request, a landed or finished transfer), so until then the scheduler reports no runnable work
and the engine sleeps; the cluster wakes it, and closes P/D engines only when every request is done
(a closed engine would stop at the first stall).

Why four explicit classes: they are native compiled classes, so that the compiled scheduler's calls
on itself (a request's update, a finish, the stats at every step) stay vtable calls and the P/D
methods run compiled. mypyc compiles a class whose one native base is written in its source: not a
class built at run time from a mixin and a base; nor can a trait carry the overrides (mypyc wants
the native base first among the bases, so a trait comes after it in the MRO and its methods never
override the base's). So the behaviour lives once, in `StallGate` (the stall bookkeeping, a small
object each scheduler owns) and the functions below; each class only wires its overrides to them,
the same few lines in the four. The async two are the one chain three deep below Scheduler
(tests/test_code_shape.py allows them for this reason).
"""

from __future__ import annotations

from typing import ClassVar

from servesim.scheduler.async_scheduler import AsyncScheduler
from servesim.scheduler.config import CacheConfig, SchedulerConfig
from servesim.scheduler.output import SchedulerOutput
from servesim.scheduler.request import Request
from servesim.scheduler.scheduler import Scheduler
from servesim.simulator.cluster.pd_connectors import PDConnector, RemoteDecodeConnector, RemotePrefillConnector
from servesim.simulator.config import SimConfig
from servesim.simulator.startup import resolved


class StallGate:
    """Whether a P/D scheduler's last schedule ran nothing with nothing running (module docstring):
    then only an outside event (`open`) gives it work again."""

    def __init__(self) -> None:
        self.stalled = False

    def after_schedule(self, out: SchedulerOutput, running: list[Request]) -> SchedulerOutput:
        self.stalled = out.total_num_scheduled_tokens == 0 and not running
        return out

    def open(self) -> None:
        """An outside event: a new request, a landed transfer, a finished send."""
        self.stalled = False


def connector_finished(sched: Scheduler, connector: PDConnector | None, request: Request) -> bool:
    """Scheduler._connector_finished without building the finished request's block table: a P/D
    connector reads no more of it than whether any group holds a block (delays_free), which is
    whether the table has a non-empty group (KVCacheManager.num_blocks_held counts the same lists
    get_block_ids copies). Every P/D request finishes on both sides."""
    assert connector is not None  # the scheduler asks only while a connector is set (its `connector`)
    kvm = sched.kv_cache_manager
    kvm.coordinator.remove_skipped_blocks(request.request_id, request.num_tokens)
    return connector.delays_free(request, kvm.num_blocks_held(request.request_id) > 0)


def finish_sending(sched: Scheduler, gate: StallGate, request_id: str) -> None:
    """The decode side has the KV (or will never read it): the worker reports the send finished."""
    request = sched.requests.get(request_id)
    if request is not None and request.is_finished():
        sched.mark_kv_sent(request_id)
        gate.open()


# In each class, `pd_connector` is `connector` (set together, once, at construction), typed as
# the P/D connector it is; `decode_runs` is what SchedulerCapabilities declares. A prefill step does
# what the vLLM bulk decode path does not replay (delayed frees, stalls): no macro-steps. Between
# hand-offs and landings a decode side's steps are vLLM's plain decode steps, the parked requests
# passed over (scheduler/bulk/pd.py); a run's schedules leave the gate open, as each of them would
# (a run needs running requests: a stalled schedule had none, nor has any since).

class PrefillScheduler(Scheduler):
    """A prefill-side scheduler (sync scheduling): finished prompts' KV stays until sent."""

    decode_runs: ClassVar[str | None] = None

    def __init__(self, scheduler_config: SchedulerConfig, cache_config: CacheConfig,
                 connector: RemoteDecodeConnector | None = None) -> None:
        super().__init__(scheduler_config, cache_config)
        self.connector = self.pd_connector = connector
        self.gate = StallGate()

    @property
    def stalled(self) -> bool:
        return self.gate.stalled

    def schedule(self, now_s: float | None = None) -> SchedulerOutput:
        return self.gate.after_schedule(super().schedule(now_s), self.running)

    def has_unfinished_requests(self) -> bool:
        return not self.gate.stalled and super().has_unfinished_requests()

    def add_request(self, request: Request, now_s: float | None = None) -> None:
        self.gate.open()
        super().add_request(request, now_s)

    def _connector_finished(self, request: Request) -> bool:
        return connector_finished(self, self.pd_connector, request)

    def finish_sending(self, request_id: str) -> None:
        finish_sending(self, self.gate, request_id)


class PrefillAsyncScheduler(AsyncScheduler):
    """PrefillScheduler with async scheduling."""

    decode_runs: ClassVar[str | None] = None

    def __init__(self, scheduler_config: SchedulerConfig, cache_config: CacheConfig,
                 connector: RemoteDecodeConnector | None = None) -> None:
        super().__init__(scheduler_config, cache_config)
        self.connector = self.pd_connector = connector
        self.gate = StallGate()

    @property
    def stalled(self) -> bool:
        return self.gate.stalled

    def schedule(self, now_s: float | None = None) -> SchedulerOutput:
        return self.gate.after_schedule(super().schedule(now_s), self.running)

    def has_unfinished_requests(self) -> bool:
        return not self.gate.stalled and super().has_unfinished_requests()

    def add_request(self, request: Request, now_s: float | None = None) -> None:
        self.gate.open()
        super().add_request(request, now_s)

    def _connector_finished(self, request: Request) -> bool:
        return connector_finished(self, self.pd_connector, request)

    def finish_sending(self, request_id: str) -> None:
        finish_sending(self, self.gate, request_id)


class DecodeScheduler(Scheduler):
    """A decode-side scheduler (sync scheduling): prompts' KV loads through its connector."""

    decode_runs: ClassVar[str | None] = "pd_decode"

    def __init__(self, scheduler_config: SchedulerConfig, cache_config: CacheConfig,
                 connector: RemotePrefillConnector | None = None) -> None:
        super().__init__(scheduler_config, cache_config)
        self.connector = self.pd_connector = connector
        self.gate = StallGate()

    @property
    def stalled(self) -> bool:
        return self.gate.stalled

    def schedule(self, now_s: float | None = None) -> SchedulerOutput:
        return self.gate.after_schedule(super().schedule(now_s), self.running)

    def has_unfinished_requests(self) -> bool:
        return not self.gate.stalled and super().has_unfinished_requests()

    def add_request(self, request: Request, now_s: float | None = None) -> None:
        self.gate.open()
        super().add_request(request, now_s)

    def _connector_finished(self, request: Request) -> bool:
        return connector_finished(self, self.pd_connector, request)

    def mark_kv_received(self, request_id: str) -> None:
        self.gate.open()
        super().mark_kv_received(request_id)


class DecodeAsyncScheduler(AsyncScheduler):
    """DecodeScheduler with async scheduling."""

    decode_runs: ClassVar[str | None] = "pd_decode"

    def __init__(self, scheduler_config: SchedulerConfig, cache_config: CacheConfig,
                 connector: RemotePrefillConnector | None = None) -> None:
        super().__init__(scheduler_config, cache_config)
        self.connector = self.pd_connector = connector
        self.gate = StallGate()

    @property
    def stalled(self) -> bool:
        return self.gate.stalled

    def schedule(self, now_s: float | None = None) -> SchedulerOutput:
        return self.gate.after_schedule(super().schedule(now_s), self.running)

    def has_unfinished_requests(self) -> bool:
        return not self.gate.stalled and super().has_unfinished_requests()

    def add_request(self, request: Request, now_s: float | None = None) -> None:
        self.gate.open()
        super().add_request(request, now_s)

    def _connector_finished(self, request: Request) -> bool:
        return connector_finished(self, self.pd_connector, request)

    def mark_kv_received(self, request_id: str) -> None:
        self.gate.open()
        super().mark_kv_received(request_id)


def prefill_scheduler(cfg: SimConfig, cache: CacheConfig,
                      connector: RemoteDecodeConnector | None) -> PrefillScheduler | PrefillAsyncScheduler:
    """The prefill side's scheduler for `cfg` (sync or async, as make_scheduler picks)."""
    cfg = resolved(cfg)  # max_model_len filled in from the model when None
    if cfg.scheduler.async_scheduling:
        return PrefillAsyncScheduler(cfg.scheduler, cache, connector)
    return PrefillScheduler(cfg.scheduler, cache, connector)


def decode_scheduler(cfg: SimConfig, cache: CacheConfig,
                     connector: RemotePrefillConnector | None) -> DecodeScheduler | DecodeAsyncScheduler:
    """The decode side's scheduler for `cfg` (sync or async, as make_scheduler picks)."""
    cfg = resolved(cfg)
    if cfg.scheduler.async_scheduling:
        return DecodeAsyncScheduler(cfg.scheduler, cache, connector)
    return DecodeScheduler(cfg.scheduler, cache, connector)
