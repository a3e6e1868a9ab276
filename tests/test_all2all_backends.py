"""vLLM's --all2all-backend: how a data-parallel MoE deployment's dispatch and combine are priced
(simulator/cost_model/moe_comm.py), and the lockstep wave's token total in the MoE layers."""

from pathlib import Path

import pandas as pd
import pytest

from servesim.simulator.cost_model import RooflineParams, StepShape, make_cost_model
from servesim.simulator.cost_model.moe_comm import ALL2ALL_BACKENDS, MoeDeployment, moe_comm
from servesim.simulator.specs import resolve_gpu, resolve_model
from servesim.traces.errors import InputError

AIC = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "gpu_profiles" / "aiconfigurator"
needs_tables = pytest.mark.skipif(not AIC.is_dir(), reason="shared aiconfigurator tables not present")
QWEN = "qwen3-30b-a3b"  # hidden 2048, top-8 of 128 experts, bf16: a shape DeepEP was measured at


def _deployment(tp=1, ep=8, dp=8, gpu="h100", model=QWEN):
    return MoeDeployment(resolve_model(model), resolve_gpu(gpu), tp, ep, dp)


def _between(points: pd.Series, x: float) -> float:
    """Linear interpolation of ``points`` (index: x, values: y) at ``x``, asserting that x lies
    strictly between two measured points (so the test exercises the interpolation)."""
    lo, hi = points[points.index < x], points[points.index > x]
    assert len(lo) and len(hi) and x not in points.index
    x0, y0, x1, y1 = lo.index[-1], lo.iloc[-1], hi.index[0], hi.iloc[0]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def _nccl(op: str, num_gpus: int) -> pd.Series:
    """seconds by message bytes: aiconfigurator's nccl_perf (message_size in half ELEMENTS, ms)."""
    df = pd.read_csv(AIC / "h100_sxm" / "nccl_2.29.2" / "nccl_perf.csv.gz")
    df = df[(df["op_name"] == op) & (df["nccl_dtype"] == "half") & (df["num_gpus"] == num_gpus)]
    s = df.groupby("message_size")["latency"].median()
    return pd.Series(s.to_numpy() * 1e-3, index=s.index.to_numpy() * 2.0)


def _deepep(kind: str) -> pd.DataFrame:
    return pd.read_csv(AIC / "h100_sxm" / "sglang_0.5.12" / f"wideep_deepep_{kind}_perf.csv.gz")


def test_default_backend_is_vllms():
    assert RooflineParams().all2all_backend == "allgather_reducescatter"  # vLLM 0.19.1 ParallelConfig
    cm = make_cost_model("roofline", model=QWEN, gpu="h100", tp=1, data_parallel_size=4, expert_parallel_size=4)
    assert cm.moe_comm_source.startswith("allgather_reducescatter over 4 GPUs")
    one = make_cost_model("roofline", model=QWEN, gpu="h100", tp=1, expert_parallel_size=4)
    assert one.moe_comm_source.startswith("none")  # one DP rank: no dispatch, no combine


def test_unknown_backend_lists_the_valid_ones_with_a_guess():
    with pytest.raises(InputError) as e:
        make_cost_model("roofline", model=QWEN, gpu="h100", all2all_backend="deepep_low_latancy")
    assert e.value.field == "all2all_backend"
    assert "did you mean 'deepep_low_latency'" in str(e.value)
    assert e.value.allowed == ", ".join(ALL2ALL_BACKENDS.names())
    for name in ("allgather_reducescatter", "deepep_low_latency", "deepep_high_throughput"):
        assert name in e.value.allowed


def test_backend_flows_from_scenario_sets():
    from servesim.scenario.model import load_scenario

    base = {"name": "ep", "hardware": {"model": QWEN, "gpu": "h100"},
            "workload": {"generator": "poisson", "num_requests": 4, "arrival": {"rate_per_s": 5},
                         "prompt_len": 50, "output_len": 5}}
    sc = load_scenario(base, sets=["cost_model.params.all2all_backend=deepep_high_throughput"])
    assert sc.variants[0].cfg.cost_model.params["all2all_backend"] == "deepep_high_throughput"
    with pytest.raises(InputError, match="did you mean 'deepep_high_throughput'"):
        load_scenario(base, sets=["cost_model.params.all2all_backend=deepep_high_througput"])


@needs_tables
def test_allgather_reducescatter_reads_the_nccl_tables_at_the_wave_total():
    d = _deployment(ep=4, dp=4)
    comm = moe_comm("allgather_reducescatter", d)
    wave = 700  # tokens of all ranks together; the rank's own count does not matter
    # dispatch: hidden (bf16) + top-k weights (fp32) and ids (int32) of every token, gathered;
    # combine: the expert output (bf16) reduce-scattered. nccl-tests sizes: the gathered buffer,
    # the whole reduce-scatter input.
    gathered, scattered = wave * (2048 * 2 + 8 * 8), wave * 2048 * 2
    want = _between(_nccl("all_gather", 4), gathered) + _between(_nccl("reduce_scatter", 4), scattered)
    assert comm.seconds(10, wave) == pytest.approx(want, rel=1e-9)
    assert comm.seconds(600, wave) == comm.seconds(10, wave)
    # the roofline adds it once per MoE layer: balanced DP prices a rank's 175 tokens at 4 x 175
    cm = make_cost_model("roofline", model=QWEN, gpu="h100", tp=1, data_parallel_size=4, expert_parallel_size=4)
    assert cm.breakdown(StepShape((175,), (0,), 1))["allreduce"] == pytest.approx(48 * want, rel=1e-9)


def test_removed_backends_fall_back_like_vllm_and_dp_without_ep_gathers():
    d = _deployment(ep=4, dp=4)
    ref = moe_comm("allgather_reducescatter", d)
    for name in ("naive", "pplx"):  # vLLM 0.19.1: "has been removed. Falling back to 'allgather_reducescatter'"
        assert moe_comm(name, d).seconds(50, 200) == ref.seconds(50, 200)
    # no --enable-expert-parallel: all-gather + reduce-scatter over the DP group, whatever the backend
    no_ep = moe_comm("deepep_low_latency", _deployment(ep=1, dp=4))
    assert no_ep.source.startswith("allgather_reducescatter over 4 GPUs")
    assert moe_comm("deepep_low_latency", _deployment(ep=8, dp=1)) is None  # EP inside one TP group


@needs_tables
def test_deepep_low_latency_reads_the_ll_table_in_256_token_chunks():
    ll = _deepep("ll")
    ll = ll[(ll["hidden_size"] == 2048) & (ll["num_topk"] == 8) & (ll["num_experts"] == 128) & (ll["node_num"] == 1)]
    us = ll.groupby("num_token")[["dispatch_avg_t_us", "combine_avg_t_us"]].median().sum(axis=1) * 1e-6  # µs!
    comm = moe_comm("deepep_low_latency", _deployment())
    assert comm.source.startswith("deepep_low_latency: measured")
    assert comm.seconds(48, 10_000) == pytest.approx(_between(us, 48), rel=1e-6)
    # 600 tokens a rank: chunks of 256, 256 and 88 (VLLM_MOE_DP_CHUNK_SIZE), each dispatched and combined
    assert comm.seconds(600, 4800) == pytest.approx(2 * us[256] + _between(us, 88), rel=1e-6)
    # TP 2 under EP: sequence-parallel MoE, each of the 8 EP ranks holds half its DP rank's tokens
    sp = moe_comm("deepep_low_latency", _deployment(tp=2, ep=8, dp=4))
    assert sp.seconds(96, 384) == comm.seconds(48, 384)


@needs_tables
def test_deepep_high_throughput_reads_the_normal_table_at_20_sms():
    ht = _deepep("normal")
    ht = ht[(ht["hidden_size"] == 2048) & (ht["num_topk"] == 8) & (ht["num_experts"] == 128)
            & (ht["node_num"] == 1) & (ht["dispatch_sms"] == 20)]  # vLLM DeepEPAll2AllManagerBase.num_sms
    cols = ["dispatch_transmit_us", "dispatch_notify_us", "combine_transmit_us", "combine_notify_us"]
    us = ht.groupby("num_token")[cols].median().sum(axis=1) * 1e-6  # transmit + notify, as moe_a2a.rs
    comm = moe_comm("deepep_high_throughput", _deployment())
    assert comm.seconds(3000, 24_000) == pytest.approx(_between(us, 3000), rel=1e-6)  # no chunking


@needs_tables
def test_deepep_without_a_table_prices_two_alltoalls_of_each_tokens_destination_ranks():
    comm = moe_comm("deepep_high_throughput", _deployment(ep=4, dp=4))  # measured at EP 8 only
    assert "no DeepEP table" in comm.source
    tokens = 300
    ranks = 4 * (1 - (1 - 1 / 4) ** 8)  # distinct EP ranks a token's 8 experts live on (uniform routing)
    want = 2 * _between(_nccl("alltoall", 4), tokens * ranks * 2048 * 2)
    assert comm.seconds(tokens, 1200) == pytest.approx(want, rel=1e-9)


def test_wave_correction_prices_every_rank_at_the_wave_total():
    """Ranks of 100, 200 and 300 tokens in one lockstep wave: each rank's MoE layers hold the
    wave's 600 tokens, so each corrected step equals the balanced step of a deployment whose
    N x own tokens is 600 (same EP group, so the same dispatch/combine), whatever its own count."""
    kw = dict(model=QWEN, gpu="h100", tp=1, expert_parallel_size=2)
    wave = make_cost_model("roofline", data_parallel_size=3, **kw)
    for own in (100, 200, 300):
        shape = StepShape((own,), (0,), 1)
        balanced = make_cost_model("roofline", data_parallel_size=600 // own, **kw)
        corrected = wave.step_time_s(shape) + wave.wave_correction_s(own, 600)
        assert corrected == pytest.approx(balanced.step_time_s(shape), rel=1e-12)
    assert wave.wave_correction_s(200, 600) == 0.0  # balanced already
    assert wave.wave_correction_s(100, 600) > 0 > wave.wave_correction_s(300, 600)
    dense = make_cost_model("roofline", model="llama-3.1-8b", gpu="h100")
    assert dense.wave_correction_s(100, 600) == 0.0
