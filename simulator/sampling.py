"""The requests' sampling parameters and what vLLM's sampler path costs beyond the cost model.

The cost models price the sampler as vLLM runs it with neutral parameters (temperature 1, no
top-k / top-p): a few passes over each sampled row's fp32 logits. vLLM 0.15 - 0.19 take a
different path once any request of the batch asks for top-p (``vllm/v1/sample/ops/
topk_topp_sampler.py``: ``forward_native`` -> ``apply_top_k_top_p``; the FlashInfer sampler is
off unless ``VLLM_USE_FLASHINFER_SAMPLER=1``): the whole ``[rows, vocab]`` fp32 logits are sorted
with ``torch.sort`` (below 128 rows PyTorch runs two full radix sorts over every element,
``segmented_sort_pairs_by_full_sort``), then softmax, cumsum, mask and scatter back. That work
runs eagerly after the CUDA-graphed forward, once per step, on every sampled row, and grows with
rows x vocab.

Cost of that path (the only one priced here), per logit element on an H100, scaled to other GPUs
by memory bandwidth. PyTorch sorts fewer than 128 rows with two full radix sorts and 128 or more
with CUB's segmented sort, so there are two figures, each the median of the eight PyTorch rows
that take the sort (top-p and top-k + top-p, whole and partial batches) in the H100 table of vLLM
pull request #33538 (vocabulary 32,768): 48 and 56 rows, 0.214 - 1.650 ns per element, median
0.272 ns; 512 and 1,024 rows, 0.126 - 0.179 ns, median 0.138 ns. docs/COST_MODELS.md ("Sampler")
lists the rows. Not priced, for want of a measurement: the path's fixed cost per step (launches;
small next to the per-row part from a few rows up), top-k alone (``apply_top_k_only``, a ``topk``
instead of a sort), min-p, and the repetition / presence / frequency penalties (two
``[rows, vocab + 1]`` bincounts a step, and a CPU-side padded tensor of every request's output ids).

Greedy requests (temperature 0) skip all of it: vLLM resets top-p / top-k for them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from servesim.traces.errors import InputError

from .specs import resolve_gpu, resolve_model

if TYPE_CHECKING:  # config.py imports this module
    from .config import SimConfig

# Median seconds per logit element of the sort path in vLLM PR #33538's H100 table (module docstring),
# below 128 rows (PyTorch's segmented_sort_pairs_by_full_sort) and from 128 rows (CUB segmented sort).
SORT_S_PER_LOGIT_H100 = 0.2718e-9
SORT_S_PER_LOGIT_H100_FROM_128_ROWS = 0.1377e-9
_SEGMENTED_SORT_ROWS = 128  # PyTorch's launch_stable_sort_kernel switches algorithm here
_H100_BANDWIDTH_BYTES_PER_S = 3.35e12  # the GPU that table was measured on (H100 SXM, HBM3)
_SAMPLING_EPS = 1e-5  # vLLM: a temperature below this is greedy sampling


@dataclass(slots=True, frozen=True)
class SamplingConfig:
    """The sampling parameters every request runs with: what the client sends over the server's
    defaults (vLLM ``--generation-config``). The defaults are vLLM's neutral ones; fields mirror
    vLLM's ``SamplingParams`` and its ranges. ``top_k`` 0 or -1 means off."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    def __post_init__(self) -> None:
        for name in ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                     "frequency_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise InputError(f"got {value!r}", field=f"sampling.{name}", allowed="a finite number")
        if self.temperature < 0:
            raise InputError(f"got {self.temperature!r}", field="sampling.temperature", allowed=">= 0 (0: greedy)")
        if not 0 < self.top_p <= 1:
            raise InputError(f"got {self.top_p!r}", field="sampling.top_p", allowed="0 < top_p <= 1 (1: off)")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < -1:
            raise InputError(f"got {self.top_k!r}", field="sampling.top_k",
                             allowed="an integer >= 1, or 0 / -1 (off)")
        if not 0 <= self.min_p <= 1:
            raise InputError(f"got {self.min_p!r}", field="sampling.min_p", allowed="0 .. 1")
        if self.repetition_penalty <= 0:
            raise InputError(f"got {self.repetition_penalty!r}", field="sampling.repetition_penalty",
                             allowed="> 0 (1: off)")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise InputError(f"got {getattr(self, name)!r}", field=f"sampling.{name}", allowed="-2 .. 2")

    @property
    def path(self) -> str:
        """Which sampler path vLLM takes: greedy | random | top_k | sort (top-p, with or without
        top-k). Greedy ignores top-p / top-k, as vLLM resets them for temperature 0."""
        if self.temperature < _SAMPLING_EPS:
            return "greedy"
        if self.top_p < 1.0:
            return "sort"
        return "top_k" if self.top_k > 0 else "random"


@dataclass(slots=True, frozen=True)
class SamplerCost:
    """Seconds per sampled row the requests' sampler path adds to the cost model's neutral
    sampler, below and from 128 rows; zero for every path but the sort."""

    s_per_row: float = 0.0
    s_per_row_from_128: float = 0.0

    def seconds(self, num_rows: int) -> float:
        """Extra seconds of a step that samples num_rows rows (0.0 when nothing is priced)."""
        if num_rows < _SEGMENTED_SORT_ROWS:
            return num_rows * self.s_per_row
        return num_rows * self.s_per_row_from_128


def sampler_cost(sampling: SamplingConfig, vocab_size: int, mem_bandwidth_bytes_per_s: float) -> SamplerCost:
    """What the sampler path adds: the sort path's measured per-logit time over the full
    vocabulary, scaled from the H100 by memory bandwidth; nothing for every other path (see the
    module docstring for what is not priced)."""
    if sampling.path != "sort":
        return SamplerCost()
    scale = vocab_size * _H100_BANDWIDTH_BYTES_PER_S / mem_bandwidth_bytes_per_s
    return SamplerCost(SORT_S_PER_LOGIT_H100 * scale, SORT_S_PER_LOGIT_H100_FROM_128_ROWS * scale)


def sampler_cost_for(cfg: SimConfig) -> SamplerCost:
    """:func:`sampler_cost` for a SimConfig's sampling, model and GPU."""
    if cfg.sampling.path != "sort":  # the common case resolves no spec
        return SamplerCost()
    hw = cfg.hardware
    return sampler_cost(cfg.sampling, resolve_model(hw.model).vocab_size, resolve_gpu(hw.gpu).peak_mem_bytes_per_s)
