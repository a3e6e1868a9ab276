"""Collective communication cost for one parallel group: TP all-reduce and logits all-gather, EP
all-to-all, the all-gather / reduce-scatter of MoE dispatch and combine, PP send/recv.

Collectives are a property of the host (specs/hosts.py: the link, GPU peer-to-peer, and what was
measured there), not of the GPU. Per op, the host's own measured tables first (hosts.yaml
``measured``, or its entry of ``data/collectives.json``: aiconfigurator's NCCL and vLLM custom
all-reduce measurements, rebuilt by ``tools/build_collective_tables.py``), else the ring model at
the host's bus bandwidth and fixed latency. The all-reduce follows vLLM's own path on that host
(``vllm/distributed/device_communicators/cuda_communicator.py`` and ``custom_all_reduce.py``):

* vLLM's custom all-reduce (one-/two-shot over CUDA IPC buffers) runs when the group has 2, 4, 6 or
  8 GPUs, ``disable_custom_all_reduce`` is not set, the GPUs have peer-to-peer access
  (``gpu_p2p_access_check``: "Custom allreduce is disabled because your platform lacks GPU P2P
  capability or P2P test failed"), the group is a pair or fully NVLink-connected ("not supported
  on more than two PCIe-only GPUs"), and the message is smaller than its buffer: 8 MiB, lowered on
  sm90/sm100 (where torch symmetric-memory all-reduce is on) to ``CUSTOM_ALL_REDUCE_MAX_SIZES`` of
  ``all_reduce_utils.py``; it is priced from the host's custom all-reduce table (none measured:
  NCCL's figures, and the source says so);
* otherwise NCCL for every size (symmetric-memory all-reduce on NVLink sm90/sm100 parts is costed
  with the NCCL table: no measurement of it is available here). Without P2P, NCCL's transport
  between two GPUs of a node is SHM (host memory): the host's measured figures carry that.

The all-gather is NCCL's (vLLM gathers the vocab-parallel logits outside the CUDA graph with
``torch.distributed.all_gather_into_tensor``); see :func:`logits_gather_bytes_per_row`. The
reduce-scatter is NCCL's too (the combine of vLLM's ``allgather_reducescatter`` MoE backend:
moe_comm.py). Sizes follow nccl-tests: all-gather by the gathered (output) buffer, reduce-scatter
by the whole input, all-to-all by each rank's send buffer.

Every function returns seconds for ONE call on one GPU. The result is a single piecewise-linear
:class:`Curve` over message bytes per collective so the step-time hot path does one lookup.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from servesim.traces.errors import InputError

from ..specs import GpuSpec, HostSpec, host_for, resolve_gpu
from .interp import Curve

_TABLES = Path(__file__).with_name("data") / "collectives.json"
_MIB = 2**20
_DEFAULT_CUSTOM_AR_MAX_BYTES = 8 * _MIB  # CustomAllreduce(max_size=8192 * 1024)
# vLLM all_reduce_utils.CUSTOM_ALL_REDUCE_MAX_SIZES (applies when symmetric memory is enabled).
_CUSTOM_AR_MAX_WITH_SYMM = {"9.0": {2: 64 * _MIB, 4: 32 * _MIB, 6: _MIB // 2, 8: _MIB // 4},
                            "10.0": {2: 2 * _MIB, 4: 2 * _MIB, 6: _MIB, 8: _MIB}}
_CUSTOM_AR_WORLD_SIZES = (2, 4, 6, 8)
# vLLM vocab_parallel_embedding.py DEFAULT_VOCAB_PADDING_SIZE: the lm_head's rows are padded to it.
_VOCAB_PADDING = 64
# Byte grid for model-based curves: 256 B .. 1 GiB, doubling.
_GRID = tuple(2.0**i for i in range(8, 31))


@dataclass(slots=True, frozen=True)
class CollectiveSource:
    """Where one group's collective costs come from (shown in reports and docs)."""

    allreduce: str  # which path (custom / NCCL) and which figure: "measured ..." or "model: ..."
    alltoall: str
    custom_allreduce_max_bytes: int  # 0: vLLM's custom all-reduce is off for this group
    allgather: str
    reducescatter: str
    host: str = ""  # the host (specs/hosts.yaml) whose figures these are
    custom_allreduce: str = ""  # vLLM's custom all-reduce: "on below N B", or "off: <vLLM's reason>"


def logits_gather_bytes_per_row(vocab_size: int, dtype_bytes: int) -> int:
    """Bytes one sampled row adds to the logits all-gather of a TP > 1 step (the gathered buffer,
    nccl-tests' size convention, as the shipped tables store it).

    vLLM 0.15 ``LogitsProcessor._get_logits`` (model_executor/layers/logits_processor.py) computes
    each rank's [num_sampled, vocab_padded / tp] slice with ``lm_head.quant_method.apply`` in the
    activation dtype and gathers it with ``tensor_model_parallel_all_gather`` (``use_all_gather()``
    is true on CUDA under V1); the vocab is padded to 64 (``pad_vocab_size``) and the padding is cut
    only after the gather, and the cast to fp32 happens later, in the sampler. So a row is
    ``pad64(vocab) x activation bytes``: bf16 logits also for fp8 checkpoints (the lm_head stays
    unquantised)."""
    return -(-vocab_size // _VOCAB_PADDING) * _VOCAB_PADDING * dtype_bytes


def custom_allreduce_rule(host: HostSpec | GpuSpec | str, num_gpus: int,
                          disabled: bool = False) -> tuple[int, str]:
    """(largest message, exclusive, vLLM sends through its custom all-reduce; why): 0 and vLLM's
    reason when it is off for this group (custom_all_reduce.py: world size not 2/4/6/8,
    ``disable_custom_all_reduce``, no GPU P2P, more than two PCIe-only GPUs). A GPU stands for
    its default host."""
    h = _host(host)
    if disabled:
        return 0, "off: disable_custom_all_reduce"
    if num_gpus not in _CUSTOM_AR_WORLD_SIZES:
        return 0, f"off: a group of {num_gpus} (vLLM runs it on 2, 4, 6 or 8 GPUs)"
    if not h.p2p:
        return 0, f"off: no GPU P2P on host {h.name}"
    if num_gpus > 2 and not h.nvlink_fully_connected:
        return 0, "off: more than two PCIe-only GPUs"
    cc = h.gpu_spec.compute_capability
    limit = _DEFAULT_CUSTOM_AR_MAX_BYTES
    if h.interconnect == "nvlink" and cc in _CUSTOM_AR_MAX_WITH_SYMM:
        limit = min(limit, _CUSTOM_AR_MAX_WITH_SYMM[cc][num_gpus])
    return limit, f"on below {limit} B"


def custom_allreduce_max_bytes(host: HostSpec | GpuSpec | str, num_gpus: int, disabled: bool = False) -> int:
    """Largest message (exclusive) vLLM sends through its custom all-reduce; 0 when it is off."""
    return custom_allreduce_rule(host, num_gpus, disabled)[0]


def _host(host: HostSpec | GpuSpec | str) -> HostSpec:
    return host if isinstance(host, HostSpec) else host_for(host)


@cache
def _tables() -> dict[str, Any]:
    try:
        return json.loads(_TABLES.read_text())["gpus"]
    except (OSError, ValueError, KeyError) as exc:
        raise InputError(f"cannot read collective tables ({exc!r})", path=str(_TABLES)) from None


def _table_entry(host: HostSpec) -> dict[str, Any]:
    if host.collective_tables is None:
        return {}
    entry = _tables().get(host.collective_tables)
    if entry is None:
        raise InputError(f"host {host.name!r} names collective tables {host.collective_tables!r}, which "
                         "collectives.json does not hold", path=str(_TABLES), field="collective_tables",
                         allowed=", ".join(sorted(_tables())))
    return entry


def measured_tables(host: HostSpec | GpuSpec | str, num_gpus: int) -> dict[str, list] | None:
    """The host's measured (bytes, seconds) tables for this group size: its own (hosts.yaml
    ``measured``), else its shipped collectives.json entry; None when it has neither."""
    h = _host(host)
    own = h.measured_tables(num_gpus)
    if own is not None:
        return own
    return _table_entry(h).get("num_gpus", {}).get(str(num_gpus))


def table_sources(host: HostSpec | GpuSpec | str) -> list[str]:
    h = _host(host)
    if h.measured:  # cited in full by the host spec (HostSpec.sources)
        return [f"simulator/specs/hosts.yaml {h.name}.measured"]
    return list(_table_entry(h).get("sources", []))


class Collectives:
    """Seconds per call of the collectives of a ``num_gpus`` group of ``gpu`` on ``host`` (default:
    the GPU's default host), following vLLM's choice of all-reduce there."""

    __slots__ = ("gpu", "host", "num_gpus", "source", "allreduce_curve", "alltoall_curve",
                 "allgather_curve", "reducescatter_curve", "_link", "_lat", "_send_recv", "_car")

    def __init__(self, gpu: Any, num_gpus: int, *, host: HostSpec | str | None = None,
                 disable_custom_all_reduce: bool = False, interconnect_efficiency: float | None = None,
                 latency_s: float | None = None, use_tables: bool = True,
                 allreduce_profile: str | Path | None = None,
                 collectives_profile: str | Path | None = None) -> None:
        if not isinstance(num_gpus, int) or isinstance(num_gpus, bool) or num_gpus < 1:
            raise InputError(f"group size must be a positive integer, got {num_gpus!r}",
                             field="num_gpus")
        self.gpu: GpuSpec = resolve_gpu(gpu)
        self.host: HostSpec = host_for(self.gpu, host)
        self.num_gpus = num_gpus
        h = self.host
        # achievable bytes/s per GPU and direction: an explicit efficiency scales the host's link,
        # else the host's measured bus bandwidth (or its link x efficiency)
        self._link = h.bus_bytes_per_s if interconnect_efficiency is None \
            else h.link_bytes_per_s * interconnect_efficiency
        self._lat = h.collective_latency_s if latency_s is None else latency_s
        entry = _table_entry(h)
        self._send_recv = _curve(entry["send_recv"]) if use_tables and entry.get("send_recv") else None
        self._car = custom_allreduce_rule(h, num_gpus, disable_custom_all_reduce)
        tables = measured_tables(h, num_gpus) if use_tables and num_gpus > 1 else None
        if num_gpus == 1:
            zero = Curve([1.0], [0.0], tail_slope=0.0)
            self.allreduce_curve = self.alltoall_curve = self.allgather_curve = zero
            self.reducescatter_curve = zero
            none = "none (one GPU)"
            self.source = CollectiveSource(none, none, 0, none, none, h.name, self._car[1])
            if collectives_profile is not None:  # a pipeline hand-off still leaves the GPU
                self._use_host(collectives_profile, None)
            return
        ar_src = self._set_allreduce(tables, allreduce_profile)
        a2a_src = self._set_group_op("alltoall_curve", tables, "nccl_alltoall", "NCCL alltoall", "pairwise")
        ag_src = self._set_group_op("allgather_curve", tables, "nccl_allgather", "NCCL all_gather", "ring")
        rs_src = self._set_group_op("reducescatter_curve", tables, "nccl_reducescatter",
                                    "NCCL reduce_scatter", "ring")
        self.source = CollectiveSource(ar_src, a2a_src, self._car[0], ag_src, rs_src, h.name, self._car[1])
        if collectives_profile is not None:
            self._use_host(collectives_profile, tables)

    def _set_allreduce(self, tables: dict | None, allreduce_profile: str | Path | None) -> str:
        """The all-reduce curve on vLLM's path, and what it is: custom all-reduce below its buffer
        where vLLM runs it and a measurement of it exists, NCCL (measured, else the ring model)
        for every other size."""
        n, (car_max, car_why), h = self.num_gpus, self._car, self.host
        path = f"vLLM custom all-reduce below {car_max} B, NCCL above" if car_max \
            else f"NCCL only (custom all-reduce {car_why})"
        if allreduce_profile is not None:  # this host's measurement (nccl-tests output, a profile)
            merged = {"nccl_allreduce": host_allreduce_table(allreduce_profile, n),
                      "custom_allreduce": (tables or {}).get("custom_allreduce") or []}
            self.allreduce_curve = self._measured_allreduce(merged, car_max)
            return (f"measured on this host ({Path(allreduce_profile).name}, {n} GPUs)"
                    + (f"; vLLM custom all-reduce below {car_max} B from host {h.name}'s tables"
                       if merged["custom_allreduce"] and car_max else ""))
        if tables and tables.get("nccl_allreduce"):
            self.allreduce_curve = self._measured_allreduce(tables, car_max)
            if car_max and not tables.get("custom_allreduce"):
                path = f"NCCL (vLLM's custom all-reduce would run below {car_max} B; host {h.name} has no " \
                       "measurement of it)"
            return f"measured on host {h.name}: {path} ({', '.join(table_sources(h))})"
        self.allreduce_curve = self._model_curve(2.0 * (n - 1) / n)
        return (f"model: ring, {self._link / 1e9:.2f} GB/s bus bandwidth, {self._lat * 1e6:.1f} us per call "
                f"(host {h.name}, {h.interconnect}); {path}")

    def _set_group_op(self, attr: str, tables: dict | None, key: str, label: str, model: str) -> str:
        """A measured NCCL table of this op where the host has one, else the link model: each GPU
        moves (n-1)/n of the op's bytes over its link (ring all-gather / reduce-scatter, pairwise
        all-to-all)."""
        if tables and tables.get(key):
            setattr(self, attr, _curve(tables[key]))
            return f"measured ({label}, host {self.host.name})"
        setattr(self, attr, self._model_curve((self.num_gpus - 1) / self.num_gpus))
        return f"model: {model}, {self._link / 1e9:.2f} GB/s per GPU (host {self.host.name})"

    def _use_host(self, path: str | Path, tables: dict | None) -> None:
        """This host's measurements (host_collectives.py) in place of every curve the file covers."""
        from dataclasses import replace

        from .host_collectives import host_tables

        host = host_tables(path, self.num_gpus)
        name = Path(path).name
        src = {}
        if "sendrecv" in host:
            self._send_recv = _curve(host["sendrecv"])
        if self.num_gpus == 1:
            return
        if "allreduce" in host:
            merged = {"nccl_allreduce": host["allreduce"],
                      "custom_allreduce": (tables or {}).get("custom_allreduce") or []}
            self.allreduce_curve = self._measured_allreduce(merged, self._car[0])
            src["allreduce"] = f"measured on this host ({name}, {self.num_gpus} GPUs)"
        for op, attr in (("allgather", "allgather_curve"), ("reducescatter", "reducescatter_curve"),
                         ("alltoall", "alltoall_curve")):
            if op in host:
                setattr(self, attr, _curve(host[op]))
                src[op] = f"measured on this host ({name}, {self.num_gpus} GPUs)"
        self.source = replace(self.source, **src)

    def _model_curve(self, traffic_factor: float) -> Curve:
        """lat + traffic_factor * bytes / link: ring all-reduce moves 2(n-1)/n of the message over
        each GPU's link, all-to-all (n-1)/n of each rank's buffer."""
        per_byte = traffic_factor / self._link
        return Curve(list(_GRID), [self._lat + x * per_byte for x in _GRID], tail_slope=per_byte)

    @staticmethod
    def _measured_allreduce(tables: dict, car_max: int) -> Curve:
        nccl = _curve(tables["nccl_allreduce"])
        custom = _curve(tables["custom_allreduce"]) if tables.get("custom_allreduce") else None
        if custom is None or car_max == 0:
            return nccl
        # Below the custom all-reduce buffer: custom; from it on: NCCL (a step at car_max).
        xs = sorted({x for x in custom.xs if x < car_max} | {x for x in nccl.xs if x > car_max}
                    | {car_max - 1.0, float(car_max)})
        ys = [custom(x) if x < car_max else nccl(x) for x in xs]
        return Curve(xs, ys, tail_slope=nccl.tail_slope)

    # ---- per call --------------------------------------------------------------------------
    def allreduce_s(self, nbytes: float) -> float:
        return self.allreduce_curve(nbytes)

    def alltoall_s(self, nbytes_per_rank: float) -> float:
        return self.alltoall_curve(nbytes_per_rank)

    def allgather_s(self, nbytes_gathered: float) -> float:
        """One all-gather whose gathered (output) buffer holds ``nbytes_gathered``."""
        return self.allgather_curve(nbytes_gathered)

    def reducescatter_s(self, nbytes_input: float) -> float:
        """One reduce-scatter of an input buffer of ``nbytes_input`` (each rank keeps 1/n of it)."""
        return self.reducescatter_curve(nbytes_input)

    def logits_gather_curve(self, bytes_per_row: int) -> Curve:
        """The all-gather as a curve over sampled rows (``allgather_curve`` with its byte axis
        divided by ``bytes_per_row``): the step-time hot paths look rows up directly."""
        c = self.allgather_curve
        return Curve([x / bytes_per_row for x in c.xs], c.ys, tail_slope=c.tail_slope * bytes_per_row)

    def send_recv_s(self, nbytes: float) -> float:
        """One pipeline-stage hand-off inside a node: this host's sendrecv rows (collectives_profile),
        else Vidur's measured send/recv (A100, H100), else the point-to-point link model."""
        if self._send_recv is not None:
            return self._send_recv(nbytes)
        return self._lat + nbytes / self._link


def host_allreduce_table(path: str | Path, num_gpus: int) -> list[list[float]]:
    """(bytes, seconds) all-reduce points of a ``num_gpus`` group from a profile file: nccl-tests
    ``all_reduce_perf`` output (importers/nccl_tests.py) or any profile with ``allreduce`` rows
    (``servesim fit`` reads the same files). Repeated sizes keep their fastest time."""
    from .importers import import_profile

    rows = import_profile("auto", Path(path))
    ar = rows[rows["op"] == "allreduce"]
    sizes = sorted({int(t) for t in ar["tp"].dropna()})
    ar = ar[ar["tp"] == num_gpus]
    if ar.empty:
        raise InputError(f"no all-reduce rows for a group of {num_gpus} GPUs", path=str(path),
                         field="allreduce_profile",
                         allowed=", ".join(map(str, sizes)) + " GPUs" if sizes else "all-reduce rows")
    best = ar.groupby("bytes")["latency_s"].min()
    return [[float(b), float(t)] for b, t in best.items() if b > 0]


def _curve(pairs: list[list[float]]) -> Curve:
    return Curve([p[0] for p in pairs], [p[1] for p in pairs])
