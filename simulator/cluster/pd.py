"""Prefill/decode disaggregation's engines: `PrefillEngine` and `DecodeEngine`, Engines with a P/D
scheduler (simulator/cluster/pd_schedulers.py) and its connector (simulator/cluster/pd_connectors.py:
`RemoteDecodeConnector` on the prefill side, `RemotePrefillConnector` on the decode side). The
cluster (simulator/cluster/cluster.py) hands requests over and calls `kv_sent` / `kv_received` when
a transfer lands.

Native compiled classes (subclasses of the compiled Engine): the engine loop's calls on itself stay
vtable calls. `key_donor` stays interpreted (simulator/cluster/pd_keys.py), called through its module.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, cast

import simpy

from servesim.scheduler.interface import SchedulerInterface
from servesim.simulator.cluster import pd_keys
from servesim.simulator.cluster.pd_connectors import RemoteDecodeConnector, RemotePrefillConnector
from servesim.simulator.cluster.pd_schedulers import (
    DecodeAsyncScheduler, DecodeScheduler, PrefillAsyncScheduler, PrefillScheduler, decode_scheduler,
    prefill_scheduler,
)
from servesim.simulator.config import SimConfig
from servesim.simulator.engine import Engine, resolve_cache
from servesim.simulator.kv_offload import refuse_kv_offload
from servesim.simulator.run_planner import InFlight
from servesim.traces.workload import RequestSpec

__all__ = ["DecodeEngine", "PrefillEngine", "RemoteDecodeConnector", "RemotePrefillConnector"]


class PrefillEngine(Engine):
    """An Engine whose scheduler holds finished requests' KV until `kv_sent`."""

    def __init__(self, cfg: SimConfig, env: simpy.Environment | None = None, name: str = "engine0",
                 on_finish: Callable[[str, str | None], None] | None = None) -> None:
        refuse_kv_offload(cfg, "a P/D prefill engine's connector is the P/D one")
        # The engine's `scheduler`, typed as the P/D scheduler it is.
        self.pd_scheduler: PrefillScheduler | PrefillAsyncScheduler = prefill_scheduler(
            cfg, resolve_cache(cfg)[0], RemoteDecodeConnector())
        super().__init__(cfg, env=env, name=name, on_finish=on_finish, scheduler=_as_interface(self.pd_scheduler))
        # The clock's reading when the loop applies the last step it waited for (None: none yet).
        # While it is not before now, the loop waits for that update or applies it at this instant;
        # once the clock is past it, the update was applied (the loop applies a step at its
        # timeout's instant) and it says nothing. Its prompts finish, and are handed off, no
        # earlier (awaited_update_s_at; simulator/fastpath/pd_runs.py).
        self.awaited_update_s: float | None = None

    def _apply_oldest(self, in_flight: InFlight) -> Generator[simpy.Event, Any, None]:
        """Engine._apply_oldest, noting when the update it waits for lands (the timeout's own sum).
        Returns the base generator itself (no generator of its own to resume at each wait)."""
        end_s: float = in_flight[0][2]
        now: float = self.env.now
        self.awaited_update_s = now + (end_s - now) if end_s > now else now
        return super()._apply_oldest(in_flight)

    def awaited_update_s_at(self, now: float) -> float | None:
        """When the update the loop waits for lands, as the clock will read it; None where it
        waits for none. At the instant it applied that update, until it waits for another, it
        answers `now`: a lower bound all the same."""
        t = self.awaited_update_s
        return t if t is not None and t >= now else None

    def kv_sent(self, request_id: str) -> None:
        self.pd_scheduler.finish_sending(request_id)
        self.notify()  # freed blocks may admit a waiting prompt


class DecodeEngine(Engine):
    """An Engine whose scheduler loads prompts' KV through `connector`; the cluster calls
    `kv_received` when a transfer lands."""

    def __init__(self, cfg: SimConfig, connector: RemotePrefillConnector, env: simpy.Environment | None = None,
                 name: str = "engine0", on_finish: Callable[[str, str | None], None] | None = None) -> None:
        refuse_kv_offload(cfg, "a P/D decode engine's connector is the P/D one")
        # The engine's `scheduler`, typed as the P/D scheduler it is.
        self.pd_scheduler: DecodeScheduler | DecodeAsyncScheduler = decode_scheduler(
            cfg, resolve_cache(cfg)[0], connector)
        super().__init__(cfg, env=env, name=name, on_finish=on_finish, scheduler=_as_interface(self.pd_scheduler))
        self.connector = connector

    def submit_handed_over(self, spec: RequestSpec, prefill: Engine) -> None:
        """A request the prefill engine `prefill` finished is handed over now (Engine.submit),
        its Request taking the prefill side's prompt keys where they are this side's (key_donor)."""
        rid, factory = spec.request_id, self.requests_in
        donor = pd_keys.key_donor(prefill, self, rid)
        if donor is not None:
            factory.key_donors[rid] = donor
        self.submit(spec)
        if donor is not None:
            factory.key_donors.pop(rid, None)  # refused before it was built (admission, its client gone)

    def kv_received(self, request_id: str) -> None:
        if self.planner is not None:  # a landing is an arrival: no run may have gone past it
            self.planner.before_submit(self.env.now)
        self.pd_scheduler.mark_kv_received(request_id)
        self.notify()


def _as_interface(scheduler: PrefillScheduler | PrefillAsyncScheduler | DecodeScheduler | DecodeAsyncScheduler
                  ) -> SchedulerInterface:
    """The scheduler as the Engine takes it. A cast: mypy finds vLLM's Scheduler short of the
    Protocol on one attribute's declared type (kv_cache_manager: KVCacheManager, not the Protocol's
    KVCacheUsage: a settable attribute is invariant), which every scheduler of ours shares."""
    return cast(SchedulerInterface, scheduler)
