"""Accelerator specs: datasheet peaks plus achievable-efficiency factors (see ``gpus.yaml``)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cache
from pathlib import Path

from servesim.scheduler.registry import unknown_name_message
from servesim.traces.errors import InputError

from ._names import alias_keys, candidates
from ._yaml import load_spec_file

_SPEC_FILE = Path(__file__).with_name("gpus.yaml")
_INTERCONNECTS = ("nvlink", "pcie")
# PCIe payload bandwidth per lane and direction after line coding, 1e9 B/s (PCI-SIG base specs:
# 8/16/32/64 GT/s with 128b/130b coding; gen6 PAM4 + FLIT ~ 64 GT/s x 242/256).
PCIE_GB_S_PER_LANE = {3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}


@dataclass(slots=True, frozen=True)
class GpuSpec:
    name: str  # short lowercase id, e.g. "h100"
    vendor_name: str  # the device string nvidia-smi / torch report
    memory_gib: float  # device memory, GiB (2**30 bytes)
    mem_bandwidth_gb_s: float  # peak DRAM bandwidth, 1e9 bytes/s
    bf16_dense_tflops: float  # peak dense bf16 tensor throughput, 1e12 FLOP/s
    interconnect: str  # "nvlink" or "pcie": the GPU-to-GPU link used by tensor parallelism
    interconnect_gb_s: float  # one direction, per GPU, 1e9 bytes/s
    collective_latency_s: float  # fixed cost of one small all-reduce, seconds
    compute_efficiency: float  # achievable fraction of bf16_dense_tflops on large GEMMs
    memory_efficiency: float  # achievable fraction of mem_bandwidth_gb_s on streaming GEMMs
    attention_compute_efficiency: float  # same, for flash-attention prefill (lower than GEMMs)
    attention_memory_efficiency: float  # same, for paged decode attention reading the KV cache
    interconnect_efficiency: float = 0.7  # achievable fraction of interconnect_gb_s (bus bandwidth)
    compute_capability: str = "9.0"  # CUDA SM version; vLLM picks all-reduce limits by it
    nvlink_generation: int | None = None  # None: no NVLink between the GPUs of a node
    nvswitch: bool = False  # every GPU reaches every other at full NVLink speed (fully connected)
    pcie_generation: int = 4  # host link generation
    pcie_lanes: int = 16
    p2p: bool = True  # CUDA peer-to-peer between GPUs (GeForce parts have it disabled)
    fp8_dense_tflops: float | None = None  # 1e12 FLOP/s, dense; None: no FP8 tensor cores
    fp4_dense_tflops: float | None = None  # 1e12 FLOP/s, dense; None: no FP4 tensor cores
    fp8_compute_efficiency: float | None = None  # fraction of fp8_dense_tflops fp8 GEMMs reach
    aliases: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for f in ("memory_gib", "mem_bandwidth_gb_s", "bf16_dense_tflops", "interconnect_gb_s"):
            if not getattr(self, f) > 0:
                raise InputError(f"gpu '{self.name}': {f} must be positive", field=f)
        if self.collective_latency_s < 0:
            raise InputError(f"gpu '{self.name}': collective_latency_s must be >= 0",
                             field="collective_latency_s")
        for f in ("compute_efficiency", "memory_efficiency", "attention_compute_efficiency",
                  "attention_memory_efficiency", "interconnect_efficiency", "fp8_compute_efficiency"):
            if getattr(self, f) is not None and not 0 < getattr(self, f) <= 1:
                raise InputError(f"gpu '{self.name}': {f} must be in (0, 1]", field=f)
        if self.interconnect not in _INTERCONNECTS:
            raise InputError(f"gpu '{self.name}': unknown interconnect {self.interconnect!r}",
                             field="interconnect", allowed=", ".join(_INTERCONNECTS))
        if (self.interconnect == "nvlink") != (self.nvlink_generation is not None):
            raise InputError(f"gpu '{self.name}': interconnect 'nvlink' and nvlink_generation go "
                             "together", field="nvlink_generation")
        if self.pcie_generation not in PCIE_GB_S_PER_LANE or self.pcie_lanes not in (1, 2, 4, 8, 16):
            raise InputError(f"gpu '{self.name}': PCIe gen{self.pcie_generation} x{self.pcie_lanes}",
                             field="pcie_generation", allowed="gen 3-6, x1/x2/x4/x8/x16")

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * 2**30)

    @property
    def peak_flops(self) -> float:  # FLOP/s
        return self.bf16_dense_tflops * 1e12

    @property
    def peak_mem_bytes_per_s(self) -> float:
        return self.mem_bandwidth_gb_s * 1e9

    @property
    def link_bytes_per_s(self) -> float:
        return self.interconnect_gb_s * 1e9

    @property
    def pcie_gb_s(self) -> float:  # one direction, 1e9 B/s
        return PCIE_GB_S_PER_LANE[self.pcie_generation] * self.pcie_lanes

    @property
    def nvlink_fully_connected(self) -> bool:
        """Every GPU of a node reaches every other over NVLink (vLLM's ``fully_connected``)."""
        return self.interconnect == "nvlink" and self.nvswitch


@cache
def _registry() -> tuple[dict[str, GpuSpec], dict[str, str]]:
    raw = load_spec_file(_SPEC_FILE)
    allowed = {f.name for f in fields(GpuSpec)} - {"name"}
    specs: dict[str, GpuSpec] = {}
    lookup: dict[str, str] = {}
    for name, entry in raw.items():
        unknown = set(entry) - allowed
        if unknown:
            raise InputError(f"gpu '{name}': unknown fields {sorted(unknown)}", path=str(_SPEC_FILE),
                             allowed=", ".join(sorted(allowed)))
        entry = dict(entry, aliases=tuple(entry.get("aliases") or ()))
        spec = GpuSpec(name=name, **entry)
        specs[name] = spec
        vendor = spec.vendor_name
        # "NVIDIA H100 80GB HBM3" is also typed without the vendor word.
        names = (name, vendor, vendor.removeprefix("NVIDIA "), *spec.aliases,
                 *(f"nvidia-{a}" for a in spec.aliases), f"nvidia-{name}")
        for alias in names:
            for key in alias_keys(alias):
                lookup.setdefault(key, name)
    return specs, lookup


def available_gpus() -> list[str]:
    return sorted(_registry()[0])


def resolve_gpu(name: str | GpuSpec) -> GpuSpec:
    """Spec for a short id or an alias (case-insensitive; vendor strings, ``h100_sxm``, ...)."""
    if isinstance(name, GpuSpec):
        return name
    specs, lookup = _registry()
    for key in candidates(str(name)):
        if key in lookup:
            return specs[lookup[key]]
    raise InputError(unknown_name_message("gpu", str(name), available_gpus()), field="gpu",
                     allowed=", ".join(available_gpus()))


def find_gpu(name: str) -> GpuSpec | None:
    """Like :func:`resolve_gpu` but returns None for unknown names (importers keep raw labels)."""
    try:
        return resolve_gpu(name)
    except InputError:
        return None
