"""Host specs: how the GPUs of one node talk, and the collectives measured there (``hosts.yaml``).

A GPU spec (gpus.py) is the silicon. A host is a machine built from it: the link tensor
parallelism uses inside the node (NVLink generation and NVSwitch, or the PCIe generation and
lanes), whether CUDA peer-to-peer works between its cards (vLLM's custom all-reduce needs it;
NCCL without it goes through host memory), and the collective figures measured on that machine:
per-op (bytes, seconds) tables (inline, or an entry of cost_model/data/collectives.json), or a
measured NCCL bus bandwidth and fixed latency for the ring model. PCIe collectives are a property
of the machine (P2P, ACS/IOMMU, root complex), not of the card, hence a spec of their own.

Every GPU names its default host (``gpus.yaml`` ``default_host``); a run picks another with
``hardware.host``. Hosts register by name (plus aliases) like GPUs; an unknown name is an
InputError with a did-you-mean.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cache
from pathlib import Path
from typing import Any

from servesim.traces.errors import InputError

from ._names import alias_keys, lookup_spec
from ._yaml import load_spec_file
from .gpus import GpuSpec, resolve_gpu

_SPEC_FILE = Path(__file__).with_name("hosts.yaml")
_INTERCONNECTS = ("nvlink", "pcie")
# PCIe payload bandwidth per lane and direction after line coding, 1e9 B/s (PCI-SIG base specs:
# 8/16/32/64 GT/s with 128b/130b coding; gen6 PAM4 + FLIT ~ 64 GT/s x 242/256).
PCIE_GB_S_PER_LANE = {3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
# Measured table names, as collectives.json stores them (nccl-tests' size conventions:
# all-gather by the gathered output, reduce-scatter by the whole input, all-to-all by each rank's
# send buffer; custom_allreduce is vLLM's own kernel, not NCCL).
TABLE_OPS = ("nccl_allreduce", "custom_allreduce", "nccl_alltoall", "nccl_allgather", "nccl_reducescatter")

# (group size, op, ((bytes, seconds), ...)) rows: hashable, so a HostSpec can key caches.
MeasuredRows = tuple[tuple[int, str, tuple[tuple[float, float], ...]], ...]


@dataclass(slots=True, frozen=True)
class HostSpec:
    name: str  # short lowercase id, e.g. "rtx-pro-6000-workstation"
    gpu: str  # the GPU id (gpus.yaml) of every card in the node
    interconnect: str  # "nvlink" or "pcie": the GPU-to-GPU link tensor parallelism uses
    interconnect_gb_s: float  # one direction, per GPU, 1e9 bytes/s (the link's datasheet figure)
    collective_latency_s: float  # fixed cost of one collective in the ring model, seconds
    sources: tuple[str, ...]  # where every figure of this host comes from
    nvlink_generation: int | None = None  # None: no NVLink between the GPUs
    nvswitch: bool = False  # every GPU reaches every other at full NVLink speed (fully connected)
    pcie_generation: int = 4
    pcie_lanes: int = 16
    p2p: bool = True  # CUDA peer-to-peer between the cards works (vLLM's gpu_p2p_access_check)
    # Ring model bandwidth: a measured NCCL bus bandwidth, or the link x an achievable fraction
    # (exactly one of the two).
    bus_bandwidth_gb_s: float | None = None  # 1e9 B/s, nccl-tests' busbw
    interconnect_efficiency: float | None = None  # fraction of interconnect_gb_s
    collective_tables: str | None = None  # entry of cost_model/data/collectives.json measured here
    measured: MeasuredRows = ()  # this host's own tables (hosts.yaml `measured`)
    description: str = ""
    aliases: tuple[str, ...] = ()
    # The node's system memory, GiB, where a datasheet gives it: the most pinned host memory a CPU KV
    # tier can take (simulator/kv_offload.py refuses a larger tier). None: not known, not checked.
    memory_gib: float | None = None

    def __post_init__(self) -> None:
        where = f"host '{self.name}'"
        if self.memory_gib is not None and (isinstance(self.memory_gib, bool)
                                            or not isinstance(self.memory_gib, (int, float)) or self.memory_gib <= 0):
            raise InputError(f"{where}: memory_gib must be a positive number of GiB", field="memory_gib")
        if not self.interconnect_gb_s > 0:
            raise InputError(f"{where}: interconnect_gb_s must be positive", field="interconnect_gb_s")
        if not self.collective_latency_s >= 0:
            raise InputError(f"{where}: collective_latency_s must be >= 0", field="collective_latency_s")
        if self.interconnect not in _INTERCONNECTS:
            raise InputError(f"{where}: unknown interconnect {self.interconnect!r}", field="interconnect",
                             allowed=", ".join(_INTERCONNECTS))
        if (self.interconnect == "nvlink") != (self.nvlink_generation is not None):
            raise InputError(f"{where}: interconnect 'nvlink' and nvlink_generation go together",
                             field="nvlink_generation")
        if self.pcie_generation not in PCIE_GB_S_PER_LANE or self.pcie_lanes not in (1, 2, 4, 8, 16):
            raise InputError(f"{where}: PCIe gen{self.pcie_generation} x{self.pcie_lanes}",
                             field="pcie_generation", allowed="gen 3-6, x1/x2/x4/x8/x16")
        if (self.bus_bandwidth_gb_s is None) == (self.interconnect_efficiency is None):
            raise InputError(f"{where}: give exactly one of bus_bandwidth_gb_s (measured) and "
                             "interconnect_efficiency", field="bus_bandwidth_gb_s")
        if self.bus_bandwidth_gb_s is not None and not self.bus_bandwidth_gb_s > 0:
            raise InputError(f"{where}: bus_bandwidth_gb_s must be positive", field="bus_bandwidth_gb_s")
        if self.interconnect_efficiency is not None and not 0 < self.interconnect_efficiency <= 1:
            raise InputError(f"{where}: interconnect_efficiency must be in (0, 1]",
                             field="interconnect_efficiency")
        if not self.sources:
            raise InputError(f"{where}: every host cites its sources", field="sources")

    @property
    def gpu_spec(self) -> GpuSpec:
        return resolve_gpu(self.gpu)

    @property
    def link_bytes_per_s(self) -> float:
        return self.interconnect_gb_s * 1e9

    @property
    def bus_bytes_per_s(self) -> float:
        """The ring model's achievable bytes/s per GPU and direction (nccl-tests' bus bandwidth)."""
        if self.bus_bandwidth_gb_s is not None:
            return self.bus_bandwidth_gb_s * 1e9
        return self.link_bytes_per_s * self.interconnect_efficiency

    @property
    def pcie_gb_s(self) -> float:  # one direction, 1e9 B/s
        return PCIE_GB_S_PER_LANE[self.pcie_generation] * self.pcie_lanes

    @property
    def nvlink_fully_connected(self) -> bool:
        """Every GPU of the node reaches every other over NVLink (vLLM's ``fully_connected``)."""
        return self.interconnect == "nvlink" and self.nvswitch

    def measured_tables(self, num_gpus: int) -> dict[str, list[list[float]]] | None:
        """This host's own tables for a group of ``num_gpus`` (op -> (bytes, seconds)), or None."""
        out = {op: [list(p) for p in pairs] for n, op, pairs in self.measured if n == num_gpus}
        return out or None


def _measured_rows(name: str, raw: Any) -> MeasuredRows:
    """hosts.yaml ``measured: {group size: {op: [[bytes, seconds], ...]}}`` as hashable rows."""
    where = f"host '{name}': measured"
    if not isinstance(raw, dict):
        raise InputError(f"{where} must map group sizes to tables", path=str(_SPEC_FILE), field="measured")
    rows = []
    for n, ops in raw.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 2 or not isinstance(ops, dict):
            raise InputError(f"{where}: group size {n!r}", path=str(_SPEC_FILE), field="measured",
                             allowed="an integer >= 2 mapping ops to [[bytes, seconds], ...]")
        for op, pairs in ops.items():
            if op not in TABLE_OPS:
                raise InputError(f"{where}: unknown op {op!r}", path=str(_SPEC_FILE), field="measured",
                                 allowed=", ".join(TABLE_OPS))
            try:
                pts = tuple((float(b), float(s)) for b, s in pairs)
            except (TypeError, ValueError):
                raise InputError(f"{where}.{n}.{op}: expected [[bytes, seconds], ...]", path=str(_SPEC_FILE),
                                 field="measured") from None
            if not pts or any(b <= 0 or s <= 0 for b, s in pts) or \
                    any(b1 <= b0 for (b0, _), (b1, _) in zip(pts, pts[1:])):
                raise InputError(f"{where}.{n}.{op}: sizes must be positive and increasing, times positive",
                                 path=str(_SPEC_FILE), field="measured")
            rows.append((n, op, pts))
    return tuple(rows)


@cache
def _registry() -> tuple[dict[str, HostSpec], dict[str, str]]:
    raw = load_spec_file(_SPEC_FILE)
    allowed = {f.name for f in fields(HostSpec)} - {"name"}
    specs: dict[str, HostSpec] = {}
    lookup: dict[str, str] = {}
    for name, entry in raw.items():
        unknown = set(entry) - allowed
        if unknown:
            raise InputError(f"host '{name}': unknown fields {sorted(unknown)}", path=str(_SPEC_FILE),
                             allowed=", ".join(sorted(allowed)))
        entry = dict(entry, aliases=tuple(entry.get("aliases") or ()), sources=tuple(entry.get("sources") or ()),
                     measured=_measured_rows(name, entry.get("measured") or {}))
        spec = HostSpec(name=name, **entry)
        resolve_gpu(spec.gpu)  # a host of an unknown GPU is an error in the spec file
        specs[name] = spec
        for alias in (name, *spec.aliases):
            for key in alias_keys(alias):
                lookup.setdefault(key, name)
    return specs, lookup


def available_hosts() -> list[str]:
    return sorted(_registry()[0])


def resolve_host(name: str | HostSpec) -> HostSpec:
    """Spec for a host id or alias (case-insensitive)."""
    if isinstance(name, HostSpec):
        return name
    specs, lookup = _registry()
    return lookup_spec("host", name, specs, lookup)


def default_host(gpu: str | GpuSpec) -> HostSpec:
    """The host a GPU's runs are priced on unless they name another (gpus.yaml ``default_host``)."""
    return resolve_host(resolve_gpu(gpu).default_host)


def host_for(gpu: str | GpuSpec, host: str | HostSpec | None = None) -> HostSpec:
    """``host`` (default: the GPU's default host), checked to hold this GPU."""
    g = resolve_gpu(gpu)
    if host is None:
        return default_host(g)
    h = resolve_host(host)
    if h.gpu != g.name:
        mine = [n for n, s in _registry()[0].items() if s.gpu == g.name]
        raise InputError(f"host {h.name!r} has {h.gpu} GPUs, not {g.name}", field="host",
                         allowed=", ".join(mine) or "a host of this GPU")
    return h
