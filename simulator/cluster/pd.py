"""Prefill/decode disaggregation: the scheduler side of vLLM's KV connector, and P and D engines.

vLLM (NixlConnector, 0.19) on the decode instance: when a request that was prefilled elsewhere is
first seen in the waiting queue, the connector reports the prompt tokens not cached locally as
external tokens to be loaded asynchronously; the scheduler allocates blocks for them
(allocate_slots(num_external_computed_tokens=..., delay_cache_blocks=True)) and parks the request
in WAITING_FOR_REMOTE_KVS. When the transfer lands, the blocks are cached and the request runs
from num_computed_tokens = prompt - 1 (the last prompt token is recomputed to sample). On the
prefill instance the connector's `request_finished` keeps a finished request's blocks (vLLM's
delayed free) until the transfer completes (`finished_sending`), not at finish.

`RemotePrefillConnector` is the decode side, `RemoteDecodeConnector` the prefill side (both
implement scheduler.connector.KVConnector; the scheduler consults them where vLLM does).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from servesim.scheduler import AsyncScheduler, Scheduler
from servesim.scheduler.kv.manager import KVCacheBlocks
from servesim.scheduler.output import KVConnectorOutput, SchedulerOutput
from servesim.scheduler.request import Request, RequestStatus
from servesim.simulator.engine import Engine, resolve_cache
from servesim.simulator.kv_offload import refuse_kv_offload
from servesim.simulator.startup import resolved
from servesim.traces.workload import RequestSpec


class RemotePrefillConnector:
    """Which requests on a decode scheduler have their KV on a prefill instance."""

    def __init__(self, on_alloc: Callable[[Request, int], None]) -> None:
        self.on_alloc = on_alloc  # (request, external tokens): blocks are ready, start the transfer
        self._expected: set[str] = set()

    def expect(self, request_id: str) -> None:
        self._expected.add(request_id)

    def forget(self, request_id: str) -> None:
        self._expected.discard(request_id)

    def get_num_new_matched_tokens(self, request: Request, num_local_computed: int) -> tuple[int, bool]:
        """(external tokens, load asynchronously): the prompt tokens the decode side lacks."""
        if request.request_id not in self._expected:
            return 0, False
        n = request.num_prompt_tokens - num_local_computed
        return (n, True) if n > 0 else (0, False)

    def peek_num_matched_tokens(self, request: Request, num_local_computed_tokens: int) -> int:
        return 0  # the KV is on another instance: no tier of this one holds it

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external: int) -> None:
        if request.request_id in self._expected:
            self._expected.discard(request.request_id)  # one transfer: a preemption recomputes locally
            if num_external > 0:
                self.on_alloc(request, num_external)

    def request_finished(self, request: Request, block_ids: tuple[list[int], ...]) -> tuple[bool, None]:
        return self.delays_free(request, any(block_ids)), None

    def delays_free(self, request: Request, holds_blocks: bool) -> bool:
        """request_finished's answer from whether the request holds a block (StallAwareMixin)."""
        return False  # decode side: nothing to send, free now

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> None:
        return None  # the transfer is driven outside the step (no per-step worker metadata)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        pass

    def take_events(self) -> tuple[()]:
        return ()


class RemoteDecodeConnector:
    """The prefill instance's side (NixlConnector, kv_producer): a prompt that finished by length
    (prefill plus its first token) keeps its blocks until the decode side has read them."""

    def get_num_new_matched_tokens(self, request: Request, num_local_computed: int) -> tuple[int, bool]:
        return 0, False

    def peek_num_matched_tokens(self, request: Request, num_local_computed_tokens: int) -> int:
        return 0  # the KV is on another instance: no tier of this one holds it

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external: int) -> None:
        pass

    def request_finished(self, request: Request, block_ids: tuple[list[int], ...]) -> tuple[bool, None]:
        return self.delays_free(request, any(block_ids)), None

    def delays_free(self, request: Request, holds_blocks: bool) -> bool:
        """request_finished's answer from whether the request holds a block (StallAwareMixin)."""
        # Aborted or ignored prompts are never read: free them at once.
        return request.status == RequestStatus.FINISHED_LENGTH_CAPPED and holds_blocks

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> None:
        return None  # the transfer is driven outside the step (no per-step worker metadata)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        pass

    def take_events(self) -> tuple[()]:
        return ()


class StallAwareMixin:
    """Lets the engine loop sleep while a P/D scheduler can do nothing until an outside event.

    The engine loop runs while `has_unfinished_requests()`. A P/D scheduler can have unfinished
    requests and still nothing to run: a decode side whose requests all wait for KV (or for
    blocks such requests hold), a prefill side whose pool is full of finished prompts' KV not yet
    read. A step that scheduled nothing with nothing running repeats identically until an outside
    event (a new request, a landed or finished transfer), so until then the scheduler reports no
    runnable work and the engine sleeps; the cluster wakes it, and closes P/D engines only when
    every request is done (a closed engine would stop at the first stall).
    """

    _stalled = False
    # A prefill step does what the vLLM bulk decode path does not replay (delayed frees, stalls):
    # macro-steps never apply (SchedulerCapabilities.decode_runs). The decode side names its own.
    decode_runs: ClassVar[str | None] = None

    @property
    def stalled(self) -> bool:
        """The last schedule ran nothing with nothing running: only an outside event wakes it."""
        return self._stalled

    def schedule(self, now_s: float | None = None):
        out = super().schedule(now_s)
        self._stalled = out.total_num_scheduled_tokens == 0 and not self.running
        return out

    def has_unfinished_requests(self) -> bool:
        return not self._stalled and super().has_unfinished_requests()

    def _connector_finished(self, request: Request) -> bool:
        """Scheduler._connector_finished without building the finished request's block table: a
        P/D connector reads no more of it than whether any group holds a block (delays_free), which
        is whether the table has a non-empty group (KVCacheManager.num_blocks_held counts the same
        lists get_block_ids copies). Every P/D request finishes on both sides."""
        kvm = self.kv_cache_manager
        kvm.coordinator.remove_skipped_blocks(request.request_id, request.num_tokens)
        return self.connector.delays_free(request, kvm.num_blocks_held(request.request_id) > 0)

    def add_request(self, request: Request, now_s: float | None = None) -> None:
        self._stalled = False
        super().add_request(request, now_s)


class DecodeSchedulerMixin(StallAwareMixin):
    """A decode-side scheduler: set `connector` to a RemotePrefillConnector."""

    # Between hand-offs and landings its steps are vLLM's plain decode steps, the parked requests
    # passed over (scheduler/bulk/pd.py); a run's schedules leave `_stalled` False, as each of
    # them would (a run needs running requests: a stalled schedule had none, nor has any since).
    decode_runs: ClassVar[str | None] = "pd_decode"

    def mark_kv_received(self, request_id: str) -> None:
        self._stalled = False
        super().mark_kv_received(request_id)


class PrefillSchedulerMixin(StallAwareMixin):
    """A prefill-side scheduler: set `connector` to a RemoteDecodeConnector."""

    def finish_sending(self, request_id: str) -> None:
        """The decode side has the KV (or will never read it): the worker reports the send finished."""
        request = self.requests.get(request_id)
        if request is not None and request.is_finished():
            self.mark_kv_sent(request_id)
            self._stalled = False


_CLASSES: dict[tuple[type, type], type] = {}


def _pd_scheduler(mixin: type, cfg, cache):
    cfg = resolved(cfg)  # max_model_len filled in from the model when None
    base = AsyncScheduler if cfg.scheduler.async_scheduling else Scheduler  # as make_scheduler picks
    cls = _CLASSES.get((mixin, base))
    if cls is None:
        name = mixin.__name__.replace("SchedulerMixin", "") + base.__name__
        cls = _CLASSES[(mixin, base)] = type(name, (mixin, base), {})
    return cls(cfg.scheduler, cache)


class PrefillEngine(Engine):
    """An Engine whose scheduler holds finished requests' KV until `kv_sent`."""

    def __init__(self, cfg, **kwargs) -> None:
        refuse_kv_offload(cfg, "a P/D prefill engine's connector is the P/D one")
        super().__init__(cfg, scheduler=_pd_scheduler(PrefillSchedulerMixin, cfg, resolve_cache(cfg)[0]), **kwargs)
        self.scheduler.connector = RemoteDecodeConnector()
        # The clock's reading when the loop applies the last step it waited for (None: none yet).
        # While it is not before now, the loop waits for that update or applies it at this instant;
        # once the clock is past it, the update was applied (the loop applies a step at its
        # timeout's instant) and it says nothing. Its prompts finish, and are handed off, no
        # earlier (awaited_update_s_at; simulator/fastpath/pd_runs.py).
        self.awaited_update_s: float | None = None

    def _apply_oldest(self, in_flight):
        """Engine._apply_oldest, noting when the update it waits for lands (the timeout's own sum).
        Returns the base generator itself (no generator of its own to resume at each wait)."""
        end_s, now = in_flight[0][2], self.env.now
        self.awaited_update_s = now + (end_s - now) if end_s > now else now
        return super()._apply_oldest(in_flight)

    def awaited_update_s_at(self, now: float) -> float | None:
        """When the update the loop waits for lands, as the clock will read it; None where it
        waits for none. At the instant it applied that update, until it waits for another, it
        answers `now`: a lower bound all the same."""
        t = self.awaited_update_s
        return t if t is not None and t >= now else None

    def kv_sent(self, request_id: str) -> None:
        self.scheduler.finish_sending(request_id)
        self.notify()  # freed blocks may admit a waiting prompt


class DecodeEngine(Engine):
    """An Engine whose scheduler loads prompts' KV through `connector`; the cluster calls
    `kv_received` when a transfer lands."""

    def __init__(self, cfg, connector: RemotePrefillConnector, **kwargs) -> None:
        refuse_kv_offload(cfg, "a P/D decode engine's connector is the P/D one")
        super().__init__(cfg, scheduler=_pd_scheduler(DecodeSchedulerMixin, cfg, resolve_cache(cfg)[0]), **kwargs)
        self.scheduler.connector = connector
        self.connector = connector

    def submit_handed_over(self, spec: RequestSpec, prefill: Engine) -> None:
        """A request the prefill engine `prefill` finished is handed over now (Engine.submit),
        its Request taking the prefill side's prompt keys where they are this side's (key_donor)."""
        rid, factory = spec.request_id, self.requests_in
        donor = key_donor(prefill, self, rid)
        if donor is not None:
            factory.key_donors[rid] = donor
        self.submit(spec)
        if donor is not None:
            factory.key_donors.pop(rid, None)  # refused before it was built (admission, its client gone)

    def kv_received(self, request_id: str) -> None:
        if self.planner is not None:  # a landing is an arrival: no run may have gone past it
            self.planner.before_submit(self.env.now)
        self.scheduler.mark_kv_received(request_id)
        self.notify()


def key_donor(prefill: Engine, decode: Engine, request_id: str) -> Request | None:
    """The prefill side's Request of a request handed over to `decode`, where the decode side's
    Request would build the very same key plan and prompt-block keys (Request.take_prompt_keys),
    else None (build them). The same spec reaches both sides but for output_len, so the prompt's
    provenance and extra keys (LoRA id) are the same; the keys are the same where both sides key by
    provenance (not by hashing ids), both hash blocks of one size, the prefill side keyed its
    Request with a plan (key_root: a hasher attached, blocks of more than one token; no multimodal
    input), and both executors name the same output id stream (a plan's last run). The prefill
    side keeps its finished Request until the decode side has read its KV (RemoteDecodeConnector)."""
    donor = prefill.scheduler.requests.get(request_id)
    if donor is None or donor.key_root is None:
        return None
    p_in, d_in = prefill.requests_in, decode.requests_in
    if not (p_in.keys_from_provenance and d_in.keys_from_provenance):
        return None
    if decode.scheduler.block_hasher is None or prefill.scheduler.block_size != decode.scheduler.block_size:
        return None
    if p_in.executor.output_token_source(request_id) != d_in.executor.output_token_source(request_id):
        return None
    return donor
