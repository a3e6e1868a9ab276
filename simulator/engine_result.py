"""What an engine's run hands back (`EngineResult`), assembled from its `StepBook` once the run
ended (simulator/step_book.py holds the steps, token times and finishes it reads).
"""

from __future__ import annotations

from dataclasses import dataclass

from servesim.scheduler import CacheConfig
from servesim.scheduler.encoder_cache import EncoderCacheStats
from servesim.scheduler.sglang.hicache import HiCacheStats
from servesim.simulator.kv_capacity import KvCapacity
from servesim.simulator.kv_offload import TimedOffloadWorker
from servesim.simulator.kv_offload_report import KvOffloadReport
from servesim.simulator.metrics import MetricsCollector
from servesim.simulator.step_book import StepBook


@dataclass(slots=True)
class EngineResult:
    metrics: MetricsCollector
    sim_duration_s: float  # from the first arrival (t=0) to the last finish
    wall_time_s: float
    num_steps: int
    prefix_hits: int  # tokens, requests never preempted (vLLM's hit-rate definition)
    prefix_queries: int
    cache: CacheConfig
    kv_capacity: KvCapacity | None
    planner_declined: str | None  # why the run stepped every step (None: a fast-path planner ran beside it)
    hicache: HiCacheStats | None = None  # SGLang HiCache's host tier over the run (None: no host tier)
    hicache_rows: list | None = None  # its steps: (update s, host hit tokens, bytes in, bytes out)
    kv_offload: KvOffloadReport | None = None  # vLLM's CPU KV tier over the run (None: offload off)
    encoder_cache: EncoderCacheStats | None = None  # multimodal encoder-cache lookups (None: no multimodal input)


def engine_result(book: StepBook, now_s: float, wall_time_s: float, cache: CacheConfig,
                  kv_capacity: KvCapacity | None, planner_declined: str | None,
                  kv_offload: TimedOffloadWorker | None = None) -> EngineResult:
    """The result of a run whose clock stands at `now_s`: its book's last progress report made, the
    duration up to the last finish (the clients' token times already delivered: Engine.result)."""
    metrics = book.metrics
    end = metrics.last_finish_s()
    if book.progress is not None:
        book.progress(now_s, book.num_done)
    return EngineResult(metrics, end, wall_time_s, book.num_steps, book.prefix_hits, book.prefix_queries, cache,
                        kv_capacity, planner_declined, book.hicache, book.hicache_rows,
                        KvOffloadReport.of(kv_offload, book) if kv_offload is not None else None,
                        book.encoder_cache)
