"""The CPU KV tier in a simulated vLLM run (vLLM's OffloadingConnector with its CPU backend): the
run's settings (`kv_offload:` in YAML / `--set kv_offload.x=...` / SimConfig(kv_offload=...)), and
the worker side that times the copies the connector plans.

Sizing (vLLM 0.19.1): `--kv-offloading-size GiB` with `--kv-offloading-backend native` becomes the
OffloadingConnector's `cpu_bytes_to_use = GiB * 2**30`, and CPUOffloadingSpec
(vllm/v1/kv_offload/cpu/spec.py) sizes the tier as
    num_blocks = cpu_bytes_to_use // (page_size_bytes * len(kv_cache_tensors) * world_size * block_size_factor)
i.e. the GiB are the total over every rank: each of the tp GPUs holds its shard of every offload
block in host memory. Here: kv_bytes_per_token(model, tp) x GPU block size x tp x factor
(OffloadConfig.num_blocks; pipeline parallelism is refused, see check_kv_offload).

Timing (TimedOffloadWorker): the worker copies on two CUDA streams of its own, one per direction
(vLLM's CpuGpuOffloadingHandlers: a load stream and a store stream), so copies of one direction run
one after another, the two directions overlap each other and the model's compute. A copy of n GPU
blocks takes n x block_size x kv_bytes_per_token(model, tp) / (link bytes/s x transfer_efficiency)
+ transfer_latency_s; under TP every GPU moves its own shard over its own link at the same time, so
one GPU's share sets the time. The link is the host's PCIe generation x lanes, one direction
(simulator/specs/hosts.py: HostSpec.pcie_gb_s, PCIe base-spec payload rates); no measured
achievable fraction of it is cited for vLLM's copy kernels, so transfer_efficiency defaults to 1.0
and transfer_latency_s to 0.0; `host_link_bytes_per_s` takes a measured figure instead.
A load starts when its step starts (start_kv_transfers before the forward); a store when its step's
forward ends (the KV it copies is written then); a job completes in the first step that ends at or
after its copy's end, and is reported in that step's KVConnectorOutput by the worker's own rules
(scheduler/kv_offload/fake_worker.py's OffloadJobs: flushed stores complete in the flushing step,
a finished request is reported once all its stores landed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from servesim.scheduler.kv_offload.config import GIB_BYTES, OffloadConfig, make_offloading_connector
from servesim.scheduler.kv_offload.fake_worker import OffloadJobs
from servesim.scheduler.kv_offload.reuse import DEFAULT_MAX_TRACKER_SIZE
from servesim.scheduler.output import KVConnectorOutput
from servesim.scheduler.copy_stream import TransferStream
from servesim.traces.errors import InputError

if TYPE_CHECKING:
    from servesim.scheduler.config import CacheConfig
    from servesim.scheduler.output import SchedulerOutput
    from servesim.simulator.config import SimConfig

# vLLM 0.19.1 CacheConfig.kv_offloading_backend choices with a CPU tier: "native" (the
# OffloadingConnector, modelled here); "lmcache" is another connector, not modelled.
OFFLOADING_BACKENDS = ("native",)


@dataclass(slots=True)
class KvOffloadConfig:
    """The CPU KV tier; off unless kv_offloading_size (GiB) or num_cpu_blocks is set."""

    kv_offloading_size: float | None = None  # vLLM --kv-offloading-size, GiB over all ranks
    num_cpu_blocks: int | None = None  # the tier in offload blocks instead (the extra config's num_cpu_blocks)
    block_size: int | None = None  # offload block, tokens (None: the GPU block size)
    eviction_policy: str = "lru"  # lru | arc
    kv_offloading_backend: str = "native"  # vLLM --kv-offloading-backend
    # The extra config's store_threshold: >= 2 stores only blocks looked up that many times (vLLM's
    # FilterReusedOffloadingManager, scheduler/kv_offload/reuse.py); 0 (vLLM's default) or 1: every block.
    store_threshold: int = 0
    max_tracker_size: int = DEFAULT_MAX_TRACKER_SIZE  # hashes the filter counts (vLLM's default 64,000)
    # Copies: bytes / (host_link_bytes_per_s x transfer_efficiency) + transfer_latency_s (module doc).
    transfer_efficiency: float = 1.0
    transfer_latency_s: float = 0.0
    host_link_bytes_per_s: float | None = None  # one direction; None: the host's PCIe (a measured figure overrides)

    def __post_init__(self) -> None:
        size = self.kv_offloading_size
        if isinstance(size, str):  # PyYAML reads 1e-9 (no dot) as a string
            try:
                self.kv_offloading_size = size = float(size)
            except ValueError:
                pass
        if size is not None and (isinstance(size, bool) or not isinstance(size, (int, float))):
            raise ValueError(f"kv_offloading_size must be a number of GiB, got {size!r}")
        if self.num_cpu_blocks is not None and (isinstance(self.num_cpu_blocks, bool)
                                                or not isinstance(self.num_cpu_blocks, int)):
            raise ValueError(f"num_cpu_blocks must be an integer, got {self.num_cpu_blocks!r}")
        if size is not None and self.num_cpu_blocks is not None:
            raise ValueError("give the CPU tier's size as kv_offloading_size (GiB) or num_cpu_blocks, not both")
        if self.kv_offloading_backend not in OFFLOADING_BACKENDS:
            raise ValueError(f"kv_offloading_backend {self.kv_offloading_backend!r} is not modelled "
                             f"(valid: {', '.join(OFFLOADING_BACKENDS)})")
        if not (isinstance(self.transfer_efficiency, (int, float)) and 0 < self.transfer_efficiency <= 1):
            raise ValueError(f"transfer_efficiency must be in (0, 1], got {self.transfer_efficiency!r}")
        if not (isinstance(self.transfer_latency_s, (int, float)) and self.transfer_latency_s >= 0):
            raise ValueError(f"transfer_latency_s must be >= 0, got {self.transfer_latency_s!r}")
        if self.host_link_bytes_per_s is not None and not self.host_link_bytes_per_s > 0:
            raise ValueError(f"host_link_bytes_per_s must be > 0, got {self.host_link_bytes_per_s!r}")
        if self.enabled:
            self.offload_config()  # OffloadConfig's own checks, whichever way the settings came in

    @property
    def enabled(self) -> bool:
        return self.kv_offloading_size is not None or self.num_cpu_blocks is not None

    def offload_config(self) -> OffloadConfig:
        return OffloadConfig(num_cpu_blocks=self.num_cpu_blocks, cpu_gib=self.kv_offloading_size,
                             block_size=self.block_size, eviction_policy=self.eviction_policy,
                             store_threshold=self.store_threshold, max_tracker_size=self.max_tracker_size)


def host_link_figures(cfg: SimConfig) -> tuple[int, float]:
    """(one GPU's KV bytes per token, one direction's host link bytes/s)."""
    from servesim.simulator.specs import host_for, kv_bytes_per_token, resolve_model

    hw = cfg.hardware
    link = cfg.kv_offload.host_link_bytes_per_s
    if link is None:
        link = host_for(hw.gpu, hw.host).pcie_gb_s * 1e9
    return kv_bytes_per_token(resolve_model(hw.model), hw.tp), link


def check_kv_offload(cfg: SimConfig, cache: CacheConfig, data_parallel_size: int = 1) -> int | None:
    """Start-up checks of an offload run (simulator/startup.py runs them with every SimConfig); the
    tier's offload blocks (None: offload off)."""
    if not cfg.kv_offload.enabled:
        return None
    if cfg.engine != "vllm":
        raise InputError("the OffloadingConnector is vLLM's (SGLang's host tier is sglang.hicache)",
                         field="kv_offload", allowed="engine: vllm, or no kv_offload")
    if cfg.hardware.pp > 1:
        raise InputError("the CPU tier with pipeline parallelism is not modelled", field="kv_offload",
                         allowed="hardware.pp 1")
    if data_parallel_size > 1:  # the DP group's lockstep loop (cluster/dp.py) runs no worker
        raise InputError("the CPU tier with data parallelism is not modelled", field="kv_offload",
                         allowed="no data parallelism")
    if cache.attention != "full":  # vLLM's OffloadingConnector asserts a single KV cache group
        raise InputError(f"the CPU tier with attention layout {cache.attention!r} (more than one KV cache group, "
                         "or a sliding window) is not modelled", field="cache.attention", allowed="full")
    if not cache.enable_prefix_caching:
        raise InputError("offload blocks are named by prefix-cache block hashes, which servesim computes "
                         "only with prefix caching", field="cache.enable_prefix_caching",
                         allowed="true with kv_offload")
    num_blocks = tier_num_blocks(cfg, cache)
    _check_host_memory(cfg, cache, num_blocks)
    return num_blocks


def _check_host_memory(cfg: SimConfig, cache: CacheConfig, num_blocks: int) -> None:
    """vLLM 0.19.1 allocates the whole tier at start-up, pinned (CpuGpuOffloadingHandlers: each rank's
    torch.zeros((num_cpu_blocks, page bytes), pin_memory=True)), so a tier larger than the node's
    system memory (hosts.yaml host_memory_gib, where cited) cannot exist. A cluster's replicas on one
    node share it (simulator/cluster/host_memory.py, with the same tier_bytes)."""
    from servesim.simulator.specs import host_for

    host = host_for(cfg.hardware.gpu, cfg.hardware.host)
    if host.host_memory_gib is None:
        return
    tier_gib = tier_bytes(cfg, cache, num_blocks) / GIB_BYTES
    if tier_gib > host.host_memory_gib:
        raise InputError(f"a CPU KV tier of {tier_gib:.0f} GiB does not fit in host {host.name}'s "
                         f"{host.host_memory_gib:g} GiB of system memory (vLLM pins the whole tier)",
                         field="kv_offload", allowed=f"a tier of at most {host.host_memory_gib:g} GiB over all TP ranks")


def tier_bytes(cfg: SimConfig, cache: CacheConfig, num_blocks: int | None = None) -> int:
    """Host bytes the tier pins over all TP ranks: its offload blocks x block_size_factor GPU
    blocks x one GPU block's bytes x tp (CPUOffloadingSpec's arithmetic, module doc)."""
    per_token, _ = host_link_figures(cfg)
    factor = cfg.kv_offload.offload_config().block_size_factor(cache.block_size)
    blocks = tier_num_blocks(cfg, cache) if num_blocks is None else num_blocks
    return blocks * factor * cache.block_size * per_token * cfg.hardware.tp


def tier_num_blocks(cfg: SimConfig, cache: CacheConfig) -> int:
    """The CPU tier's offload blocks (vLLM's CPUOffloadingSpec arithmetic: module doc)."""
    ko = cfg.kv_offload
    per_token, _ = host_link_figures(cfg)
    try:
        return ko.offload_config().num_blocks(cache.block_size, per_token * cache.block_size * cfg.hardware.tp)
    except ValueError as e:
        raise InputError(str(e), field="kv_offload") from None


@dataclass(slots=True)
class OffloadTransferStats:
    """The worker's copies over a run (summary.json's offload block)."""

    num_loads: int = 0
    num_stores: int = 0
    bytes_loaded: int = 0  # one GPU's share (every TP rank moves as much at once)
    bytes_stored: int = 0
    load_wait_s: float = 0.0  # sum over loads of (step that reported it ends) - (load submitted)


class TimedOffloadWorker:
    """OffloadingConnectorWorker with copies timed over the host link (module doc)."""

    def __init__(self, bytes_per_gpu_block: int, link_bytes_per_s: float, latency_s: float) -> None:
        self.bytes_per_gpu_block = bytes_per_gpu_block  # one GPU's shard
        self.link_bytes_per_s = link_bytes_per_s  # link x efficiency
        self.latency_s = latency_s
        self.book = OffloadJobs()  # completion keys: seconds on the simulated clock
        self.load_stream = TransferStream()  # CPU -> GPU
        self.store_stream = TransferStream()  # GPU -> CPU
        self.totals = OffloadTransferStats()
        # Steps that started copies: (step end s, bytes loaded, bytes stored); the series bins them.
        self.copy_rows: list[tuple[float, int, int]] = []
        self._load_started_s: dict[str, float] = {}
        self._reported = False  # the last step reported transfers (the scheduler acts at its next schedule())

    def copy_s(self, num_gpu_blocks: int) -> float:
        return self.latency_s + num_gpu_blocks * self.bytes_per_gpu_block / self.link_bytes_per_s

    def execute(self, so: SchedulerOutput, start_s: float, end_s: float) -> KVConnectorOutput | None:
        """One step's transfers (the step's GPU work runs start_s .. end_s): its report, or None."""
        meta = so.kv_connector_metadata
        book, totals = self.book, self.totals
        loaded_before, stored_before = totals.bytes_loaded, totals.bytes_stored
        for rid in meta.reqs_to_flush:  # handle_preemptions waits for them before the step
            book.flush(rid, start_s)
        for rid, t in meta.reqs_to_load.items():
            n = len(t.gpu_block_ids)
            book.add_load(rid, self.load_stream.submit(start_s, self.copy_s(n)))
            self._load_started_s[rid] = start_s
            totals.num_loads += 1
            totals.bytes_loaded += n * self.bytes_per_gpu_block
        if so.total_num_scheduled_tokens > 0:  # wait_for_save: stores follow a forward only
            for rid, t in meta.reqs_to_store.items():
                n = len(t.gpu_block_ids)
                book.add_store(rid, self.store_stream.submit(end_s, self.copy_s(n)))
                totals.num_stores += 1
                totals.bytes_stored += n * self.bytes_per_gpu_block
        if totals.bytes_loaded != loaded_before or totals.bytes_stored != stored_before:
            self.copy_rows.append((end_s, totals.bytes_loaded - loaded_before, totals.bytes_stored - stored_before))
        # Sorted: a Python set's order of str ids varies between processes (determinism).
        sending, recving = book.get_finished(end_s, sorted(so.finished_req_ids))
        for rid in recving:
            totals.load_wait_s += end_s - self._load_started_s.pop(rid)
        self._reported = bool(sending or recving)
        if not self._reported:
            return None
        return KVConnectorOutput(finished_recving=tuple(recving), finished_sending=tuple(sending))

    def next_event_s(self, now_s: float) -> float | None:
        """When an idle engine must step again for this worker: now if the last step reported
        transfers, else the first copy in flight to end (a step ending then reports it), else None."""
        return now_s if self._reported else self.book.next_done()


def refuse_kv_offload(cfg: SimConfig, why: str) -> None:
    """An engine that cannot host the CPU tier (one connector per engine is modelled) refuses it."""
    if cfg.kv_offload.enabled:
        raise InputError(f"the CPU KV tier is not modelled here: {why}", field="kv_offload",
                         allowed="no kv_offload for this engine")


def attach_kv_offload(cfg: SimConfig, scheduler, cache: CacheConfig) -> TimedOffloadWorker | None:
    """With kv_offload on: the OffloadingConnector set on the scheduler, and its timed worker (the
    config passed check_kv_offload when it was built)."""
    if not cfg.kv_offload.enabled:
        return None
    num_blocks = tier_num_blocks(cfg, cache)
    if scheduler.connector is not None:
        raise InputError("the scheduler already has a KV connector (P/D); one connector per engine is modelled",
                         field="kv_offload")
    ko, tp = cfg.kv_offload, cfg.hardware.tp
    per_token, link = host_link_figures(cfg)
    tier = OffloadConfig(num_cpu_blocks=num_blocks, block_size=ko.block_size, eviction_policy=ko.eviction_policy,
                         store_threshold=ko.store_threshold, max_tracker_size=ko.max_tracker_size)
    scheduler.connector = make_offloading_connector(tier, cache.block_size, cache.enable_prefix_caching,
                                                    per_token * cache.block_size * tp)
    return TimedOffloadWorker(per_token * cache.block_size, link * ko.transfer_efficiency, ko.transfer_latency_s)
