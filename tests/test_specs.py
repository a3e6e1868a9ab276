"""Model/GPU specs: alias resolution, published parameter counts, memory helpers, validation."""

from __future__ import annotations

import json

import pytest

from servesim.simulator.specs import (
    GpuSpec,
    available_gpus,
    available_models,
    kv_bytes_per_token,
    resolve_gpu,
    resolve_model,
    weight_bytes,
)
from servesim.traces.errors import InputError


@pytest.mark.parametrize("alias,expected", [
    ("meta-llama/Llama-3.1-8B", "llama-3.1-8b"),
    ("meta-llama/Meta-Llama-3.1-8B-Instruct", "llama-3.1-8b"),
    ("LLAMA-3.1-70B", "llama-3.1-70b"),
    ("meta-llama/Llama-2-7b-hf", "llama-2-7b"),
    ("meta-llama/Llama-2-70b-chat-hf", "llama-2-70b"),
    ("Qwen/Qwen3-32B", "qwen3-32b"),
    ("mistralai/Mistral-7B-Instruct-v0.3", "mistral-7b"),
    ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b"),
    ("HuggingFaceTB/SmolLM2-135M", "smollm2-135m"),
    ("tiny-llama", "tiny-llama"),
    ("meta-llama/Meta-Llama-3-8B", "llama-3-8b"),
])
def test_model_aliases(alias, expected):
    assert resolve_model(alias).name == expected


@pytest.mark.parametrize("alias,expected", [
    ("NVIDIA GeForce RTX 4090", "rtx4090"),
    ("NVIDIA H100 80GB HBM3", "h100"),
    ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
    ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "rtx-pro-6000"),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "rtx-pro-6000"),
    ("RTXPRO6000", "rtx-pro-6000"),
    ("h100_sxm", "h100"),
    ("a100_sxm", "a100-80gb"),
    ("H200", "h200"),
    ("NVIDIA H200", "h200"),
    ("nvidia l40s", "l40s"),
])
def test_gpu_aliases(alias, expected):
    assert resolve_gpu(alias).name == expected


def test_unknown_names_list_the_known_ids():
    with pytest.raises(InputError) as err:
        resolve_model("gpt-5")
    assert "llama-3.1-8b" in str(err.value) and err.value.field == "model"
    with pytest.raises(InputError) as err:
        resolve_gpu("tpu-v5")
    assert "h100" in str(err.value) and err.value.field == "gpu"
    # A power-capped H100 is not an H100: it must not silently alias to one.
    with pytest.raises(InputError):
        resolve_gpu("h100-80gb-pcap")


# Published parameter counts (model cards), in billions.
@pytest.mark.parametrize("name,params_b", [
    ("llama-3.1-8b", 8.03), ("llama-3.1-70b", 70.6), ("llama-2-7b", 6.74), ("llama-2-70b", 69.0),
    ("qwen3-32b", 32.8), ("mistral-7b", 7.25), ("mixtral-8x7b", 46.7), ("smollm2-135m", 0.1345),
])
def test_weight_bytes_match_published_parameter_counts(name, params_b):
    spec = resolve_model(name)
    params = weight_bytes(spec, 1) / spec.dtype_bytes / 1e9
    assert params == pytest.approx(params_b, rel=0.01)


def test_kv_bytes_per_token_and_tp_sharding():
    llama8 = resolve_model("llama-3.1-8b")
    assert kv_bytes_per_token(llama8) == 2 * 32 * 8 * 128 * 2  # 128 KiB per token
    llama70 = resolve_model("llama-3.1-70b")
    assert kv_bytes_per_token(llama70, 4) == 2 * 80 * 2 * 128 * 2
    # Beyond 8-way TP the 8 KV heads are replicated: one per GPU, no further saving.
    assert kv_bytes_per_token(llama70, 16) == kv_bytes_per_token(llama70, 8)
    assert kv_bytes_per_token(llama8, 1, kv_dtype_bytes=1) == kv_bytes_per_token(llama8) // 2
    assert weight_bytes(llama70, 4) < weight_bytes(llama70, 1) / 3.9


def test_tp_must_divide_heads():
    with pytest.raises(InputError) as err:
        kv_bytes_per_token(resolve_model("smollm2-135m"), 2)  # 9 heads
    assert err.value.field == "tp"


def test_every_spec_is_consistent():
    for name in available_models():
        spec = resolve_model(name)
        assert spec.name == name and spec.hf_id
        assert resolve_model(spec.hf_id).name == name
    for name in available_gpus():
        g = resolve_gpu(name)
        assert resolve_gpu(g.vendor_name).name == name
        assert g.peak_flops > 1e13 and g.peak_mem_bytes_per_s > 5e11


def test_tiny_and_smollm_shapes():
    tiny = resolve_model("tiny-llama")
    assert (tiny.num_layers, tiny.hidden_size, tiny.num_attention_heads, tiny.num_kv_heads,
            tiny.vocab_size) == (2, 64, 4, 2, 512)
    smol = resolve_model("smollm2-135m")
    assert (smol.num_layers, smol.hidden_size, smol.num_attention_heads, smol.num_kv_heads,
            smol.intermediate_size, smol.vocab_size, smol.tied_embeddings) == \
        (30, 576, 9, 3, 1536, 49152, True)


def test_hf_config_json(tmp_path):
    cfg = {"num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 8,
           "num_key_value_heads": 2, "intermediate_size": 512, "vocab_size": 1000,
           "max_position_embeddings": 1024, "tie_word_embeddings": True}
    path = tmp_path / "my-model" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(cfg))
    spec = resolve_model(str(path))
    assert (spec.num_layers, spec.head_dim, spec.num_kv_heads, spec.tied_embeddings) == \
        (4, 32, 2, True)
    path.write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(InputError):
        resolve_model(str(path))


def test_gpu_spec_validation():
    good = resolve_gpu("h100")
    fields = {f: getattr(good, f) for f in GpuSpec.__dataclass_fields__}
    with pytest.raises(InputError):
        GpuSpec(**{**fields, "memory_efficiency": 1.5})
    with pytest.raises(InputError):
        GpuSpec(**{**fields, "bf16_dense_tflops": 0})


@pytest.mark.parametrize("name", ["gpus.yaml", "hosts.yaml", "models.yaml"])
def test_spec_files_read_with_libyaml_give_safe_loads_values(name):
    """The shipped spec files are parsed by libyaml when PyYAML has it (start-up time); the
    values are yaml.safe_load's, types included (ints stay ints, 1e15-style floats floats)."""
    from pathlib import Path

    import yaml

    from servesim.simulator.specs import _yaml

    path = Path(_yaml.__file__).with_name(name)
    expected = yaml.safe_load(path.read_text())
    got = _yaml.load_spec_file(path)
    assert got == expected
    assert repr(got) == repr(expected)  # 1 and 1.0 compare equal; their reprs do not
    assert _yaml._LOADER is (yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader)
