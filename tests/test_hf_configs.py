"""Any model by its Hugging Face config.json: derived shapes, the shipped catalogue, precision."""

import json

import pytest

from servesim.simulator.cost_model import decode_shape, make_cost_model, prefill_shape
from servesim.simulator.kv_capacity import derive_num_gpu_blocks
from servesim.simulator.specs import (
    available_models,
    kv_bytes_per_token,
    model_from_hf_config,
    resolve_model,
    weight_bytes,
    with_precision,
)

# Published total parameter counts (model cards), billions; checkpoints stored in bf16 unless noted.
@pytest.mark.parametrize("name,params_b", [
    ("llama-2-13b", 13.0), ("llama-3.2-1b", 1.24), ("llama-3.2-3b", 3.21), ("qwen2.5-7b", 7.61),
    ("qwen2.5-72b", 72.7), ("qwen3-8b", 8.19), ("qwen3-30b-a3b", 30.5), ("qwen3-235b-a22b", 235),
    ("mixtral-8x22b", 141), ("gemma-2-9b", 9.24), ("gemma-2-27b", 27.2), ("mistral-nemo-12b", 12.2),
    ("yi-34b", 34.4), ("codellama-34b", 33.7), ("llama-4-scout-17b-16e", 109),
    ("whisper-large-v3", 1.55),  # model card: 1550M (encoder, decoder and its cross-attention)
])
def test_catalogue_parameter_counts(name, params_b):
    spec = resolve_model(name)
    assert weight_bytes(spec) / 2 / 1e9 == pytest.approx(params_b, rel=0.03)


def test_catalogue_resolves_by_hf_id_and_every_entry_builds_a_roofline():
    assert resolve_model("Qwen/Qwen2.5-7B-Instruct").name == "qwen2.5-7b"
    assert resolve_model("RedHatAI/Llama-4-Scout-17B-16E-Instruct-FP8-dynamic").weight_dtype == "fp8"
    assert resolve_model("mistralai/Mistral-Nemo-Instruct-2407").name == "mistral-nemo-12b"
    for name in available_models():
        spec = resolve_model(name)
        tp = 2 if spec.num_attention_heads % 2 == 0 else 1
        cm = make_cost_model("roofline", model=name, gpu="h100", tp=tp)
        assert 0 < cm.step_time_s(decode_shape(8, 1000)) < cm.step_time_s(prefill_shape(2048))


def test_mla_kv_bytes_come_from_the_latent_rank_and_are_replicated_over_tp():
    ds = resolve_model("deepseek-v3")
    assert ds.mla is not None and ds.is_moe and ds.num_dense_layers == 3
    assert kv_bytes_per_token(ds) == 61 * (512 + 64) * 2
    assert kv_bytes_per_token(ds, 8) == kv_bytes_per_token(ds)  # one latent per token on each rank
    assert ds.weight_dtype == "fp8_block"
    assert weight_bytes(ds, 8) / 1e9 == pytest.approx(671 / 8, rel=0.1)


def test_sliding_window_layer_patterns():
    assert resolve_model("gemma-3-27b").num_sliding_layers == 62 - 62 // 6
    assert resolve_model("gemma-2-9b").num_sliding_layers == 21
    oss = resolve_model("gpt-oss-20b")
    assert (oss.sliding_window, oss.num_sliding_layers, oss.expert_weight_dtype) == (128, 12, "mxfp4")
    assert resolve_model("qwen2.5-7b").sliding_window is None  # use_sliding_window: false
    # Hybrid layers cost between all-full and all-windowed attention on a long context.
    shape = decode_shape(64, 16000)
    gemma = make_cost_model("roofline", model="gemma-3-27b", gpu="h100", tp=2).breakdown(shape)
    assert gemma["attention"] > 0


def test_config_json_path_resolves_everywhere_by_name(tmp_path):
    folder = tmp_path / "My-Model"
    folder.mkdir()
    cfg = {"num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "num_key_value_heads": 2,
           "intermediate_size": 512, "vocab_size": 1000, "max_position_embeddings": 2048,
           "num_local_experts": 4, "num_experts_per_tok": 2, "torch_dtype": "bfloat16"}
    (folder / "config.json").write_text(json.dumps(cfg))
    spec = resolve_model(str(folder / "config.json"))
    assert resolve_model(spec.name) == spec  # registered: names passed around keep resolving
    assert resolve_model(str(folder)) == spec  # a checkpoint folder works too
    cap = derive_num_gpu_blocks(spec.name, "h100", 1, 16, 0.9, 1.0)
    assert cap.num_gpu_blocks > 0
    assert model_from_hf_config(folder / "config.json").is_moe


def test_fp8_kv_cache_halves_kv_bytes_and_fp8_weights_halve_weight_bytes():
    base = resolve_model("llama-3.1-8b")
    fp8 = with_precision(base, "fp8", "fp8")
    assert fp8.name == "llama-3.1-8b@fp8-kvfp8" and resolve_model(fp8.name) == fp8
    assert kv_bytes_per_token(fp8) * 2 == kv_bytes_per_token(base)
    assert weight_bytes(fp8) < 0.6 * weight_bytes(base)  # embeddings and lm_head stay bf16
    kv_base = derive_num_gpu_blocks(base.name, "h100", 1, 16, 0.9, 2.0).num_gpu_blocks
    kv_fp8 = derive_num_gpu_blocks(fp8.name, "h100", 1, 16, 0.9, 2.0).num_gpu_blocks
    assert kv_fp8 > 2 * kv_base
    # fp8 tensor cores at the fp8 GEMM efficiency measured on H200 (vLLM 0.24 kernels, 0.60)
    slow = make_cost_model("roofline", model=base.name, gpu="h200").step_time_s(prefill_shape(4096))
    fast = make_cost_model("roofline", model=fp8.name, gpu="h200").step_time_s(prefill_shape(4096))
    assert fast < 0.85 * slow
    # memory-bound decode: half the weight bytes
    slow = make_cost_model("roofline", model=base.name, gpu="h100").step_time_s(decode_shape(8, 500))
    fast = make_cost_model("roofline", model=fp8.name, gpu="h100").step_time_s(decode_shape(8, 500))
    assert fast < 0.7 * slow


def test_two_configs_in_same_named_folders_stay_distinct(tmp_path):
    base = {"num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 4, "intermediate_size": 256,
            "vocab_size": 500}
    specs = []
    for i, layers in enumerate((2, 3)):
        folder = tmp_path / str(i) / "Same-Name"
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps({**base, "num_hidden_layers": layers}))
        specs.append(resolve_model(str(folder)))
    assert specs[0].name != specs[1].name
    for i, spec in enumerate(specs):
        assert resolve_model(str(tmp_path / str(i) / "Same-Name")) == spec
        assert resolve_model(spec.name) == spec


def test_hand_entered_specs_agree_with_their_published_configs():
    """A catalogue config whose model models.yaml also enters by hand (mixtral-8x7b) is shadowed
    by that entry; both must describe the same model, field for field, so neither can drift."""
    import dataclasses

    from servesim.simulator.specs.hf_config import catalogue_specs

    shadowed = [spec for spec in catalogue_specs() if resolve_model(spec.name) is not spec]
    assert {"mixtral-8x7b", "llama-3.1-8b", "llama-3.1-70b", "llama-2-7b", "llama-2-70b", "qwen3-32b"} <= {s.name for s in shadowed}
    skip = {"name", "hf_id", "aliases"}
    for spec in shadowed:
        entered = resolve_model(spec.name)
        for f in dataclasses.fields(spec):
            if f.name not in skip:
                assert getattr(entered, f.name) == getattr(spec, f.name), (spec.name, f.name)
        assert entered.hf_id == spec.hf_id
    assert weight_bytes(resolve_model("mixtral-8x7b")) / 2 / 1e9 == pytest.approx(46.7, rel=0.03)  # model card


@pytest.mark.parametrize("qcfg,fmt", [
    ({"quant_method": "awq", "bits": 4, "group_size": 128}, "int4"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128}, "int4"),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "nvfp4"),
    ({"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized"}, "nvfp4"),
    ({"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int"}}}},
     "int4"),
])
def test_four_bit_checkpoints_weigh_a_quarter_and_run_at_their_rates(tmp_path, qcfg, fmt):
    """int4 (AWQ/GPTQ, weight-only: dequantised to bf16 in the kernel) and NVFP4 (W4A4: fp4 tensor
    cores where the GPU has them, bf16-rate weight-only elsewhere) from quantization_config."""
    from servesim.simulator.specs import resolve_gpu
    from servesim.simulator.specs.precision import bytes_per_element, gemm_peak_tflops

    base = {k: v for k, v in json.loads(_catalogue("qwen3-8b").read_text()).items() if not k.startswith("_")}
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**base, "quantization_config": qcfg}))
    spec = model_from_hf_config(path)
    dense = resolve_model("qwen3-8b")
    assert spec.weight_dtype == fmt and spec.kv_cache_dtype == "auto"
    assert kv_bytes_per_token(spec) == kv_bytes_per_token(dense)  # weights only: KV stays bf16
    assert 0.25 < weight_bytes(spec) / weight_bytes(dense) < 0.45  # embeddings and lm_head stay bf16
    assert bytes_per_element(fmt) == pytest.approx(0.5, abs=0.07)  # 4 bits plus the group scales
    b200, h100 = resolve_gpu("b200"), resolve_gpu("h100")
    if fmt == "nvfp4":
        assert gemm_peak_tflops(b200, fmt) == b200.fp4_dense_tflops  # fp4 tensor cores
    else:
        assert gemm_peak_tflops(b200, fmt) == b200.bf16_dense_tflops  # dequantised to bf16
    assert gemm_peak_tflops(h100, fmt) == h100.bf16_dense_tflops  # Hopper: no fp4 cores
    # memory-bound decode on an H100: about a quarter of the weight bytes to read
    slow = make_cost_model("roofline", model=dense, gpu="h100").step_time_s(decode_shape(8, 500))
    fast = make_cost_model("roofline", model=spec, gpu="h100").step_time_s(decode_shape(8, 500))
    assert fast < 0.6 * slow


def _catalogue(name: str):
    from servesim.simulator.specs.hf_config import CATALOGUE_DIR

    return CATALOGUE_DIR / f"{name}.json"
