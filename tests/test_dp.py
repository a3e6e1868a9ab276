"""Data-parallel MoE deployments: vLLM's DP balancer, DP-aware MoE cost, validate settings."""

import pytest

from servesim.simulator.cluster import run_cluster
from servesim.simulator.cluster.dp import dp_cluster_config
from servesim.simulator.config import CostModelConfig, HardwareConfig, SimConfig
from servesim.simulator.cost_model import decode_shape, make_cost_model
from servesim.simulator.validation.runs import _settings_from_kwargs
from servesim.traces.bundled import load_bundled
from servesim.traces.errors import InputError
from servesim.traces.transforms import rate_scale, request_limit


def test_dp_ranks_share_expert_work_and_pay_the_all_to_all():
    one = make_cost_model("roofline", model="qwen3-30b-a3b", gpu="h100", tp=1)
    dp4 = make_cost_model("roofline", model="qwen3-30b-a3b", gpu="h100", tp=1,
                          data_parallel_size=4, expert_parallel_size=4)
    s = decode_shape(64, 1000)
    assert dp4.breakdown(s)["allreduce"] > 0  # dispatch + combine, though tp = 1
    assert dp4.step_time_s(s) != one.step_time_s(s)


def test_dp_cluster_balances_requests_over_ranks():
    sim = SimConfig(hardware=HardwareConfig(model="qwen3-30b-a3b", gpu="h100", tp=1),
                    cost_model=CostModelConfig(name="roofline"))
    wl = rate_scale(request_limit(load_bundled(), 40), 4.0)
    res = run_cluster(dp_cluster_config(sim, 2), wl)
    per_rank = res.requests.groupby("replica").size()
    assert len(per_rank) == 2 and per_rank.min() >= 15
    with pytest.raises(InputError):
        dp_cluster_config(SimConfig(cost_model=CostModelConfig(name="calibrated")), 2)


def test_run_metadata_carries_dp_ep_and_precision():
    s = _settings_from_kwargs("m", "0.19.0", {"data_parallel_size": 4, "enable_expert_parallel": True,
                                               "kv_cache_dtype": "fp8", "quantization": "fp8"}, "meta.json")
    assert (s.data_parallel_size, s.enable_expert_parallel, s.kv_cache_dtype, s.quantization) == \
        (4, True, "fp8", "fp8")
