"""The scheduler side of a KV connector (vLLM's KVConnectorBase_V1, scheduler role), as a Protocol.

A connector moves KV between this instance and somewhere else: another instance (P/D
disaggregation, simulator/cluster/pd_connectors.py) or a CPU tier (vLLM's OffloadingConnector,
scheduler/kv_offload/). The scheduler consults it exactly where vLLM 0.19.1 does:

- admission (`Scheduler.schedule`, waiting phase): `get_num_new_matched_tokens` for a request with
  no computed tokens yet (None: skip the request this step), then `update_state_after_alloc` after
  *every* successful allocation of a waiting request (with 0 external tokens for most);
- end of `schedule()`, before the scheduled tokens count as computed: `build_connector_meta`, whose
  result travels to the worker in `SchedulerOutput.kv_connector_metadata`;
- finishing (`Scheduler._free_request`): `request_finished`, which may keep the blocks alive until
  the worker reports the KV sent (`KVConnectorOutput.finished_sending`);
- a router (scheduler/prefix_lookup.py): `peek_num_matched_tokens`, read-only;
- the worker's report (`update_from_output`): `update_connector_output` first, then the scheduler
  promotes loaded requests (`finished_recving`) and frees sent ones itself.
Events are pulled by their reader (`take_events`, like `KVCacheManager.take_events`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from servesim.scheduler.kv.manager import KVCacheBlocks
    from servesim.scheduler.output import KVConnectorOutput, SchedulerOutput
    from servesim.scheduler.request import Request


class KVConnector(Protocol):
    def get_num_new_matched_tokens(self, request: Request,
                                   num_local_computed_tokens: int) -> tuple[int | None, bool]:
        """(tokens beyond the local prefix-cache hit whose KV the connector can supply, whether it
        loads them asynchronously). Asynchronous loads park the request in WAITING_FOR_REMOTE_KVS
        until the worker reports them in `finished_recving`. None for the tokens: the connector
        cannot tell yet; the request is skipped this step and asked again at the next."""
        ...

    def peek_num_matched_tokens(self, request: Request, num_local_computed_tokens: int) -> int:
        """Tokens beyond the local prefix-cache hit that this instance's own tier holds now, as
        `get_num_new_matched_tokens` would count them, changing nothing (no recency touch, no
        pending-load bookkeeping): a router's question, not part of vLLM's connector API. 0 for a
        connector whose KV lives on another instance (P/D): no router can pick it by that KV."""
        ...

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        """Called after every successful allocate_slots of a waiting request (blocks: all its blocks
        so far; num_external_tokens: the external tokens the allocation covered, often 0)."""
        ...

    def request_finished(self, request: Request,
                         block_ids: tuple[list[int], ...]) -> tuple[bool, dict[str, Any] | None]:
        """A request finished (stopped, capped or aborted); block_ids: its block table per KV cache
        group, out-of-window blocks already nulled (vLLM hands a connector without hybrid support
        group 0 only; it runs with one group). Returns (keep its blocks until the worker reports it
        in `finished_sending`, KV-transfer params for the output or None)."""
        ...

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> object | None:
        """What the worker-side connector must do for this step (loads to start, blocks to store),
        planned from the step's scheduled requests; called once at the end of every schedule()."""
        ...

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        """The worker's report of completed transfers, before the scheduler acts on it."""
        ...

    def take_events(self) -> Iterable[object]:
        """KV cache events (blocks stored in / removed from the connector's tier) since the last call."""
        ...
