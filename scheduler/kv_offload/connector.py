"""The OffloadingConnector's scheduler side (vLLM 0.19.1, vllm/distributed/kv_transfer/kv_connector/
v1/offloading/scheduler.py): KV blocks go to a CPU tier as they are computed and come back from it
as an asynchronous load when a waiting request's prefix is there but no longer on the GPU.

Offload blocks are `block_size_factor` GPU blocks; an offload block is named by the prefix-cache hash
of its last GPU block. What it decides, and when:
- `get_num_new_matched_tokens` (admission): touches every full offload block of the request, then
  looks up the ones past the GPU hit; a hit of at least one offload block is loaded asynchronously
  (the request waits in WAITING_FOR_REMOTE_KVS), unless some of those blocks are already being
  loaded for another request (answer None: ask again next step).
- `update_state_after_alloc`: the load's CPU blocks (pinned) and GPU blocks (those past the GPU hit).
- `build_connector_meta` (end of schedule()): every scheduled request's newly completed offload blocks
  (by the tokens computed once this step runs) are stored, those the tier lacks, in order, with room
  made by eviction; a store that cannot get room is skipped for good. Preempted requests' stores are
  flushed (marked complete now: the worker waits for them before the step).
- `update_connector_output`: finished_sending completes a finished request's stores (the worker
  reports a request only once it finished and its stores all completed), finished_recving its load.
- `request_finished`: a request with stores in flight keeps its GPU blocks until finished_sending.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import TYPE_CHECKING, Any

from servesim.scheduler.kv_offload.manager import CPUOffloadingManager, OffloadingEvent

if TYPE_CHECKING:
    from servesim.scheduler.kv.manager import KVCacheBlocks
    from servesim.scheduler.output import KVConnectorOutput, SchedulerOutput
    from servesim.scheduler.request import Request


@dataclass(slots=True)
class OffloadTransfer:
    """One job of the worker (vLLM's TransferSpec of a GPULoadStoreSpec and a CPULoadStoreSpec)."""

    gpu_block_ids: list[int]
    cpu_block_ids: list[int]


@dataclass(slots=True)
class OffloadingConnectorMetadata:
    reqs_to_load: dict[str, OffloadTransfer] = field(default_factory=dict)
    reqs_to_store: dict[str, OffloadTransfer] = field(default_factory=dict)
    reqs_to_flush: set[str] = field(default_factory=set)  # preempted this step


class OffloadingConnectorScheduler:
    """Implements the KVConnector protocol (scheduler/connector.py)."""

    def __init__(self, gpu_block_size: int, block_size_factor: int, manager: CPUOffloadingManager,
                 enable_prefix_caching: bool = True) -> None:
        self.gpu_block_size = gpu_block_size
        self.block_size_factor = block_size_factor
        self.offloaded_block_size = gpu_block_size * block_size_factor
        self.manager = manager
        self._requests: dict[str, Request] = {}
        self._request_block_ids: dict[str, list[int]] = {}  # GPU block ids per request, in order
        self._reqs_to_load: dict[str, OffloadTransfer] = {}  # for the current step
        # Offload blocks are stored in order: index of the next one to store.
        self._next_stored_block_idx: dict[str, int] = {}
        # With GPU prefix caching, hashes being loaded (another request needing them waits).
        self._blocks_being_loaded: set[bytes] | None = set() if enable_prefix_caching else None
        # A request stays a key once it stored anything (even after a flush emptied its set):
        # request_finished then holds its blocks until the worker reports it.
        self._reqs_being_stored: dict[str, set[bytes]] = {}
        self._reqs_being_loaded: dict[str, set[bytes]] = {}

    def _get_block_hashes(self, req: Request, start_idx: int = 0, end_idx: int | None = None) -> Iterator[bytes]:
        """Hashes of offload blocks start_idx .. end_idx - 1 (an end of 0 means "to the end", as vLLM)."""
        factor = self.block_size_factor
        return islice(req.block_hashes, factor * start_idx + factor - 1, factor * end_idx if end_idx else None,
                      factor)

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        self.manager.touch(self._get_block_hashes(request))
        num_hit_tokens, start, hits = self._lookup(request, num_computed_tokens)
        if num_hit_tokens == 0:
            return 0, False
        if self._blocks_being_loaded:
            if any(h in self._blocks_being_loaded
                   for h in self._get_block_hashes(request, start_idx=start, end_idx=start + hits)):
                return None, False  # wait until the other load lands
        return num_hit_tokens, True

    def _lookup(self, request: Request, num_computed_tokens: int) -> tuple[int, int, int]:
        """(tokens the tier would load past num_computed_tokens, the first offload block looked up,
        offload blocks hit from there); 0 tokens when less than one offload block would load."""
        num_blocks = request.num_tokens // self.offloaded_block_size
        assert len(request.block_hashes) // self.block_size_factor == num_blocks
        full_block_tokens = self.offloaded_block_size * num_blocks
        if full_block_tokens - num_computed_tokens < self.offloaded_block_size:
            return 0, 0, 0  # less than one offload block could be loaded
        start = num_computed_tokens // self.offloaded_block_size
        hits = self.manager.lookup(self._get_block_hashes(request, start_idx=start))
        num_hit_tokens = self.offloaded_block_size * (start + hits) - num_computed_tokens
        if hits == 0 or num_hit_tokens < self.offloaded_block_size:
            return 0, start, hits
        return num_hit_tokens, start, hits

    def peek_num_matched_tokens(self, request: Request, num_local_computed_tokens: int) -> int:
        """get_num_new_matched_tokens' count without its touch; blocks another request is loading
        count (they are on their way to the GPU: vLLM's answer would be to wait a step)."""
        return self._lookup(request, num_local_computed_tokens)[0]

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        rid = request.request_id
        self._requests[rid] = request
        self._request_block_ids[rid] = []  # filled from the scheduler output (build_connector_meta)
        if num_external_tokens == 0:
            return
        group = blocks.blocks[0]
        num_computed_gpu_blocks = sum(b.block_hash is not None for b in group)
        num_computed_tokens = num_computed_gpu_blocks * self.gpu_block_size
        full_block_tokens = num_computed_tokens + num_external_tokens
        assert full_block_tokens % self.offloaded_block_size == 0
        assert num_external_tokens == (len(group) - num_computed_gpu_blocks) * self.gpu_block_size
        start = num_computed_tokens // self.offloaded_block_size
        num_blocks = full_block_tokens // self.offloaded_block_size
        assert len(request.block_hashes) // self.block_size_factor >= num_blocks
        hashes = list(self._get_block_hashes(request, start_idx=start, end_idx=num_blocks))
        cpu_ids = self.manager.prepare_load(hashes)
        gpu_ids = [b.block_id for b in group[num_computed_gpu_blocks:]]
        self._reqs_to_load[rid] = OffloadTransfer(gpu_ids, cpu_ids)
        being_loaded = self._reqs_being_loaded.setdefault(rid, set())
        being_loaded.update(hashes)
        self._next_stored_block_idx[rid] = num_blocks
        if self._blocks_being_loaded is not None:
            self._blocks_being_loaded.update(being_loaded)

    def _scheduled(self, out: SchedulerOutput) -> Iterator[tuple[str, tuple[list[int], ...] | None, bool]]:
        """(req_id, new block ids per group, resumed) of new then cached requests (vLLM's yield_req_data)."""
        for new in out.scheduled_new_reqs:
            yield new.req_id, new.block_ids, False
        cached = out.scheduled_cached_reqs
        for rid, new_ids in zip(cached.req_ids, cached.new_block_ids):
            yield rid, new_ids, rid in cached.resumed_req_ids

    def _store_one(self, rid: str, out: SchedulerOutput) -> OffloadTransfer | None:
        block_ids = self._request_block_ids[rid]
        req = self._requests[rid]
        # With async scheduling the last tokens may not be known yet.
        total_tokens = min(req.num_computed_tokens + out.num_scheduled_tokens[rid], req.num_tokens)
        num_blocks = total_tokens // self.offloaded_block_size
        start = self._next_stored_block_idx.get(rid, 0)
        if num_blocks - start <= 0:
            return None
        assert len(req.block_hashes) >= num_blocks * self.block_size_factor
        store = self.manager.prepare_store(self._get_block_hashes(req, start_idx=start, end_idx=num_blocks))
        if store is None:  # no room: these blocks are never stored (vLLM logs a warning)
            return None
        self._next_stored_block_idx[rid] = num_blocks
        if not store.block_hashes_to_store:
            return None
        to_store = set(store.block_hashes_to_store)
        self.manager.touch(self._get_block_hashes(req, end_idx=num_blocks))
        factor = self.block_size_factor
        gpu_ids: list[int] = []
        for idx, block_hash in enumerate(self._get_block_hashes(req, start_idx=start, end_idx=num_blocks)):
            if block_hash in to_store:
                first = (start + idx) * factor
                gpu_ids.extend(block_ids[first:first + factor])
        self._reqs_being_stored.setdefault(rid, set()).update(to_store)
        return OffloadTransfer(gpu_ids, store.store_block_ids)

    def _get_reqs_to_store(self, out: SchedulerOutput) -> dict[str, OffloadTransfer]:
        reqs_to_store: dict[str, OffloadTransfer] = {}
        for rid, new_block_id_groups, resumed in self._scheduled(out):
            if resumed:
                self._request_block_ids[rid] = []
            if new_block_id_groups:
                self._request_block_ids[rid] += new_block_id_groups[0]
            transfer = self._store_one(rid, out)
            if transfer is not None:
                reqs_to_store[rid] = transfer
        return reqs_to_store

    def build_connector_meta(self, out: SchedulerOutput) -> OffloadingConnectorMetadata:
        meta = OffloadingConnectorMetadata(self._reqs_to_load, self._get_reqs_to_store(out),
                                           set(out.preempted_req_ids))
        self._reqs_to_load = {}
        # vLLM completes a preempted request's stores here (the worker flushes them first).
        for rid in out.preempted_req_ids:
            hashes = self._reqs_being_stored.get(rid)
            if hashes:
                self.manager.complete_store(hashes)
                hashes.clear()
        return meta

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        for rid in connector_output.finished_sending:
            hashes = self._reqs_being_stored.pop(rid, None)
            if hashes:
                self.manager.complete_store(hashes)
        for rid in connector_output.finished_recving:
            hashes = self._reqs_being_loaded.pop(rid, None)
            if hashes:
                if self._blocks_being_loaded:
                    self._blocks_being_loaded.difference_update(hashes)
                self.manager.complete_load(hashes)

    def request_finished(self, request: Request, block_ids: tuple[list[int], ...]) -> tuple[bool, dict[str, Any] | None]:
        rid = request.request_id
        self._requests.pop(rid, None)
        self._request_block_ids.pop(rid, None)
        self._next_stored_block_idx.pop(rid, None)
        return rid in self._reqs_being_stored, None

    def take_events(self) -> Iterable[OffloadingEvent]:
        return self.manager.take_events()
