"""HiCacheConfig: SGLang's hierarchical cache (a host KV tier behind the radix cache), validated on
construction. Nested in SGLangConfig as `hicache` (YAML `sglang: {hicache: {...}}`, `--set
sglang.hicache.enable_hierarchical_cache=true`).

Defaults are SGLang's server_args.py (v0.5 line): --enable-hierarchical-cache off, --hicache-ratio
2.0, --hicache-size 0 (GB; 0 means "use the ratio"), --hicache-write-policy write_through.
`kv_bytes_per_token` and `host_link_bytes_per_s` come from the hardware (the model's KV bytes per
token on one GPU, and the host's PCIe link: HostSpec.pcie_gb_s); simulator/scheduler_kinds/sglang.py
fills them in, and a scheduler with HiCache on refuses them unresolved.
"""

from __future__ import annotations

from dataclasses import dataclass

from servesim.scheduler.registry import unknown_name_message

# SGLang's --hicache-write-policy choices (cache_controller.py / hiradix_cache.py):
#   write_through            back a node up to host when it is inserted (hit_count >= 1)
#   write_through_selective  back it up after 2 hits (HiRadixCache.write_through_threshold)
#   write_back               back it up only when it is evicted from the device
WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
# HiRadixCache.write_through_threshold: 1 for write_through, else 2 (hiradix_cache.py __init__, v0.5
# line; releases before the storage tier used 3).
WRITE_THROUGH_THRESHOLD = {"write_through": 1, "write_through_selective": 2}
# HiRadixCache.load_back_threshold: a host hit shorter than this many tokens is not loaded back.
LOAD_BACK_THRESHOLD_TOKENS = 10


@dataclass(slots=True)
class HiCacheConfig:
    enable_hierarchical_cache: bool = False  # SGLang --enable-hierarchical-cache
    hicache_ratio: float = 2.0  # host pool tokens = device pool tokens x this (when hicache_size_gb == 0)
    hicache_size_gb: float = 0.0  # SGLang --hicache-size, 1e9 bytes; > 0 overrides the ratio
    hicache_write_policy: str = "write_through"  # one of WRITE_POLICIES
    # Host<->device copies: bytes / (host_link_bytes_per_s x transfer_efficiency) + transfer_latency_s.
    # No measured achievable fraction of PCIe for SGLang's copy kernels is cited here: 1.0 (the link's
    # payload rate, PCIe base-spec figures in specs/hosts.py), and no fixed per-copy latency (0.0).
    transfer_efficiency: float = 1.0
    transfer_latency_s: float = 0.0
    # --- resolved from the hardware when None (scheduler_kinds/sglang.py) --------------------------
    kv_bytes_per_token: int | None = None  # one GPU's KV bytes per token, all layers
    host_link_bytes_per_s: float | None = None  # one direction (HostSpec.pcie_gb_s x 1e9)

    def __post_init__(self) -> None:
        if not isinstance(self.enable_hierarchical_cache, bool):
            raise ValueError(f"enable_hierarchical_cache must be true or false, got {self.enable_hierarchical_cache!r}")
        if self.hicache_write_policy not in WRITE_POLICIES:
            raise ValueError(f"{unknown_name_message('hicache_write_policy', self.hicache_write_policy, WRITE_POLICIES)}"
                             f" (valid: {', '.join(WRITE_POLICIES)})")
        if not self.hicache_ratio > 0:
            raise ValueError(f"hicache_ratio must be > 0, got {self.hicache_ratio}")
        if not self.hicache_size_gb >= 0:
            raise ValueError(f"hicache_size_gb must be >= 0 (0: use hicache_ratio), got {self.hicache_size_gb}")
        if not 0 < self.transfer_efficiency <= 1:
            raise ValueError(f"transfer_efficiency must be in (0, 1], got {self.transfer_efficiency}")
        if not self.transfer_latency_s >= 0:
            raise ValueError(f"transfer_latency_s must be >= 0, got {self.transfer_latency_s}")
        if self.kv_bytes_per_token is not None and self.kv_bytes_per_token < 1:
            raise ValueError(f"kv_bytes_per_token must be >= 1, got {self.kv_bytes_per_token}")
        if self.host_link_bytes_per_s is not None and not self.host_link_bytes_per_s > 0:
            raise ValueError(f"host_link_bytes_per_s must be > 0, got {self.host_link_bytes_per_s}")

    def host_num_pages(self, device_tokens: int, page_size: int) -> int:
        """Host pool pages, as MHATokenToKVPoolHost sizes it: hicache_size GB / bytes per token, else
        device pool tokens x ratio; whole pages; refused unless larger than the device pool."""
        if self.hicache_size_gb > 0:
            if self.kv_bytes_per_token is None:
                raise ValueError("hicache_size_gb needs kv_bytes_per_token (resolved from the model)")
            tokens = int(self.hicache_size_gb * 1e9 // self.kv_bytes_per_token)
        else:
            tokens = int(device_tokens * self.hicache_ratio)
        tokens -= tokens % page_size
        if tokens <= device_tokens:
            # SGLang's HostKVCache.__init__ asserts size > device_pool.size, with these words.
            raise ValueError(f"hicache: the host pool ({tokens} tokens) must be larger than the device pool "
                             f"({device_tokens} tokens): SGLang: 'The host memory should be larger than the "
                             "device memory with the current protocol'")
        return tokens // page_size
