"""Data-parallel MoE deployments: vLLM's DP balancer, DP-aware MoE cost, validate settings."""

from pathlib import Path

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
                                               "kv_cache_dtype": "fp8", "quantization": "fp8",
                                               "all2all_backend": "deepep_low_latency"}, "meta.json")
    assert (s.data_parallel_size, s.enable_expert_parallel, s.kv_cache_dtype, s.quantization, s.all2all_backend) == \
        (4, True, "fp8", "fp8", "deepep_low_latency")
    assert _settings_from_kwargs("m", "0.19.0", {}, "meta.json").all2all_backend == "allgather_reducescatter"


def _two_rank_run(lockstep: bool):
    from servesim.scheduler.config import SchedulerConfig
    from servesim.simulator.cost_model.cpu_overhead import CpuOverheadConfig
    from servesim.traces.workload import RequestSpec, Workload

    sim = SimConfig(hardware=HardwareConfig(model="qwen3-30b-a3b", gpu="h100", tp=1),
                    scheduler=SchedulerConfig(async_scheduling=False),
                    cost_model=CostModelConfig(name="roofline", cpu_overhead=CpuOverheadConfig.zero()))
    # Both arrive at 0: the balancer sends "a" to rank 0 (tie -> lowest index), "b" to rank 1
    # (rank 0 now scores 4 x 1 waiting).
    wl = Workload([RequestSpec("a", 0.0, prompt_len=100, output_len=3),
                   RequestSpec("b", 0.0, prompt_len=400, output_len=2)], "two", "test")
    return run_cluster(dp_cluster_config(sim, 2, lockstep=lockstep), wl)


def test_dp_lockstep_waves_last_as_long_as_the_slowest_rank_and_idle_ranks_run_dummies():
    from servesim.simulator.cluster.dp import dummy_shape
    from servesim.simulator.cost_model import StepShape

    cm = make_cost_model("roofline", model="qwen3-30b-a3b", gpu="h100", tp=1,
                         data_parallel_size=2, expert_parallel_size=2)
    t = cm.step_time_s
    pa, pb = t(StepShape((100,), (0,), 1)), t(StepShape((400,), (0,), 1))  # prefills (+1st token)
    da1, da2, db = t(StepShape((1,), (100,), 1)), t(StepShape((1,), (101,), 1)), t(StepShape((1,), (400,), 1))
    dummy = t(dummy_shape())
    assert pb > pa and db > da1 and da2 > dummy > 0

    res = _two_rank_run(lockstep=True)
    req = res.requests.set_index("request_id")
    assert list(req.loc[["a", "b"], "replica"]) == [0, 1]
    # Wave 1: both prefills, both under the largest CUDA-graph size (512): vLLM pads both ranks to
    # the larger one's 400, so both ranks' MoE layers hold 2 x 400 tokens (not 2 x their own).
    fix = cm.wave_correction_s
    assert fix(100, 800) > 0 == fix(400, 800)
    w1 = max(pa + fix(100, 800), pb)
    # Waves 2 and 3 are balanced (one token a rank: a decode or a dummy): nothing to correct.
    assert fix(1, 2) == 0.0
    w2 = max(da1, db)  # wave 2: both decode; b is done (2 tokens)
    w3 = max(da2, dummy)  # wave 3: a decodes, rank 1 runs a dummy batch
    assert req.loc["a", "ttft_s"] == pytest.approx(w1, rel=1e-12)
    assert req.loc["b", "ttft_s"] == pytest.approx(w1, rel=1e-12)
    assert req.loc["b", "e2e_s"] == pytest.approx(w1 + w2, rel=1e-12)
    assert req.loc["a", "e2e_s"] == pytest.approx(w1 + w2 + w3, rel=1e-12)
    steps = res.steps
    assert sorted(steps.groupby("replica").size()) == [2, 3]  # rank 1's dummy is not an engine step
    assert sorted(round(x, 12) for x in steps["gpu_time_s"]) == \
        sorted(round(x, 12) for x in (w1, w1, w2, w2, w3))

    # Without lockstep each rank runs at its own pace: rank 0 finishes after its own three steps.
    free = _two_rank_run(lockstep=False).requests.set_index("request_id")
    assert free.loc["a", "e2e_s"] == pytest.approx(pa + da1 + da2, rel=1e-12)
    assert free.loc["b", "e2e_s"] == pytest.approx(pb + db, rel=1e-12)


def test_wave_tokens_pad_to_the_largest_ranks_graph_size_as_vllm():
    from servesim.simulator.cluster.dp import wave_tokens
    from servesim.simulator.cost_model.cudagraph import default_capture_sizes

    sizes = default_capture_sizes(256, 2048)  # 1, 2, 4, 8, ..., 248, 256, 272, ..., 512
    assert wave_tokens(sizes, [1, 1]) == 2
    assert wave_tokens(sizes, [3, 1, 1, 1]) == 4 * 4  # every rank padded to the graph of 3 tokens: 4
    assert wave_tokens(sizes, [100, 400]) == 800
    assert wave_tokens(sizes, [100, 401]) == 2 * 416
    assert wave_tokens(sizes, [100, 513]) == 613  # a rank past the largest graph: no padding anywhere
    assert wave_tokens((), [100, 400]) == 500


def test_lockstep_groups_in_cluster_yaml():
    from servesim.simulator.cluster import cluster_config_from_dict, cluster_config_to_dict

    cfg = cluster_config_from_dict({"replicas": [{"count": 2, "name": "dp", "lockstep": True}]})
    assert cfg.replicas[0].lockstep is True
    assert cluster_config_from_dict(cluster_config_to_dict(cfg)) == cfg
    assert dp_cluster_config(SimConfig(), 2).replicas[0].lockstep is True
    assert dp_cluster_config(SimConfig(), 2, lockstep=False).replicas[0].lockstep is False
    with pytest.raises(InputError):
        cluster_config_from_dict({"replicas": [{"count": 2, "role": "prefill", "lockstep": True}],
                                  "pd": {}})
    with pytest.raises(InputError):
        cluster_config_from_dict({"replicas": [{"count": 2, "lockstep": "yes"}]})


_RTX_RUN = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "benchmarks" / "llmservingsim_vllm_runs" \
    / "RTXPRO6000_Llama-3.1-8B"


@pytest.mark.skipif(not _RTX_RUN.is_dir(), reason="shared vLLM run not present")
def test_validate_prices_expert_parallelism_with_the_roofline():
    """A run with expert parallelism on an MoE model: the roofline splits the experts over the TP
    ranks; a cost model that cannot price it falls back to the roofline, not run without it."""
    import dataclasses

    from servesim.simulator.validation.replay import ValidateOptions, build_config
    from servesim.simulator.validation.runs import load_run

    run = load_run(_RTX_RUN, "auto")
    ep = dataclasses.replace(run, settings=dataclasses.replace(run.settings, enable_expert_parallel=True, tp=2))
    cfg, _ = build_config(ep, ValidateOptions(model="qwen3-30b-a3b", cost_model="roofline"))
    assert cfg.cost_model.params["expert_parallel_size"] == 2
    cfg, info = build_config(ep, ValidateOptions(model="qwen3-30b-a3b", cost_model="calibrated"))
    assert cfg.cost_model.name == "roofline" and cfg.cost_model.params["expert_parallel_size"] == 2
    assert info["cost_model"]["fallback"]["from"] == "calibrated"
    cfg, _ = build_config(ep, ValidateOptions(cost_model="roofline"))  # a dense model: vLLM ignores the flag
    assert "expert_parallel_size" not in cfg.cost_model.params
    # data parallelism: the run's --all2all-backend reaches the ranks' cost model
    dp = dataclasses.replace(run, settings=dataclasses.replace(
        run.settings, enable_expert_parallel=True, data_parallel_size=2, all2all_backend="deepep_high_throughput"))
    cfg, _ = build_config(dp, ValidateOptions(model="qwen3-30b-a3b", cost_model="roofline"))
    assert cfg.cost_model.params["all2all_backend"] == "deepep_high_throughput"


def test_dp_ranks_hold_their_share_of_the_experts_as_vllm_shards_them():
    """vLLM shards the routed experts over the whole DP group (tp x dp GPUs): whole experts with
    expert parallelism, every expert's width without it (TP flattened across DP). So a DP rank's
    GPUs hold 1/(tp x dp) of the expert weights, which sizes its KV pool, and its MoE kernels run
    at moe_tp = tp x dp without EP."""
    from servesim.simulator.kv_capacity import derive_num_gpu_blocks
    from servesim.simulator.specs import resolve_gpu, resolve_model
    from servesim.simulator.specs.models import kv_bytes_per_token, layer_weight_elems, weight_bytes

    m = resolve_model("qwen3-30b-a3b")
    experts = m.num_moe_layers * layer_weight_elems(m, 1)["experts"] * 2  # bf16 bytes at tp 1
    assert weight_bytes(m, 1, 4) == pytest.approx(weight_bytes(m, 1) - experts * 3 / 4, abs=m.num_moe_layers * 4)
    assert weight_bytes(m, 2, 2) == weight_bytes(m, 2)
    with pytest.raises(InputError):
        weight_bytes(m, 2, 3)
    g = resolve_gpu("h100")
    want = int((0.9 * g.memory_bytes - weight_bytes(m, 1, 4) - 2 * 2**30) // (kv_bytes_per_token(m, 1) * 16))
    assert derive_num_gpu_blocks("qwen3-30b-a3b", "h100", 1, 16, 0.9, 2.0, data_parallel_size=4).num_gpu_blocks == want
    # every rank of a DP deployment derives its pool that way
    sim = SimConfig(hardware=HardwareConfig(model="qwen3-30b-a3b", gpu="h100", tp=1),
                    cost_model=CostModelConfig(name="roofline"))
    from servesim.simulator.startup import resolve_cache
    (group,) = dp_cluster_config(sim, 4).replicas
    assert resolve_cache(group.sim)[0].num_gpu_blocks == want > resolve_cache(sim)[0].num_gpu_blocks
    for kw, layout in ((dict(tp=1, data_parallel_size=2), "moe_tp=2 moe_ep=1"),
                       (dict(tp=2, data_parallel_size=2), "moe_tp=4 moe_ep=1"),
                       (dict(tp=1, data_parallel_size=4, expert_parallel_size=4), "moe_tp=1 moe_ep=4")):
        assert layout in make_cost_model("roofline", model="qwen3-30b-a3b", gpu="h100", **kw).moe_source
