"""Queuing disciplines: the order in which the gateway dispatches the requests it holds.

    fifo  arrival order.
    wfq   weighted fair queuing across tenants, self-clocked (SCFQ: S. J. Golestani, "A
          Self-Clocked Fair Queueing Scheme for Broadband Applications", IEEE INFOCOM 1994): a
          request of tenant i queued at virtual time v gets the finish tag
              F = max(F_last(i), v) + cost / weight_i
          and the smallest tag is dispatched first (ties: arrival order); v is the tag of the last
          request dispatched, and when the queue empties a busy period ends (v and every F_last
          go back to 0). cost: 1 per request (`cost: requests`, the default) or prompt_len +
          output_len (`cost: tokens`). A backlogged tenant of weight 4 beside one of weight 1
          gets 4 dispatches to 1.

A discipline registers by name in QUEUE_DISCIPLINES (gateway/registries.py); its factory takes the
params, the tenants ({name: TenantConfig}) and the config place for errors.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from servesim.simulator.gateway.defaults import DEFAULT_TENANT
from servesim.simulator.gateway.registries import QUEUE_DISCIPLINES
from servesim.traces.errors import InputError
from servesim.traces.workload import RequestSpec

COSTS = ("requests", "tokens")


@dataclass(slots=True)
class Queued:
    """A request held by the gateway (removed: it left the queue by timing out)."""

    spec: RequestSpec
    sent_s: float
    queued_s: float
    seq: int  # arrival order at the gateway
    removed: bool = False


class QueueDiscipline(Protocol):
    """The gateway's waiting room: requests in, the next to dispatch out."""

    def push(self, entry: Queued) -> None:
        """A request starts waiting."""
        ...

    def pop(self) -> Queued:
        """The next request to dispatch (the queue holds at least one live entry)."""
        ...

    def remove(self, entry: Queued) -> None:
        """A waiting request leaves without being dispatched (its queue timeout passed)."""
        ...

    def __len__(self) -> int:
        """Live requests waiting."""
        ...


class _Heap:
    """A heap of (key, seq, entry) with lazy removal: the shared body of the disciplines."""

    __slots__ = ("_heap", "_num_live")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Queued]] = []
        self._num_live = 0

    def _push_key(self, key: float, entry: Queued) -> None:
        heapq.heappush(self._heap, (key, entry.seq, entry))
        self._num_live += 1

    def _pop_entry(self) -> tuple[float, Queued]:
        while True:
            key, _seq, entry = heapq.heappop(self._heap)
            if not entry.removed:
                self._num_live -= 1
                return key, entry

    def remove(self, entry: Queued) -> None:
        entry.removed = True
        self._num_live -= 1

    def __len__(self) -> int:
        return self._num_live


class Fifo(_Heap):
    __slots__ = ()

    def __init__(self, params: dict, tenants: dict, where: str) -> None:
        super().__init__()
        if params:
            raise InputError(f"unknown parameter {sorted(params)[0]!r}", field=f"{where}.params", allowed="none")

    def push(self, entry: Queued) -> None:
        self._push_key(float(entry.seq), entry)

    def pop(self) -> Queued:
        return self._pop_entry()[1]


class WeightedFair(_Heap):
    __slots__ = ("_weights", "_by_tokens", "_virtual", "_last_finish")

    def __init__(self, params: dict, tenants: dict, where: str) -> None:
        super().__init__()
        unknown = sorted(set(params) - {"cost"})
        if unknown:
            raise InputError(f"unknown parameter {unknown[0]!r}", field=f"{where}.params.{unknown[0]}",
                             allowed="cost")
        cost = params.get("cost", "requests")
        if cost not in COSTS:
            raise InputError(f"got {cost!r}", field=f"{where}.params.cost", allowed=" | ".join(COSTS))
        self._by_tokens = cost == "tokens"
        self._weights = {name: t.weight for name, t in tenants.items()}
        self._virtual = 0.0
        self._last_finish: dict[str, float] = {}

    def tag(self, spec: RequestSpec) -> float:
        """The finish tag a request queued now gets (and its tenant's last tag becomes)."""
        tenant = spec.tenant or DEFAULT_TENANT
        cost = float(spec.prompt_len + spec.output_len) if self._by_tokens else 1.0
        finish = max(self._last_finish.get(tenant, 0.0), self._virtual) + cost / self._weights.get(tenant, 1.0)
        self._last_finish[tenant] = finish
        return finish

    def push(self, entry: Queued) -> None:
        self._push_key(self.tag(entry.spec), entry)

    def pop(self) -> Queued:
        key, entry = self._pop_entry()
        self._virtual = key
        self._end_busy_period()
        return entry

    def remove(self, entry: Queued) -> None:
        super().remove(entry)
        self._end_busy_period()

    def _end_busy_period(self) -> None:
        if not len(self):
            self._virtual = 0.0
            self._last_finish.clear()
            self._heap.clear()  # only removed entries can be left


QUEUE_DISCIPLINES.add("fifo", Fifo)
QUEUE_DISCIPLINES.add("wfq", WeightedFair)

DisciplineFactory = Callable[[dict, dict, str], QueueDiscipline]


def make_discipline(cfg, tenants: dict) -> QueueDiscipline:
    """A fresh discipline for one run from the config's QueuingConfig (unknown name: did-you-mean)."""
    factory: DisciplineFactory = QUEUE_DISCIPLINES.get(cfg.name)
    return factory(cfg.params, tenants, "gateway.queuing")
