"""A GPU's architecture generation, from its CUDA compute capability (gpus.yaml).

Measured kernel behaviour (the MoE efficiency curves, simulator/cost_model/moe_tables.py) carries
over between GPUs of one generation: the same tensor-core instructions and kernel code paths,
different clocks and memory. Compute capabilities per NVIDIA's CUDA GPU list
(https://developer.nvidia.com/cuda-gpus): 8.0/8.6/8.7 Ampere, 8.9 Ada Lovelace, 9.0 Hopper,
10.x Blackwell (B200/B300, sm100), 12.x Blackwell (RTX PRO 6000 / RTX 50, sm120: a different
part from sm100, without its tcgen05 tensor-core instructions, so vLLM runs other kernels).
"""

from __future__ import annotations

_GENERATIONS = {8: "Ampere", 9: "Hopper", 10: "Blackwell", 12: "Blackwell"}


def compute_capability(gpu) -> tuple[int, int]:
    """(major, minor) of the GPU spec's ``compute_capability`` string ("9.0" -> (9, 0))."""
    major, _, minor = str(gpu.compute_capability).partition(".")
    return int(major), int(minor or 0)


def gpu_generation(gpu) -> str:
    """Ampere, Ada, Hopper or Blackwell (sm100 and sm120 alike; :func:`compute_capability` tells them
    apart); "sm<major><minor>" for an architecture not listed."""
    major, minor = compute_capability(gpu)
    if (major, minor) == (8, 9):
        return "Ada"
    return _GENERATIONS.get(major, f"sm{major}{minor}")
