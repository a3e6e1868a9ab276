"""The scheduler side of a KV connector (vLLM's KVConnectorBase_V1, scheduler role), as a Protocol.

A connector moves KV between this instance and another one (P/D disaggregation). The scheduler
consults it at three points, exactly where vLLM 0.19.1 does:

- admission (`Scheduler.schedule`, waiting phase): `get_num_new_matched_tokens` for a request with
  no computed tokens yet, then `update_state_after_alloc` after *every* successful allocation of a
  waiting request (with 0 external tokens for most);
- finishing (`Scheduler._free_request`): `request_finished`, which may keep the blocks alive until
  the worker reports the KV sent (`KVConnectorOutput.finished_sending`);
- loads reported by the worker (`KVConnectorOutput.finished_recving`) are handled by the scheduler
  itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from servesim.scheduler.kv.manager import KVCacheBlocks
    from servesim.scheduler.request import Request


class KVConnector(Protocol):
    def get_num_new_matched_tokens(self, request: Request, num_local_computed_tokens: int) -> tuple[int, bool]:
        """(tokens beyond the local prefix-cache hit whose KV the connector can supply, whether it
        loads them asynchronously). Asynchronous loads park the request in WAITING_FOR_REMOTE_KVS
        until the worker reports them in `finished_recving`."""
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
