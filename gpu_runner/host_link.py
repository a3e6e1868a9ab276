"""Host <-> GPU copies: the link a CPU KV tier moves blocks over (vLLM's OffloadingConnector, SGLang's
HiCache), measured on this machine for `servesim calibrate --host-link`.

For each size, a pinned host buffer and a device buffer of that many bytes; one sample times `calls`
back-to-back copies in one direction between CUDA events on the copy's own stream (as the offload
handlers copy on streams of their own) and divides; the median of `samples` samples is kept. On the
CPU (tests only) the "copy" is a memcpy between two host buffers timed with perf_counter: its
figures say nothing about a GPU's link.

Rows follow the profile schema (docs/PROFILE_SCHEMA.md): op ``h2d_copy`` / ``d2h_copy``, ``bytes``,
``latency_s`` (one copy), ``algbw_gb_s`` (bytes / latency). `fit_link` turns a direction's rows into
the two figures the simulated tiers take: a per-copy latency and a bandwidth, the least-squares line
of time against bytes (`kv_offload.transfer_latency_s` / `kv_offload.host_link_bytes_per_s`, and
`sglang.hicache`'s of the same names).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

DIRECTIONS = ("h2d_copy", "d2h_copy")


@dataclass(slots=True, frozen=True)
class HostLinkGrid:
    sizes_bytes: tuple[int, ...] = tuple(64 * 1024 * 4**k for k in range(8))  # 64 KiB .. 1 GiB
    calls: int = 20
    samples: int = 5

    @classmethod
    def quick(cls) -> HostLinkGrid:
        return cls(sizes_bytes=(64 * 1024, 4 * 2**20, 64 * 2**20), calls=3, samples=3)


def measure_host_link(device: str, grid: HostLinkGrid, gpu_label: str) -> list[dict]:
    """One row per direction and size (module docstring)."""
    dev = torch.device(device)
    rows = []
    for size in grid.sizes_bytes:
        host = torch.empty(size, dtype=torch.uint8, pin_memory=dev.type == "cuda")
        gpu = torch.empty(size, dtype=torch.uint8, device=dev)
        for op in DIRECTIONS:
            src, dst = (host, gpu) if op == "h2d_copy" else (gpu, host)
            latency_s = statistics.median(_sample(src, dst, dev, grid.calls) for _ in range(grid.samples))
            rows.append({"op": op, "bytes": size, "latency_s": latency_s, "algbw_gb_s": size / latency_s / 1e9,
                         "gpu": gpu_label, "device": _device_name(dev), "source": "servesim"})
        del host, gpu
    return rows


def _sample(src: torch.Tensor, dst: torch.Tensor, dev: torch.device, calls: int) -> float:
    """Seconds per copy over `calls` back-to-back copies."""
    if dev.type != "cuda":
        t0 = time.perf_counter()
        for _ in range(calls):
            dst.copy_(src)
        return (time.perf_counter() - t0) / calls
    stream = torch.cuda.Stream(dev)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        dst.copy_(src, non_blocking=True)  # warm-up
        start.record(stream)
        for _ in range(calls):
            dst.copy_(src, non_blocking=True)
        end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / calls


def _device_name(dev: torch.device) -> str:
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"


def fit_link(rows: list[dict], op: str) -> tuple[float, float]:
    """(latency per copy in s, bytes per s) of one direction: the least-squares line of latency_s
    against bytes over its rows (at least two sizes). A negative intercept (noise at small sizes)
    is taken as 0."""
    pts = [(float(r["bytes"]), float(r["latency_s"])) for r in rows if r["op"] == op]
    if len({b for b, _ in pts}) < 2:
        raise ValueError(f"{op}: at least two sizes are needed to fit a line, got {len(pts)} row(s)")
    mx, my = statistics.fmean(b for b, _ in pts), statistics.fmean(t for _, t in pts)
    slope = sum((b - mx) * (t - my) for b, t in pts) / sum((b - mx) ** 2 for b, _ in pts)
    if slope <= 0:
        raise ValueError(f"{op}: copy time does not grow with size; the measurement is noise")
    return max(my - slope * mx, 0.0), 1.0 / slope
