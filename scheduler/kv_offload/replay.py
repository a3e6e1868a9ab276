"""The offload oracle's worker side around one of our schedulers (tools/offload_oracle.py's, for the
replay in scheduler/oracle_trace.py): the OffloadingConnector on the scheduler, the fake worker
executing each step's transfers, and the trace fields the oracle adds (its field names and order)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from servesim.scheduler.kv_offload.config import OffloadConfig, make_offloading_connector
from servesim.scheduler.kv_offload.connector import OffloadTransfer
from servesim.scheduler.kv_offload.fake_worker import FakeOffloadWorker
from servesim.scheduler.output import KVConnectorOutput

if TYPE_CHECKING:
    from servesim.scheduler.output import SchedulerOutput


def _transfers(specs: dict[str, OffloadTransfer]) -> dict[str, dict[str, list[int]]]:
    return {rid: {"gpu": list(t.gpu_block_ids), "cpu": list(t.cpu_block_ids)} for rid, t in specs.items()}


class OffloadReplay:
    """Attaches the connector to `sched` and plays the worker; one instance per run."""

    __slots__ = ("connector", "worker")

    def __init__(self, sched, cfg: OffloadConfig, load_steps: int, store_steps: int) -> None:
        cc = sched.cache_config
        self.connector = make_offloading_connector(cfg, cc.block_size, cc.enable_prefix_caching)
        sched.connector = self.connector
        self.worker = FakeOffloadWorker(load_steps, store_steps)

    def execute(self, out: SchedulerOutput) -> tuple[KVConnectorOutput | None, dict]:
        """The worker runs the step's transfers: its report for the model output, and the trace
        fields (the connector's decisions of this step's schedule() and the worker's report)."""
        meta = out.kv_connector_metadata
        sending, recving = self.worker.execute(out)
        fields = {"offload_load": _transfers(meta.reqs_to_load), "offload_store": _transfers(meta.reqs_to_store),
                  "offload_flush": sorted(meta.reqs_to_flush),
                  "offload_finished_sending": sorted(sending), "offload_finished_recving": sorted(recving)}
        if not sending and not recving:
            return None, fields
        return KVConnectorOutput(finished_recving=tuple(recving), finished_sending=tuple(sending)), fields
