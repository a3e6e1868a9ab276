"""What a run with vLLM's CPU KV tier reports (summary.json's `kv_offload`, the per-second series'
`offload_*` columns, the replay's summary line): the connector's lookups beside the GPU prefix cache,
and the worker's copies (simulator/kv_offload.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servesim.scheduler.kv.manager import PrefixCacheStats
    from servesim.simulator.columns import Columns
    from servesim.simulator.kv_offload import OffloadTransferStats, TimedOffloadWorker
    from servesim.simulator.step_book import StepBook

OFFLOAD_SERIES_HITS = ("offload_cpu_hit_tokens",)
OFFLOAD_SERIES_COPIES = ("offload_load_bytes", "offload_store_bytes")


@dataclass(slots=True)
class KvOffloadReport:
    copies: OffloadTransferStats
    # vLLM's connector_prefix_cache_stats summed: tokens the GPU prefix cache lacked at each admission
    # lookup and the tokens the CPU tier supplied, preempted requests apart (as vLLM's hit rate).
    lookups: PrefixCacheStats
    hit_rows: list[tuple[float, int]]  # (step update s, CPU-tier hit tokens)
    copy_rows: list[tuple[float, int, int]]  # (step end s, bytes loaded, bytes stored)

    @classmethod
    def of(cls, worker: TimedOffloadWorker, book: StepBook) -> KvOffloadReport:
        return cls(worker.totals, book.connector_stats, list(book.connector_hit_rows),
                   list(worker.copy_rows))

    def summary(self) -> dict:
        c, lk = self.copies, self.lookups
        return {"cpu_hit_tokens": lk.hits, "cpu_query_tokens": lk.queries,
                "cpu_hit_rate": lk.hits / lk.queries if lk.queries else 0.0,
                "preempted_cpu_hit_tokens": lk.preempted_hits, "preempted_cpu_query_tokens": lk.preempted_queries,
                "num_loads": c.num_loads, "num_stores": c.num_stores,
                "bytes_loaded_per_gpu": c.bytes_loaded, "bytes_stored_per_gpu": c.bytes_stored,
                "load_wait_s_total": c.load_wait_s,
                "load_wait_s_mean": c.load_wait_s / c.num_loads if c.num_loads else 0.0}

    def with_series(self, ts: Columns, with_step_series: Callable[..., Columns]) -> Columns:
        """The 1-second series plus CPU-tier hit tokens (preempted requests' included) and bytes
        loaded / stored per second (one GPU's share)."""
        ts = with_step_series(ts, self.hit_rows, OFFLOAD_SERIES_HITS)
        return with_step_series(ts, self.copy_rows, OFFLOAD_SERIES_COPIES)


def summary_line(s: dict) -> str | None:
    """The replay's line for summary.json's kv_offload block (None without one)."""
    ko = s.get("kv_offload")
    if ko is None:
        return None
    return (f"CPU KV tier: {ko['cpu_hit_tokens']} hit tokens of {ko['cpu_query_tokens']} the GPU cache lacked "
            f"({100 * ko['cpu_hit_rate']:.1f} %; {ko['preempted_cpu_hit_tokens']} more for preempted requests); "
            f"{ko['num_loads']} loads "
            f"({ko['bytes_loaded_per_gpu'] / 1e9:.2f} GB/GPU, mean wait {1e3 * ko['load_wait_s_mean']:.2f} ms), "
            f"{ko['num_stores']} stores ({ko['bytes_stored_per_gpu'] / 1e9:.2f} GB/GPU)")
