"""The offload oracle's worker side around one of our schedulers (tools/offload_oracle.py's, for the
replay in scheduler/oracle_trace.py): the OffloadingConnector on the scheduler, the fake worker
executing each step's transfers, and the trace fields the oracle adds (its field names and order)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from servesim.scheduler.kv_offload.config import OffloadConfig, make_offloading_connector
from servesim.scheduler.kv_offload.connector import (OffloadingConnectorMetadata, OffloadingConnectorScheduler,
                                                     OffloadTransfer)
from servesim.scheduler.kv_offload.manager import OffloadingEvent
from servesim.scheduler.kv_offload.fake_worker import FakeOffloadWorker
from servesim.scheduler.output import KVConnectorOutput
from servesim.scheduler.pyset import set_order

if TYPE_CHECKING:
    from servesim.scheduler.kv.manager import KVCacheBlocks
    from servesim.scheduler.output import SchedulerOutput
    from servesim.scheduler.request import Request


def _transfers(specs: dict[str, OffloadTransfer]) -> dict[str, dict[str, list[int]]]:
    return {rid: {"gpu": list(t.gpu_block_ids), "cpu": list(t.cpu_block_ids)} for rid, t in specs.items()}


class _FinishOrder:
    """The connector as the scheduler sees it, noting the order requests finish in: vLLM's
    `finished_req_ids` is a set filled in that order, and the worker's report (hence which blocks are
    freed first) follows that set's iteration order, which depends on the insertion order when ids
    collide. Every KVConnector method is passed through."""

    def __init__(self, connector: OffloadingConnectorScheduler) -> None:
        self.connector = connector
        self.finish_seq: dict[str, int] = {}

    def get_num_new_matched_tokens(self, request: Request, num_local_computed_tokens: int) -> tuple[int | None, bool]:
        return self.connector.get_num_new_matched_tokens(request, num_local_computed_tokens)

    def peek_num_matched_tokens(self, request: Request, num_local_computed_tokens: int) -> int:
        return self.connector.peek_num_matched_tokens(request, num_local_computed_tokens)

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        self.connector.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> OffloadingConnectorMetadata:
        return self.connector.build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        self.connector.update_connector_output(connector_output)

    def request_finished(self, request: Request, block_ids: tuple[list[int], ...]) -> tuple[bool, dict[str, Any] | None]:
        self.finish_seq[request.request_id] = len(self.finish_seq)
        return self.connector.request_finished(request, block_ids)

    def take_events(self) -> Iterable[OffloadingEvent]:
        return self.connector.take_events()

    def finished_set_order(self, finished_req_ids: set[str]) -> list[str]:
        """Iteration order of vLLM's finished_req_ids set (filled in finishing order, PYTHONHASHSEED=0)."""
        seq = self.finish_seq
        return set_order(sorted(finished_req_ids, key=seq.__getitem__))


class OffloadReplay:
    """Attaches the connector to `sched` and plays the worker; one instance per run."""

    __slots__ = ("connector", "worker", "_order")

    def __init__(self, sched, cfg: OffloadConfig, load_steps: int, store_steps: int) -> None:
        cc = sched.cache_config
        self.connector = make_offloading_connector(cfg, cc.block_size, cc.enable_prefix_caching)
        self._order = _FinishOrder(self.connector)
        sched.connector = self._order
        self.worker = FakeOffloadWorker(load_steps, store_steps)

    def execute(self, out: SchedulerOutput) -> tuple[KVConnectorOutput | None, dict]:
        """The worker runs the step's transfers: its report for the model output, and the trace
        fields (the connector's decisions of this step's schedule() and the worker's report)."""
        meta = out.kv_connector_metadata
        sending, recving = self.worker.execute(out, self._order.finished_set_order)
        fields = {"offload_load": _transfers(meta.reqs_to_load), "offload_store": _transfers(meta.reqs_to_store),
                  "offload_flush": sorted(meta.reqs_to_flush),
                  "offload_finished_sending": sorted(sending), "offload_finished_recving": sorted(recving)}
        if not sending and not recving:
            return None, fields
        return KVConnectorOutput(finished_recving=tuple(recving), finished_sending=tuple(sending)), fields
