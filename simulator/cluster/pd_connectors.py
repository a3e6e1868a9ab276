"""The scheduler side of vLLM's KV connector for P/D disaggregation (NixlConnector, 0.19).

On the decode instance (`RemotePrefillConnector`), when a request that was prefilled elsewhere is
first seen in the waiting queue, the connector reports the prompt tokens not cached locally as
external tokens to be loaded asynchronously; the scheduler allocates blocks for them
(allocate_slots(num_external_computed_tokens=..., delay_cache_blocks=True)) and parks the request
in WAITING_FOR_REMOTE_KVS. When the transfer lands, the blocks are cached and the request runs
from num_computed_tokens = prompt - 1 (the last prompt token is recomputed to sample). On the
prefill instance (`RemoteDecodeConnector`) `request_finished` keeps a finished request's blocks
(vLLM's delayed free) until the transfer completes (`finished_sending`), not at finish.

Both implement scheduler.connector.KVConnector (the scheduler consults them where vLLM does); what
neither side does (no per-step worker metadata, no events, nothing held on this instance's own
tiers) is written once, in `PDConnector`. Native compiled classes: the scheduler consults its
connector for every waiting request it admits and every request that finishes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from servesim.scheduler.request import Request, RequestStatus

if TYPE_CHECKING:
    from servesim.scheduler.kv.manager import KVCacheBlocks
    from servesim.scheduler.output import KVConnectorOutput, SchedulerOutput


class PDConnector:
    """What both P/D sides answer alike; a side overrides what it does (`delays_free` and, on the
    decode side, the admission pair)."""

    def get_num_new_matched_tokens(self, request: Request, num_local_computed_tokens: int) -> tuple[int, bool]:
        return 0, False

    def peek_num_matched_tokens(self, request: Request, num_local_computed_tokens: int) -> int:
        return 0  # the KV is on another instance: no tier of this one holds it

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        pass

    def request_finished(self, request: Request, block_ids: tuple[list[int], ...]) -> tuple[bool, None]:
        return self.delays_free(request, any(block_ids)), None

    def delays_free(self, request: Request, holds_blocks: bool) -> bool:
        """request_finished's answer from whether the request holds a block (the P/D schedulers ask
        this, not request_finished: pd_schedulers.connector_finished)."""
        return False  # nothing to send: free now

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> None:
        return None  # the transfer is driven outside the step (no per-step worker metadata)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        pass

    def take_events(self) -> tuple[()]:
        return ()


class RemotePrefillConnector(PDConnector):
    """Which requests on a decode scheduler have their KV on a prefill instance."""

    def __init__(self, on_alloc: Callable[[Request, int], None]) -> None:
        self.on_alloc = on_alloc  # (request, external tokens): blocks are ready, start the transfer
        self._expected: set[str] = set()

    def expect(self, request_id: str) -> None:
        self._expected.add(request_id)

    def forget(self, request_id: str) -> None:
        self._expected.discard(request_id)

    def get_num_new_matched_tokens(self, request: Request, num_local_computed_tokens: int) -> tuple[int, bool]:
        """(external tokens, load asynchronously): the prompt tokens the decode side lacks."""
        if request.request_id not in self._expected:
            return 0, False
        n = request.num_prompt_tokens - num_local_computed_tokens
        return (n, True) if n > 0 else (0, False)

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        if request.request_id in self._expected:
            self._expected.discard(request.request_id)  # one transfer: a preemption recomputes locally
            if num_external_tokens > 0:
                self.on_alloc(request, num_external_tokens)


class RemoteDecodeConnector(PDConnector):
    """The prefill instance's side (NixlConnector, kv_producer): a prompt that finished by length
    (prefill plus its first token) keeps its blocks until the decode side has read them."""

    def delays_free(self, request: Request, holds_blocks: bool) -> bool:
        # Aborted or ignored prompts are never read: free them at once.
        return request.status == RequestStatus.FINISHED_LENGTH_CAPPED and holds_blocks
