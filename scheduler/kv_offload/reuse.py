"""Store only blocks seen often enough: vLLM 0.19.1's FilterReusedOffloadingManager
(vllm/v1/kv_offload/reuse_manager.py), the OffloadingConnector's `store_threshold` extra config.

vLLM wraps the CPU manager in it when `store_threshold >= 2` (CPUOffloadingSpec.get_manager; 0, the
default, and 1 mean no filter): every `lookup` first counts each hash it is given (all of them,
not only the hits) in an LRU table of at most `max_tracker_size` entries (64,000 by default; the
least recently counted entry leaves first), and `prepare_store` passes on only the hashes counted
at least `store_threshold` times, so filtered blocks take no room and are not protected from
eviction by that store. Here the tracker is composed into CPUOffloadingManager (manager.py), which
consults it at the top of the same two methods.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

DEFAULT_MAX_TRACKER_SIZE = 64_000  # vLLM: extra_config.get("max_tracker_size", 64_000)


class ReuseTracker:
    """How often each block hash was looked up (LRU-bounded), and which may be stored."""

    __slots__ = ("store_threshold", "max_tracker_size", "counts")

    def __init__(self, store_threshold: int, max_tracker_size: int = DEFAULT_MAX_TRACKER_SIZE) -> None:
        if store_threshold < 2:  # vLLM's own check (a threshold of 1 would filter nothing)
            raise ValueError(f"FilterReusedOffloadingManager store_threshold must be >= 2, got {store_threshold}")
        if max_tracker_size < 1:
            raise ValueError(f"FilterReusedOffloadingManager max_tracker_size must be >= 1, got {max_tracker_size}")
        self.store_threshold = store_threshold
        self.max_tracker_size = max_tracker_size
        self.counts: OrderedDict[bytes, int] = OrderedDict()  # least recently counted first

    def record(self, block_hashes: Iterable[bytes]) -> None:
        """Count one more sighting of each hash (a lookup's whole list, hits or not)."""
        counts = self.counts
        for block_hash in block_hashes:
            if block_hash in counts:
                counts.move_to_end(block_hash)
                counts[block_hash] += 1
            else:
                if len(counts) >= self.max_tracker_size:
                    counts.popitem(last=False)
                counts[block_hash] = 1

    def eligible(self, block_hashes: Iterable[bytes]) -> list[bytes]:
        """The hashes seen at least store_threshold times, in the given order."""
        threshold, counts = self.store_threshold, self.counts
        return [h for h in block_hashes if counts.get(h, 0) >= threshold]
