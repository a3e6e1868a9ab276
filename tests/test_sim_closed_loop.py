from __future__ import annotations

import pytest

from servesim.scheduler import CacheConfig, SchedulerConfig
from servesim.simulator.closed_loop import ClosedLoopConfig, run_closed_loop
from servesim.simulator.config import CostModelConfig, SimConfig
from servesim.simulator.cost_model.cpu_overhead import CpuOverheadConfig
from servesim.traces.errors import InputError
import test_sim_engine  # noqa: F401  (registers the test-linear cost model)


def cfg():
    return SimConfig(scheduler=SchedulerConfig(max_model_len=512), cache=CacheConfig(block_size=4, num_gpu_blocks=200),
                     derive_num_gpu_blocks=False,
                     cost_model=CostModelConfig(name="test-linear", cpu_overhead=CpuOverheadConfig.zero()))


def test_one_client_runs_requests_back_to_back():
    res = run_closed_loop(cfg(), ClosedLoopConfig(num_clients=1, prompt_len=8, output_len=2, requests_per_client=3,
                                                  warmup_requests_per_client=1))
    reqs = res.engine.metrics.requests
    assert len(reqs) == 3 and res.measured_ids == ["c0000-0001", "c0000-0002"]
    # Each request: prefill step 5+8 ms, decode step 5+1 ms -> 19 ms; the next starts when it ends.
    assert reqs["c0000-0001"].arrival_s == pytest.approx(reqs["c0000-0000"].finish_s)
    assert reqs["c0000-0002"].finish_s == pytest.approx(3 * 0.019)


def test_concurrency_is_held_constant():
    res = run_closed_loop(cfg(), ClosedLoopConfig(num_clients=4, prompt_len=8, output_len=3, requests_per_client=5))
    steps = res.engine.metrics.steps_frame()
    assert steps["num_running"].max() <= 4 and len(res.engine.metrics.requests) == 20
    assert all(r.finish_s is not None for r in res.engine.metrics.requests.values())


def test_bad_closed_loop_config():
    with pytest.raises(InputError, match="num_clients"):
        ClosedLoopConfig(num_clients=0, prompt_len=8, output_len=2)
