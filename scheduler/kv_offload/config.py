"""The CPU KV tier's settings (vLLM's `--kv-offloading-size` / OffloadingConnector extra config) and
the connector built from them.

vLLM 0.19.1: `--kv-offloading-size GiB` (CacheConfig.kv_offloading_size, the total over TP ranks)
with `kv_offloading_backend="native"` becomes `KVTransferConfig(kv_connector="OffloadingConnector",
kv_connector_extra_config={"cpu_bytes_to_use": GiB * 2**30})` (VllmConfig._post_init_kv_transfer_
config); the extra config also takes `block_size` (offload block, tokens), `eviction_policy`
(lru | arc) and `store_threshold` / `max_tracker_size` (store only blocks looked up that often:
reuse.py). CPUOffloadingSpec sizes the tier as cpu_bytes_to_use // (KV bytes of one GPU block over
all layers and ranks * block_size_factor).

Refusals: an offload block size that is not a multiple of the GPU block size (vLLM's OffloadingSpec
asserts it); a tier smaller than one offload block (vLLM builds a 0-block tier that silently stores
nothing; we refuse it); prefix caching off (vLLM accepts it and hashes blocks anyway because a
connector is set; servesim's scheduler hashes blocks only with prefix caching on, and the connector
names offload blocks by those hashes, so we refuse it rather than offload nothing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from servesim.scheduler.kv_offload.connector import OffloadingConnectorScheduler
from servesim.scheduler.kv_offload.manager import CPUOffloadingManager
from servesim.scheduler.kv_offload.policies import CACHE_POLICIES
from servesim.scheduler.kv_offload.reuse import DEFAULT_MAX_TRACKER_SIZE, ReuseTracker
from servesim.scheduler.registry import Registry, unknown_name_message

if TYPE_CHECKING:
    from servesim.scheduler.connector import KVConnector

GIB_BYTES = 1 << 30  # vLLM: cpu_bytes_to_use = kv_offloading_size * (1 << 30)


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


@dataclass(slots=True)
class OffloadConfig:
    """The CPU tier: its size (offload blocks, or GiB with the KV bytes of one GPU block), the
    offload block size in tokens (None: the GPU block size) and the eviction policy."""

    num_cpu_blocks: int | None = None
    cpu_gib: float | None = None  # vLLM's --kv-offloading-size (all ranks together)
    block_size: int | None = None
    eviction_policy: str = "lru"
    # vLLM's extra config store_threshold: >= 2 stores only blocks looked up that many times (reuse.py);
    # 0 (vLLM's default) or 1: every block. max_tracker_size bounds the hashes it counts.
    store_threshold: int = 0
    max_tracker_size: int = DEFAULT_MAX_TRACKER_SIZE

    def __post_init__(self) -> None:
        _require((self.num_cpu_blocks is None) != (self.cpu_gib is None),
                 "offload: give the CPU tier size as exactly one of num_cpu_blocks or cpu_gib")
        _require(self.num_cpu_blocks is None or self.num_cpu_blocks >= 1,
                 f"offload: num_cpu_blocks must be >= 1 (a tier smaller than one offload block stores "
                 f"nothing), got {self.num_cpu_blocks}")
        _require(self.cpu_gib is None or self.cpu_gib > 0, f"offload: cpu_gib must be > 0, got {self.cpu_gib}")
        _require(self.block_size is None or self.block_size >= 1,
                 f"offload: block_size must be >= 1 tokens, got {self.block_size}")
        _require(self.eviction_policy in CACHE_POLICIES,
                 "offload: " + unknown_name_message("eviction_policy", self.eviction_policy, CACHE_POLICIES)
                 + f" (valid: {', '.join(CACHE_POLICIES.names())})")
        for name in ("store_threshold", "max_tracker_size"):
            value = getattr(self, name)
            _require(isinstance(value, int) and not isinstance(value, bool),
                     f"offload: {name} must be an integer, got {value!r}")
        _require(self.store_threshold >= 0, f"offload: store_threshold must be >= 0 (0 or 1: store every block), "
                                            f"got {self.store_threshold}")
        self.reuse_tracker()  # vLLM's FilterReusedOffloadingManager checks, when the filter is on

    def reuse_tracker(self) -> ReuseTracker | None:
        """The store filter (vLLM builds it only for store_threshold >= 2), or None."""
        if self.store_threshold < 2:
            return None
        try:
            return ReuseTracker(self.store_threshold, self.max_tracker_size)
        except ValueError as e:
            raise ValueError(f"offload: {e}") from None

    def block_size_factor(self, gpu_block_size: int) -> int:
        size = gpu_block_size if self.block_size is None else self.block_size
        _require(size % gpu_block_size == 0,
                 f"offload: block_size {size} is not a multiple of the GPU block size {gpu_block_size} "
                 "(vLLM's OffloadingSpec asserts offloaded_block_size % gpu_block_size == 0)")
        return size // gpu_block_size

    def num_blocks(self, gpu_block_size: int, kv_bytes_per_gpu_block: int | None = None) -> int:
        """Offload blocks in the tier; kv_bytes_per_gpu_block (all layers, all ranks) is needed
        when the size is in GiB (CPUOffloadingSpec's arithmetic)."""
        factor = self.block_size_factor(gpu_block_size)
        if self.num_cpu_blocks is not None:
            return self.num_cpu_blocks
        _require(kv_bytes_per_gpu_block is not None and kv_bytes_per_gpu_block > 0,
                 "offload: cpu_gib needs the KV bytes of one GPU block to size the tier")
        num = int(self.cpu_gib * GIB_BYTES) // (kv_bytes_per_gpu_block * factor)
        _require(num >= 1, f"offload: cpu_gib {self.cpu_gib} holds no offload block of "
                           f"{kv_bytes_per_gpu_block * factor} bytes (a tier must hold at least one)")
        return num


def make_offloading_connector(cfg: OffloadConfig, gpu_block_size: int, enable_prefix_caching: bool,
                              kv_bytes_per_gpu_block: int | None = None,
                              enable_events: bool = False) -> OffloadingConnectorScheduler:
    """The scheduler side of vLLM's OffloadingConnector with a CPU tier (CPUOffloadingSpec)."""
    _require(enable_prefix_caching,
             "offload: needs prefix caching on (offload blocks are named by prefix-cache block hashes, "
             "which servesim computes only with prefix caching)")
    factor = cfg.block_size_factor(gpu_block_size)
    manager = CPUOffloadingManager(gpu_block_size * factor, cfg.num_blocks(gpu_block_size, kv_bytes_per_gpu_block),
                                   cfg.eviction_policy, enable_events, cfg.reuse_tracker())
    return OffloadingConnectorScheduler(gpu_block_size, factor, manager, enable_prefix_caching)


class KVConnectorFactory(Protocol):
    def __call__(self, cfg: OffloadConfig, gpu_block_size: int, enable_prefix_caching: bool,
                 kv_bytes_per_gpu_block: int | None = None, enable_events: bool = False) -> KVConnector:
        """A connector with a KV tier, from its settings and the GPU KV cache's (vLLM's
        KVConnectorFactory.create_connector for the scheduler role)."""
        ...


# Connectors chosen by vLLM's kv_transfer_config.kv_connector name (P/D's are built by the cluster).
KV_CONNECTORS: Registry[KVConnectorFactory] = Registry("KV connector")
KV_CONNECTORS.add("OffloadingConnector", make_offloading_connector)
