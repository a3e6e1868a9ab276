"""CPU time the engine spends per step outside the GPU forward pass.

Model: ``fixed_s + per_request_s * scheduled_requests + per_token_s * scheduled_tokens``.

Derivation of the defaults (vLLM v0.6.0 performance blog, rows ``vllm_blog_v060`` of
``/work/shared/data/benchmarks/published_serving_benchmarks.csv``):

* Llama-3-8B on one H100 generates one token every ~13 ms under light load (one decode step).
* Profiling of v0.5.3 split the time as 33 % HTTP API server, 29 % scheduling + input preparation +
  gathering last step's results, 38 % GPU execution.
* GPU share: 0.38 * 13 ms = 4.9 ms. Cross-check: streaming the 16.06 GB of bf16 weights at the
  H100's 3.35 TB/s takes 4.8 ms, so the split is consistent with a weight-bound decode step.
* The engine's own CPU work is the 29 %: 0.29 * 13 ms = 3.8 ms per step. The API-server share runs
  in a separate process since v0.6.0 (overlapped with the engine), so it is not charged per step.
* Split of the 3.8 ms: Python bookkeeping per scheduled request (sequence-group state, block
  tables, sampling metadata, detokenisation) is typically tens of microseconds, so we charge
  50 us/request; building per-token input tensors (positions, slot mapping) costs about 1 us per
  token. "Light load" is taken as ~8 running requests: 8 * (50 + 1) us = 0.4 ms, which leaves a
  fixed 3.4 ms per step.

These are pre-V1 (v0.5/v0.6) engine overheads; V1 with async scheduling overlaps much of this with
GPU work. Use :meth:`CpuOverheadConfig.zero` for GPU-only studies, or calibrate the three numbers
from microbenchmarks of the scheduler (docs/FIDELITY.md section 4) -- never from the end-to-end
latencies a validation compares against.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from servesim.traces.errors import InputError

from .base import StepShape


@dataclass(slots=True, frozen=True)
class CpuOverheadConfig:
    fixed_s: float = 3.4e-3  # per engine step, seconds
    per_request_s: float = 50e-6  # per scheduled request, seconds
    per_token_s: float = 1e-6  # per scheduled (new) token, seconds

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value < 0:
                raise InputError(f"cpu overhead: {f.name} must be a finite number >= 0, got {value!r}",
                                 field=f.name)

    @classmethod
    def zero(cls) -> "CpuOverheadConfig":
        return cls(0.0, 0.0, 0.0)

    def step_s(self, num_requests: int, num_tokens: int) -> float:
        """CPU seconds for a step that schedules ``num_requests`` requests and ``num_tokens`` tokens."""
        return self.fixed_s + self.per_request_s * num_requests + self.per_token_s * num_tokens


def cpu_overhead_s(config: CpuOverheadConfig, shape: StepShape) -> float:
    """CPU seconds charged for one step of this shape."""
    return config.step_s(len(shape.num_new_tokens), sum(shape.num_new_tokens))
