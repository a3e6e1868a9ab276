"""HiCacheController: the host KV pool and the timed copies between it and the device
(SGLang's HiCacheController in managers/cache_controller.py plus MHATokenToKVPoolHost).

SGLang copies on two CUDA streams of their own (a write stream device->host, a load stream
host->device), so copies overlap the forward passes; each stream runs its copies in order. Here
each stream is a FIFO with the time it is free again: a copy of n tokens issued at `now_s` starts
when its stream is free and takes `latency + n * kv_bytes_per_token / (link bytes/s x efficiency)`.
A copy is acknowledged (SGLang's ack_write_queue / ack_load_queue) by the first writing_check /
loading_check at or after its end: the scheduler calls them at the start of each prefill round
(check_hicache_events), so a copy finishes in the step where its time has elapsed. The scheduler
keeps no clock of its own: `now_s` is set by the scheduler from the engine's calls.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from typing import Any

from servesim.scheduler.copy_stream import TransferStream
from servesim.scheduler.sglang.radix_cache import TokenToKVPool
from servesim.scheduler.sglang.hicache_config import HiCacheConfig


@dataclass(slots=True)
class HiCacheStats:
    """Host-tier figures of one interval (a step's stats) or of a run."""

    host_hit_tokens: int = 0  # prefix tokens requests got by a load from the host tier
    load_bytes: int = 0  # host -> device
    write_bytes: int = 0  # device -> host
    num_loads: int = 0
    num_writes: int = 0

    def add(self, other: HiCacheStats) -> None:
        self.host_hit_tokens += other.host_hit_tokens
        self.load_bytes += other.load_bytes
        self.write_bytes += other.write_bytes
        self.num_loads += other.num_loads
        self.num_writes += other.num_writes


class HiCacheController:
    def __init__(self, cfg: HiCacheConfig, page_size: int, device_tokens: int) -> None:
        if cfg.kv_bytes_per_token is None or cfg.host_link_bytes_per_s is None:
            raise ValueError("hicache: kv_bytes_per_token and host_link_bytes_per_s must be resolved "
                             "(simulator.scheduler_kinds.sglang fills them from the hardware)")
        self.cfg = cfg
        self.page_size = page_size
        self.bytes_per_token = cfg.kv_bytes_per_token
        # the host pool pages like the device pool (SGLang's MHATokenToKVPoolHost, page granularity)
        self.host_pool = TokenToKVPool(cfg.host_num_pages(device_tokens, page_size), page_size)
        self.write_stream = TransferStream()
        self.load_stream = TransferStream()
        self.now_s = 0.0
        self._seq = itertools.count()
        # (end_s, seq, payload): copies in flight until acknowledged.
        self.ongoing_writes: list[tuple[float, int, Any]] = []
        self.ongoing_loads: list[tuple[float, int, Any]] = []
        self.stats = HiCacheStats()  # since the last take_stats
        self.totals = HiCacheStats()  # the whole run

    def transfer_s(self, num_tokens: int) -> float:
        cfg = self.cfg
        return cfg.transfer_latency_s + num_tokens * self.bytes_per_token / (
            cfg.host_link_bytes_per_s * cfg.transfer_efficiency)

    def write(self, num_tokens: int, payload: Any) -> list[int] | None:
        """Back up num_tokens device tokens: host pages, or None when the host pool is short.
        `payload` (None: nothing to acknowledge) comes back from pop_done_writes at the copy's end."""
        host = self.host_pool.alloc(num_tokens // self.page_size)
        if host is None:
            return None
        end_s = self.write_stream.submit(self.now_s, self.transfer_s(num_tokens))
        if payload is not None:
            heapq.heappush(self.ongoing_writes, (end_s, next(self._seq), payload))
        self._count(write_bytes=num_tokens * self.bytes_per_token, num_writes=1)
        return host

    def load(self, num_tokens: int, payload: Any) -> float:
        """Copy num_tokens host tokens to device; `payload` comes back from pop_done_loads."""
        end_s = self.load_stream.submit(self.now_s, self.transfer_s(num_tokens))
        heapq.heappush(self.ongoing_loads, (end_s, next(self._seq), payload))
        self._count(load_bytes=num_tokens * self.bytes_per_token, num_loads=1)
        return end_s

    def add_host_hit(self, num_tokens: int) -> None:
        self._count(host_hit_tokens=num_tokens)

    def _count(self, **fields: int) -> None:
        delta = HiCacheStats(**fields)
        self.stats.add(delta)
        self.totals.add(delta)

    @staticmethod
    def _pop_done(heap: list, now_s: float) -> list:
        done = []
        while heap and heap[0][0] <= now_s:
            done.append(heapq.heappop(heap)[2])
        return done

    def pop_done_writes(self) -> list:
        return self._pop_done(self.ongoing_writes, self.now_s)

    def pop_done_loads(self) -> list:
        return self._pop_done(self.ongoing_loads, self.now_s)

    def next_done_s(self) -> float | None:
        """When the next copy in flight ends (None: none in flight)."""
        ends = [h[0][0] for h in (self.ongoing_writes, self.ongoing_loads) if h]
        return min(ends) if ends else None

    def take_stats(self) -> HiCacheStats:
        stats, self.stats = self.stats, HiCacheStats()
        return stats
