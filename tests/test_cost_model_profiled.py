"""The profiled cost model: every importer on its real upstream file, the fit (held-out error
bounds, exact composition of the tables), persistence and the error paths."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pandas as pd
import pytest

from servesim.simulator.cost_model import StepShape, decode_shape, make_cost_model, prefill_shape
from servesim.simulator.cost_model.fit import fit, fit_main, format_fit_report, load_profiles
from servesim.simulator.cost_model.fitted import FittedCostModel
from servesim.simulator.cost_model.importers import available_importers, detect_source, import_profile
from servesim.simulator.cost_model.profile_schema import make_profile, read_profile, validate_profile, \
    write_profile
from servesim.traces.errors import InputError

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "gpu_profiles"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"{SHARED} (shared data) is absent")
AIC_H100 = SHARED / "aiconfigurator" / "h100_sxm" / "vllm_0.14.0"
LSS = SHARED / "llmservingsim" / "vllm_0.19_profiler"
RTXPRO_8B = LSS / "RTXPRO6000" / "meta-llama" / "Llama-3.1-8B" / "bf16" / "tp1"
V0 = SHARED / "llmservingsim" / "v0_pytorch_profiler" / "H100" / "meta-llama"
SPLITWISE = SHARED / "splitwise" / "perf_model.csv"


def random_shapes(n: int, seed: int = 0) -> list[StepShape]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        reqs = [(1, rng.randint(1, 9000)) for _ in range(rng.randint(0, 200))]
        reqs += [(rng.randint(2, 2048), rng.choice([0, rng.randint(1, 8000)]))
                 for _ in range(rng.randint(0 if reqs else 1, 3))]
        rng.shuffle(reqs)
        out.append(StepShape(tuple(n for n, _ in reqs), tuple(c for _, c in reqs),
                             sum(1 for n, _ in reqs if n == 1) + 1))
    return out


# ---- importers on their real files -----------------------------------------------------------
@needs_shared
@pytest.mark.parametrize("rel,source,gpu,model,tp", [
    ("aiconfigurator/h100_sxm/vllm_0.14.0", "aiconfigurator", "h100", "", None),
    ("aiconfigurator/a100_sxm/nccl_2.27.3/nccl_perf.csv.gz", "aiconfigurator", "a100-80gb", "", 2),
    ("vidur/compute/a100/meta-llama/Meta-Llama-3-8B/mlp.csv.gz", "vidur", "a100-80gb",
     "llama-3-8b", 1),
    ("vidur/network/h100_dgx/all_reduce.csv.gz", "vidur", "h100", "", 2),
    ("llmservingsim/v0_pytorch_profiler/H100/meta-llama/Llama-3.1-8B/tp2/layers.csv.gz",
     "llmservingsim_v0", "h100", "llama-3.1-8b", 2),
    ("llmservingsim/v0_pytorch_profiler/H100/meta-llama/Llama-3.1-70B/tp4/attention.csv.gz",
     "llmservingsim_v0", "h100", "llama-3.1-70b", 4),
    ("llmservingsim/vllm_0.19_profiler/RTX4090/meta-llama/Llama-3.1-8B/bf16/tp1",
     "llmservingsim", "rtx4090", "llama-3.1-8b", 1),
    ("llmservingsim/vllm_0.19_profiler/RTXPRO6000/Qwen/Qwen3-32B/bf16/tp2/attention.csv.gz",
     "llmservingsim", "rtx-pro-6000", "qwen3-32b", 2),
    ("splitwise/perf_model.csv", "splitwise", "a100-80gb", "llama-2-70b", 2),
])
def test_importer_on_real_file(rel, source, gpu, model, tp):
    path = SHARED / rel
    assert detect_source(path) == source
    df = import_profile("auto", path)
    assert len(df) > 50 and (df["latency_s"] > 0).all()
    assert gpu in set(df["gpu"]) and model in set(df["model"])
    assert tp is None and df["tp"].isna().any() or tp in set(df["tp"].dropna())
    validate_profile(df)


@needs_shared
def test_importer_units_against_readme_sanity_points():
    aic = import_profile("aiconfigurator", AIC_H100).query("dtype == 'bf16'")
    gemm = aic[(aic.op == "gemm") & (aic.gemm_m == 4096) & (aic.gemm_n == 4096)
               & (aic.gemm_k == 4096)]
    assert gemm["latency_s"].iloc[0] == pytest.approx(0.156e-3, rel=0.01)
    dec = aic[(aic.op == "attn_decode") & (aic.batch_size == 1) & (aic.context_len == 4095)
              & (aic.num_heads == 32) & (aic.num_kv_heads == 8)]
    assert dec["latency_s"].iloc[0] == pytest.approx(0.0169e-3, rel=0.01)
    mixed = import_profile("llmservingsim", LSS / "RTX4090" / "meta-llama" / "Llama-3.1-8B"
                           / "bf16" / "tp1" / "attention.csv.gz")
    pure = mixed[(mixed.chunk_len == 512) & (mixed.prefix_len == 0) & (mixed.batch_size == 0)]
    assert pure["latency_s"].iloc[0] == pytest.approx(41.1e-6, rel=0.01)
    dec = mixed[(mixed.chunk_len == 0) & (mixed.batch_size == 64) & (mixed.context_len == 1024)]
    assert dec["latency_s"].iloc[0] == pytest.approx(333.3e-6, rel=0.01)
    sw = import_profile("splitwise", SPLITWISE)
    assert sw["latency_s"].between(1e-3, 100).all()  # ms -> s
    layers = import_profile("llmservingsim_v0", V0 / "Llama-3.1-8B" / "tp1" / "layers.csv.gz")
    q = layers[(layers.op == "qkv_proj") & (layers.num_tokens == 1)]["latency_s"].iloc[0]
    assert q == pytest.approx((16078 + 8275 + 8065) * 1e-9)  # q + k + v, ns -> s


def test_import_errors(tmp_path):
    with pytest.raises(InputError):
        import_profile("auto", tmp_path / "missing.csv")
    junk = tmp_path / "junk.csv"
    junk.write_text("a,b\n1,2\n")
    with pytest.raises(InputError) as err:
        import_profile("auto", junk)
    assert "aiconfigurator" in str(err.value)
    with pytest.raises(InputError):
        import_profile("splitwise", junk)  # explicit source, wrong columns
    with pytest.raises(InputError):
        import_profile("nonsense", junk)
    assert {"aiconfigurator", "vidur", "llmservingsim", "llmservingsim_v0", "splitwise",
            "servesim"} <= set(available_importers())


def test_schema_validation_and_round_trip(tmp_path):
    rows = [{"source": "t", "gpu": "h100", "model": "tiny-llama", "tp": 1, "op": "qkv_proj",
             "num_tokens": n, "latency_s": 1e-6 * n} for n in (1, 2, 4)]
    for name in ("p.csv", "p.parquet", "p.jsonl"):
        write_profile(make_profile(rows), tmp_path / name)
        back = read_profile(tmp_path / name)
        assert back["latency_s"].tolist() == pytest.approx([1e-6, 2e-6, 4e-6])
        assert detect_source(tmp_path / name) == "servesim"
    with pytest.raises(InputError):
        validate_profile(pd.DataFrame([{**rows[0], "op": "flash_attn"}]))
    with pytest.raises(InputError):
        validate_profile(pd.DataFrame([{**rows[0], "latency_s": -1.0}]))
    with pytest.raises(InputError) as err:
        validate_profile(pd.DataFrame([{**rows[0], "op": "attn_decode"}]))
    assert err.value.field == "batch_size"


# ---- fitting ------------------------------------------------------------------------------------
def synthetic_profile() -> pd.DataFrame:
    """A tiny-llama profile with known linear costs, so the composition can be checked exactly."""
    rows = []
    for op in ("norm", "qkv_proj", "rope", "o_proj", "gate_up_proj", "act", "down_proj",
               "embedding", "final_norm", "lm_head", "sampler"):
        rows += [{"op": op, "num_tokens": n, "latency_s": 1e-6 + 1e-8 * n} for n in (1, 64, 512)]
    for chunk in (0, 256):
        for prefix in ((0,) if chunk == 0 else (0, 1024)):
            for n in ((1, 32) if chunk == 0 else (0, 32)):
                for k in ((0,) if n == 0 else (16, 1024)):
                    t = 2e-6 + 1e-9 * chunk * (chunk / 2 + prefix) + 1e-9 * n * k
                    rows.append({"op": "attn_mixed", "chunk_len": chunk, "prefix_len": prefix,
                                 "batch_size": n, "context_len": k, "latency_s": t})
    base = {"source": "synthetic", "gpu": "h100", "model": "tiny-llama", "tp": 1, "dtype": "bf16"}
    return make_profile([{**base, **r} for r in rows])


def test_fit_composes_tables_exactly():
    f = fit(synthetic_profile(), "tiny-llama", "h100", 1)
    per_op = lambda n: 1e-6 + 1e-8 * n  # noqa: E731
    # 64 decodes at 16 context: 2 layers x (8 dense calls incl. 2 norms + attention) + 4 per-step
    expected = 2 * (8 * per_op(64) + 2e-6 + 1e-9 * 32 * 16 * 2) + 4 * per_op(64)
    got = f.step_time_s(StepShape((1,) * 64, (16,) * 64, 64))
    # 64 decodes are off the n_decode grid (max 32): linear extrapolation on the exact bilinear data
    assert got == pytest.approx(expected, rel=1e-9)
    assert f.step_time_s(StepShape((256,), (1024,), 0)) == pytest.approx(
        2 * (8 * per_op(256) + 2e-6 + 1e-9 * 256 * (128 + 1024)) + 2 * per_op(256), rel=1e-9)
    assert f.fit_error["attn_mixed"]["origin"] == "measured"


def test_decode_skew_correction_is_alpha_of_the_way_to_max_context():
    rows = synthetic_profile()
    plain = fit(rows, "tiny-llama", "h100", 1)
    mixed = rows["op"] == "attn_mixed"
    skewed = fit(rows.assign(skew_alpha=rows["skew_alpha"].mask(mixed, 0.25)),
                 "tiny-llama", "h100", 1)
    assert skewed.data["attention"]["skew_alpha"] == 0.25
    # Equal decode contexts: the table point itself, no correction.
    for shape in (decode_shape(32, 512), decode_shape(1, 900), prefill_shape(256, 1024)):
        assert skewed.step_time_s(shape) == plain.step_time_s(shape)
    # 4 decodes at 16, 16, 16, 1000: mean 262, max 1000. The synthetic table is 1e-9 s per
    # (decode x context) token, so t(max) - t(mean) = 4 * 738 ns per layer; 2 layers.
    shape = StepShape((1, 1, 1, 1), (16, 16, 16, 1000), 4)
    extra = 2 * 0.25 * 1e-9 * 4 * (1000 - 262)
    assert skewed.step_time_s(shape) - plain.step_time_s(shape) == pytest.approx(extra, rel=1e-9)
    # With a prefill chunk in the batch, only the decodes' contexts count toward the max.
    extra = 2 * 0.25 * 1e-9 * 2 * (1000 - 508)
    for prefill_ctx in (5000, 50):  # the chunk's own context is the largest / is not
        shape = StepShape((1, 1, 256), (16, 1000, prefill_ctx), 3)
        assert skewed.step_time_s(shape) - plain.step_time_s(shape) == pytest.approx(extra, rel=1e-9)


def test_skew_alpha_errors():
    rows = synthetic_profile()
    mixed = (rows["op"] == "attn_mixed").to_numpy()
    alphas = rows["skew_alpha"].mask(mixed, 0.1)
    alphas.iloc[mixed.nonzero()[0][0]] = 0.2
    with pytest.raises(InputError) as err:
        fit(rows.assign(skew_alpha=alphas), "tiny-llama", "h100", 1)
    assert err.value.field == "skew_alpha"
    data = fit(rows, "tiny-llama", "h100", 1).data
    data["attention"]["skew_alpha"] = 1.5
    with pytest.raises(InputError) as err:
        FittedCostModel(data)
    assert "outside [0, 1]" in str(err.value)


@needs_shared
def test_llmservingsim_importer_reads_the_skew_fit():
    rows = import_profile("llmservingsim", RTXPRO_8B)
    attn = rows["op"] == "attn_mixed"
    assert set(rows.loc[attn, "skew_alpha"]) == {0.0543}  # meta.yaml skew_fit.per_tp[1]
    assert rows.loc[~attn, "skew_alpha"].isna().all()
    rtx4090 = LSS / "RTX4090" / "meta-llama" / "Llama-3.1-8B" / "bf16" / "tp1"
    assert import_profile("llmservingsim", rtx4090)["skew_alpha"].isna().all()  # not profiled


def test_fit_without_matching_rows_lists_what_exists():
    with pytest.raises(InputError) as err:
        fit(synthetic_profile(), "llama-3.1-8b", "h100", 1)
    assert "tiny-llama" in str(err.value)


def test_save_load_round_trip_and_factory(tmp_path):
    f = fit(synthetic_profile(), "tiny-llama", "h100", 1)
    path = tmp_path / "sub" / "tiny.json"
    f.save(path)
    g = make_cost_model("profiled", path=path, model="tiny-llama", gpu="NVIDIA H100 80GB HBM3",
                        tp=1)
    for s in random_shapes(50):
        assert g.step_time_s(s) == f.step_time_s(s)
    assert [p.name for p in path.parent.iterdir()] == ["tiny.json"]  # no temp files left
    with pytest.raises(InputError):
        make_cost_model("profiled", path=path, gpu="a100")
    with pytest.raises(InputError):
        make_cost_model("profiled", path=path, tp=2)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(InputError):
        make_cost_model("profiled", path=bad)
    bad.write_text("{not json")
    with pytest.raises(InputError):
        FittedCostModel.load(bad)


@pytest.fixture(scope="module")
def rtxpro_fit():
    return fit(import_profile("llmservingsim", RTXPRO_8B), "llama-3.1-8b", "rtx-pro-6000", 1)


@pytest.mark.slow
@needs_shared
def test_llmservingsim_fit_errors_and_composition(rtxpro_fit):
    err = rtxpro_fit.fit_error
    for op in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "norm", "lm_head"):
        assert err[op]["origin"] == "measured" and err[op]["mape_holdout"] < 0.05, op
    assert err["attn_mixed"]["mape_holdout"] < 0.08
    # On-grid shape: the step is exactly 32 x (dense + 2 norms + mixed attention) + per-step ops.
    dense = pd.read_csv(RTXPRO_8B / "dense.csv").query("tokens == 64").set_index("layer")["time_us"]
    seq = pd.read_csv(RTXPRO_8B / "per_sequence.csv").query("sequences == 64") \
        .set_index("layer")["time_us"]
    attn = pd.read_csv(RTXPRO_8B / "attention.csv.gz").query(
        "prefill_chunk == 0 and n_decode == 64 and kv_decode == 1024")["time_us"].iloc[0]
    per_layer = dense[["qkv_proj", "rotary_emb", "o_proj", "gate_up_proj", "act_fn",
                       "down_proj"]].sum() + 2 * dense["layernorm"] + attn
    expected = 32 * per_layer + dense["embedding"] + dense["final_layernorm"] + seq.sum()
    assert rtxpro_fit.step_time_s(decode_shape(64, 1024)) == pytest.approx(expected * 1e-6,
                                                                          rel=1e-9)


@needs_shared
def test_profiled_and_roofline_agree_within_2x(rtxpro_fit):
    roof = make_cost_model("roofline", model="llama-3.1-8b", gpu="rtx-pro-6000")
    for s in (decode_shape(1, 100), decode_shape(64, 2000), prefill_shape(1024),
              StepShape((1,) * 32 + (512,), (800,) * 32 + (0,), 33)):
        ratio = rtxpro_fit.step_time_s(s) / roof.step_time_s(s)
        assert 0.5 < ratio < 2.0, (s.num_tokens, ratio)


@needs_shared
def test_aiconfigurator_fit_for_tp4_70b(tmp_path):
    out = tmp_path / "h100-70b-tp4.json"
    f = fit_main([AIC_H100, SHARED / "aiconfigurator" / "h100_sxm" / "nccl_2.29.2"
                  / "nccl_perf.csv.gz"], out, "llama-3.1-70b", "h100", 4)
    err = f.fit_error
    assert err["gemm"]["mape_holdout"] < 0.10
    assert err["attn_decode"]["mape_holdout"] < 0.10
    assert err["attn_prefill"]["mape_holdout"] < 0.25
    assert err["allreduce"]["origin"] == "measured" and err["allreduce"]["mape_holdout"] < 0.10
    assert err["qkv_proj"]["origin"].startswith("gemm kernels n=2560 k=8192")
    assert err["sampler"]["origin"] == "roofline"  # nothing measured it: filled and labelled
    loaded = make_cost_model("profiled", path=out)
    for s in random_shapes(30, seed=1):
        assert loaded.step_time_s(s) == f.step_time_s(s) > 0
    assert "attn_decode" in format_fit_report(loaded)
    assert loaded.metadata["sources"] == ["aiconfigurator"]
    # decode steps grow with batch and context; TP=4 pays two all-reduces per layer
    assert f.step_time_s(decode_shape(64, 4000)) > f.step_time_s(decode_shape(8, 500))


@needs_shared
def test_vidur_plus_llmservingsim_v0_attention():
    rows = load_profiles([V0 / "Llama-3.1-70B" / "tp4" / "layers.csv.gz",
                          V0 / "Llama-3.1-70B" / "tp4" / "attention.csv.gz"])
    f = fit(rows, "llama-3.1-70b", "h100", 4)
    assert f.fit_error["attn_decode"]["mape_holdout"] < 0.10
    assert f.fit_error["attn_prefill"]["mape_holdout"] < 0.10
    assert f.fit_error["qkv_proj"]["mape_holdout"] < 0.05
    longer = f.step_time_s(StepShape((512,), (4096,), 1))
    assert longer > f.step_time_s(StepShape((512,), (0,), 1))  # cached prefix costs attention


@needs_shared
def test_splitwise_step_regression():
    f = fit(import_profile("splitwise", SPLITWISE), "llama-2-70b", "h100", 4)
    assert f.fit_error["model_decode"]["mape_holdout"] < 0.10
    assert f.fit_error["model_prefill"]["mape_holdout"] < 0.30
    measured = pd.read_csv(SPLITWISE).query(
        "model == 'llama2-70b' and hardware == 'h100-80gb' and tensor_parallel == 4 "
        "and batch_size == 1 and prompt_size == 512")
    assert f.step_time_s(decode_shape(1, 512 + 64)) == pytest.approx(
        measured["token_time"].median() * 1e-3, rel=0.1)


@pytest.mark.slow
@needs_shared
def test_missing_attention_phase_is_filled_from_roofline():
    rows = import_profile("auto", V0 / "Llama-3.1-8B" / "tp1" / "layers.csv.gz")
    f = fit(rows, "llama-3.1-8b", "h100", 1)
    assert f.fit_error["attn_prefill"]["origin"] == "measured"
    assert f.fit_error["attn_decode"]["origin"] == "roofline"
    assert f.step_time_s(decode_shape(64, 8000)) > f.step_time_s(decode_shape(64, 100))


@pytest.mark.slow
@needs_shared
def test_fp8_gemms_lose_the_activation_quantisation_vllm_fuses(tmp_path):
    """aiconfigurator's fp8 GEMM rows include the dynamic per-token quantisation of their input;
    vLLM's compiled graph fuses it into the RMSNorm before qkv and gate_up and the SiLU-mul
    before down, so those curves lose the measured quant time; o_proj keeps it; bf16 unchanged."""
    from servesim.simulator.cost_model.fit_ops import gemm_curve

    quant_file = SHARED / "aiconfigurator" / "h100_sxm" / "vllm_0.24.0" / "scale_matrix_perf.csv.gz"
    quant = import_profile("auto", quant_file)  # read with its sibling computescale_perf
    q = quant[(quant["op"] == "act_quant") & (quant["gemm_m"] == 1) & (quant["gemm_k"] == 8192)]
    static = pd.read_csv(quant_file)
    scale = pd.read_csv(quant_file.with_name("computescale_perf.csv.gz"))
    pick = lambda df: float(df[(df["m"] == 1) & (df["k"] == 8192)]["latency"].iloc[0])  # noqa: E731
    assert float(q["latency_s"].iloc[0]) == pytest.approx((pick(static) + max(pick(scale), 0.0)) * 1e-3)
    gemms = import_profile("auto", AIC_H100)
    fp8 = fit([gemms, quant], "llama-3.1-70b@fp8-kvauto", "h100", 4)
    plain = fit([gemms], "llama-3.1-70b@fp8-kvauto", "h100", 4)
    ops_fp8, ops_plain = fp8.data["ops"], plain.data["ops"]
    assert ops_fp8["o_proj"] == ops_plain["o_proj"]
    for op in ("qkv_proj", "gate_up_proj", "down_proj"):
        ys, ys0 = ops_fp8[op]["curve"]["y"], ops_plain[op]["curve"]["y"]
        assert all(0.5 * b <= a < b for a, b in zip(ys, ys0)), op
        assert "activation quantisation" in fp8.fit_error[op]["origin"]
    # the first point: the GEMM less the measured quant of its 1 x 8192 input (qkv: k = hidden)
    assert ops_plain["qkv_proj"]["curve"]["y"][0] - ops_fp8["qkv_proj"]["curve"]["y"][0] == pytest.approx(
        float(q["latency_s"].iloc[0]), rel=0.05)
    bf16 = fit([gemms, quant], "llama-3.1-70b", "h100", 4).data["ops"]
    assert bf16["qkv_proj"] == fit([gemms], "llama-3.1-70b", "h100", 4).data["ops"]["qkv_proj"]


def test_a_quant_table_named_alone_needs_its_sibling(tmp_path):
    lone = tmp_path / "scale_matrix_perf.csv"
    lone.write_text("framework,version,device,op_name,kernel_source,m,k,quant_dtype,latency\n"
                    "VLLM,0.24.0,NVIDIA H100 80GB HBM3,scale_matrix,static,1,8192,fp8,0.004\n")
    with pytest.raises(InputError) as e:
        import_profile("auto", lone)
    assert "computescale_perf" in e.value.allowed
