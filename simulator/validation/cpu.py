"""CPU-overhead presets for validation replays (``--cpu-overhead NAME``).

* ``calibrated`` (default): vLLM 0.19.1's own scheduler, microbenchmarked
  (``benchmarks/validate_cpu_overhead.py``: the real ``AsyncScheduler`` from the oracle venv,
  ``schedule()`` + ``update_from_output()`` per step at batch sizes 1-256 and with full prefill
  chunks, fitted as fixed + per request + per token). It is a lower bound of the engine's CPU work:
  input preparation and the sampler's CPU side were not microbenchmarked. No end-to-end latency
  entered it.
* ``default``: the project default (pre-V1, vLLM v0.6.0 blog, simulator/cost_model/cpu_overhead.py).
* ``zero``: GPU time only.

With async scheduling (vLLM >= 0.14 default) the engine overlaps this CPU time with the previous
step's GPU work, so it only shows when it exceeds a step's GPU time.
"""

from __future__ import annotations

from servesim.simulator.cost_model.cpu_overhead import CpuOverheadConfig
from servesim.traces.errors import InputError

# benchmarks/validate_cpu_overhead.py on this project's 2-core build machine, vLLM 0.19.1
# AsyncScheduler, schedule() + update_from_output() per step (ms, quiet run):
#   1 req 0.15 | 8 req 0.19 | 32 req 0.38 | 126 req 3.64 | 247 req 7.05 | 3 req + 1944 prefill tok 0.47
# Non-negative least squares: fixed 0, 28.1 us per request, 0.20 us per token (residuals <= 0.53 ms).
CALIBRATED = CpuOverheadConfig(fixed_s=0.0, per_request_s=28e-6, per_token_s=0.2e-6)
CALIBRATION_NOTE = "vLLM 0.19.1 AsyncScheduler microbenchmark (benchmarks/validate_cpu_overhead.py)"

PRESETS = {
    "calibrated": CALIBRATED,
    "default": CpuOverheadConfig(),
    "zero": CpuOverheadConfig.zero(),
}


def cpu_overhead_preset(name: str) -> CpuOverheadConfig:
    if name not in PRESETS:
        raise InputError(f"unknown cpu overhead preset {name!r}", field="--cpu-overhead",
                         allowed=", ".join(PRESETS))
    return PRESETS[name]
