"""Accelerator specs: datasheet peaks plus achievable-efficiency factors (see ``gpus.yaml``)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cache
from pathlib import Path

from servesim.traces.errors import InputError

from ._names import alias_keys, lookup_spec
from ._yaml import load_spec_file

_SPEC_FILE = Path(__file__).with_name("gpus.yaml")
# How the GPUs of a node talk is the host's (hosts.py), not the silicon's.
_HOST_FIELDS = ("interconnect", "interconnect_gb_s", "interconnect_efficiency", "collective_latency_s",
                "nvlink_generation", "nvswitch", "pcie_generation", "pcie_lanes", "p2p")


@dataclass(slots=True, frozen=True)
class GpuSpec:
    name: str  # short lowercase id, e.g. "h100"
    vendor_name: str  # the device string nvidia-smi / torch report
    memory_gib: float  # device memory, GiB (2**30 bytes)
    mem_bandwidth_gb_s: float  # peak DRAM bandwidth, 1e9 bytes/s
    bf16_dense_tflops: float  # peak dense bf16 tensor throughput, 1e12 FLOP/s
    default_host: str  # the host (hosts.yaml) its runs are priced on unless they name another
    compute_efficiency: float  # achievable fraction of bf16_dense_tflops on large GEMMs
    memory_efficiency: float  # achievable fraction of mem_bandwidth_gb_s on streaming GEMMs
    attention_compute_efficiency: float  # same, for flash-attention prefill (lower than GEMMs)
    attention_memory_efficiency: float  # same, for paged decode attention reading the KV cache
    compute_capability: str = "9.0"  # CUDA SM version; vLLM picks all-reduce limits by it
    fp8_dense_tflops: float | None = None  # 1e12 FLOP/s, dense; None: no FP8 tensor cores
    fp4_dense_tflops: float | None = None  # 1e12 FLOP/s, dense; None: no FP4 tensor cores
    fp8_compute_efficiency: float | None = None  # fraction of fp8_dense_tflops fp8 GEMMs reach
    aliases: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for f in ("memory_gib", "mem_bandwidth_gb_s", "bf16_dense_tflops"):
            if not getattr(self, f) > 0:
                raise InputError(f"gpu '{self.name}': {f} must be positive", field=f)
        for f in ("compute_efficiency", "memory_efficiency", "attention_compute_efficiency",
                  "attention_memory_efficiency", "fp8_compute_efficiency"):
            if getattr(self, f) is not None and not 0 < getattr(self, f) <= 1:
                raise InputError(f"gpu '{self.name}': {f} must be in (0, 1]", field=f)

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * 2**30)

    @property
    def peak_flops(self) -> float:  # FLOP/s
        return self.bf16_dense_tflops * 1e12

    @property
    def peak_mem_bytes_per_s(self) -> float:
        return self.mem_bandwidth_gb_s * 1e9


@cache
def _registry() -> tuple[dict[str, GpuSpec], dict[str, str]]:
    raw = load_spec_file(_SPEC_FILE)
    allowed = {f.name for f in fields(GpuSpec)} - {"name"}
    specs: dict[str, GpuSpec] = {}
    lookup: dict[str, str] = {}
    for name, entry in raw.items():
        moved = sorted(set(entry) & set(_HOST_FIELDS))
        if moved:
            raise InputError(f"gpu '{name}': {moved} describe a host, not the GPU: give them to a host spec "
                             "(simulator/specs/hosts.yaml) and name it as the GPU's default_host",
                             path=str(_SPEC_FILE), field=moved[0], allowed="default_host")
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
    return lookup_spec("gpu", name, specs, lookup)


def find_gpu(name: str) -> GpuSpec | None:
    """Like :func:`resolve_gpu` but returns None for unknown names (importers keep raw labels)."""
    try:
        return resolve_gpu(name)
    except InputError:
        return None
