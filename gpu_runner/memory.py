"""Will it fit? The device memory a model's random weights (and KV cache) need, checked against
what the device has free before anything is allocated: an 8B model in fp32 on a CPU is 32 GB, and
allocating it unchecked ends in the kernel's out-of-memory kill or a torch traceback.

Free memory: on CUDA, `torch.cuda.mem_get_info` (the driver's free bytes); on the CPU, the
kernel's estimate of memory available without swapping (/proc/meminfo MemAvailable, else
sysconf's available pages), bounded by the process's cgroup v2 limit when one is set (a container
sees the host's MemAvailable but is killed at its own limit).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from servesim.gpu_runner.weights import ModelConfig
from servesim.scheduler.errors import InputError

# Of the free memory, the share weights and KV may take: the rest is left for activations, the
# logits of a step and the allocator's rounding (a margin of our own, not a measured figure).
USABLE_FRACTION = 0.9
_MEMINFO = Path("/proc/meminfo")
_CGROUP = Path("/sys/fs/cgroup")


def weight_bytes(config: ModelConfig, dtype: torch.dtype) -> int:
    """Bytes of the model's weights at `dtype` (random_weights allocates exactly these tensors)."""
    return config.num_params() * torch.empty((), dtype=dtype).element_size()


def free_bytes(device: torch.device | str) -> tuple[int, str]:
    """(bytes free on `device`, where that figure comes from)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        free, _total = torch.cuda.mem_get_info(dev)
        return int(free), f"free memory of {dev} (torch.cuda.mem_get_info)"
    available, source = cpu_available_bytes()
    return available, source


def cpu_available_bytes(meminfo: Path = _MEMINFO, cgroup: Path = _CGROUP) -> tuple[int, str]:
    """(bytes of RAM available to this process, where the figure comes from)."""
    available, source = None, ""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available, source = int(line.split()[1]) * 1024, "MemAvailable in /proc/meminfo"
                break
    except (OSError, ValueError, IndexError):
        pass
    if available is None:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        source = "available pages (sysconf)"
    try:
        limit = (cgroup / "memory.max").read_text().strip()
        if limit != "max":
            left = int(limit) - int((cgroup / "memory.current").read_text().strip())
            if left < available:
                available, source = max(left, 0), "the cgroup's memory.max less memory.current"
    except (OSError, ValueError):
        pass
    return available, source


def check_fits(config: ModelConfig, dtype: torch.dtype, device: torch.device | str, kv_bytes: int = 0,
               field: str = "hardware.model") -> None:
    """Refuse, before allocating, weights (+ kv_bytes of KV cache) that exceed USABLE_FRACTION of
    the device's free memory: an InputError with the sizes and what to change."""
    need = weight_bytes(config, dtype) + kv_bytes
    free, source = free_bytes(device)
    if need <= USABLE_FRACTION * free:
        return
    what = f"{_size(weight_bytes(config, dtype))} of {config.name} weights ({dtype_name(dtype)})"
    if kv_bytes:
        what += f" and {_size(kv_bytes)} of KV cache"
    raise InputError(f"{what} do not fit on {torch.device(device)}: {_size(free)} free ({source}); "
                     f"the runner uses at most {USABLE_FRACTION:.0%} of it", field=field,
                     allowed="a smaller model (e.g. tiny-llama), bf16 or fp16 weights (--dtype), a smaller KV pool "
                             "(--set cache.num_gpu_blocks=N), or a device with more free memory")


def _size(num_bytes: int) -> str:
    return f"{num_bytes / 2**30:.1f} GiB" if num_bytes >= 2**30 else f"{num_bytes / 2**20:.1f} MiB"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
