"""Model ids resolve by architecture: org prefixes, local folders and suffix tokens
(simulator/specs/_names.py model_id_candidates, models.py resolve_model_id)."""

import pytest

from servesim.simulator.specs import resolve_model
from servesim.simulator.specs._names import model_id_candidates, quantization_of
from servesim.simulator.specs.models import resolve_model_id
from servesim.traces.errors import InputError


@pytest.mark.parametrize("name, expected", [
    # fine-tune suffixes: same architecture and config as the base
    ("Qwen/Qwen3-30B-A3B-Base", "qwen3-30b-a3b"),
    ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"),
    ("meta-llama/Llama-2-7b-chat-hf", "llama-2-7b"),  # two tokens: -hf, then -chat
    ("01-ai/Yi-34B-Chat", "yi-34b"),
    # release tags (a fine-tune with a date) are one token
    ("Qwen/Qwen3-30B-A3B-Instruct-2507", "qwen3-30b-a3b"),
    ("Qwen/Qwen3-30B-A3B-Thinking-2507", "qwen3-30b-a3b"),
    # org prefixes and local folders are dropped
    ("/data/model/Qwen3-32B", "qwen3-32b"),
    ("/data/model/Qwen3-32B/", "qwen3-32b"),
    ("someorg/Meta-Llama-3.1-70B", "llama-3.1-70b"),
    # quantization suffixes select the weight format (the registry's @<weights>-kv<kv> variants)
    ("Qwen/Qwen3-32B-FP8", "qwen3-32b@fp8-kvauto"),
    ("RedHatAI/Meta-Llama-3.1-70B-Instruct-FP8", "llama-3.1-70b@fp8-kvauto"),
    ("neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8-dynamic", "llama-3.1-8b@fp8-kvauto"),
    ("RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w8a8", "llama-3.1-8b@int8-kvauto"),
    ("someorg/Qwen3-32B-W8A8", "qwen3-32b@int8-kvauto"),
    ("Qwen/Qwen3-32B-AWQ", "qwen3-32b@int4-kvauto"),
    ("Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4", "qwen2.5-7b@int4-kvauto"),
    # a quantized id whose exact spec ships in the catalogue resolves to that entry
    ("meta-llama/Llama-4-Scout-17B-16E-Instruct-FP8", "llama-4-scout-17b-16e-fp8"),
    # exact ids and aliases are untouched
    ("RedHatAI/Llama-4-Scout-17B-16E-Instruct-FP8-dynamic", "llama-4-scout-17b-16e-fp8"),
    ("qwen3-32b@fp8-kvauto", "qwen3-32b@fp8-kvauto"),
    ("Qwen/Qwen3-32B", "qwen3-32b"),
])
def test_ids_resolve_by_architecture(name, expected):
    assert resolve_model(name).name == expected


def test_quantized_spec_keeps_the_base_architecture():
    base, fp8 = resolve_model("qwen3-32b"), resolve_model("Qwen/Qwen3-32B-FP8")
    assert (fp8.weight_dtype, fp8.num_layers, fp8.hidden_size, fp8.intermediate_size) == \
        ("fp8", base.num_layers, base.hidden_size, base.intermediate_size)


def test_resolution_says_how():
    r = resolve_model_id("Qwen/Qwen3-30B-A3B-Instruct-2507")
    assert r.how == ("Qwen/Qwen3-30B-A3B-Instruct-2507 -> qwen3-30b-a3b "
                     "(qwen/ dropped; suffix -instruct-2507: same architecture and config)")
    assert "dated re-release" in r.caveat and "max_position_embeddings 40960" in r.caveat
    r = resolve_model_id("RedHatAI/Meta-Llama-3.1-70B-Instruct-FP8")
    assert r.how.endswith("(redhatai/ dropped; suffix -instruct: same architecture and config; "
                          "suffix -fp8: fp8 weights)") and r.caveat == ""
    assert resolve_model_id("qwen3-32b").how == "qwen3-32b -> qwen3-32b (registry id)"
    assert resolve_model_id("Qwen/Qwen3-32B").how == "Qwen/Qwen3-32B -> qwen3-32b (alias)"


def test_suffix_tokens_are_taken_off_one_at_a_time():
    keys = [(c.key, c.suffixes) for c in model_id_candidates("RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w8a8")]
    assert keys == [("redhatai/meta-llama-3.1-8b-instruct-quantized.w8a8", ()),
                    ("meta-llama-3.1-8b-instruct-quantized.w8a8", ()),
                    ("meta-llama-3.1-8b-instruct", ("-quantized.w8a8",)),
                    ("meta-llama-3.1-8b", ("-instruct", "-quantized.w8a8"))]
    assert quantization_of("-fp8-dynamic") == "fp8" and quantization_of("-instruct") is None
    # a suffix needs its separator: "gpt-oss" is not "-oss"-anything, "qwen3-32bawq" keeps its tail
    assert [c.key for c in model_id_candidates("qwen3-32bawq")] == ["qwen3-32bawq"]


def test_conflicting_quantization_suffixes_are_ambiguous():
    with pytest.raises(InputError) as e:
        resolve_model("Qwen/Qwen3-32B-AWQ-FP8")
    assert e.value.field == "model" and "ambiguous" in e.value.detail and "-awq, -fp8" in e.value.detail


@pytest.mark.parametrize("name, guess", [
    ("Qwen/Qwen3-31B-Instruct", "qwen3-32b"),  # suggested from the id without org and suffixes
    ("Qwen/Qwen3-30B-A4B-Instruct-2507", "qwen3-30b-a3b"),
])
def test_unknown_ids_suggest_and_list_the_valid_ones(name, guess):
    with pytest.raises(InputError) as e:
        resolve_model(name)
    assert f"did you mean '{guess}'" in e.value.detail and "qwen3-30b-a3b" in e.value.allowed


def test_unknown_id_without_a_close_match():
    with pytest.raises(InputError) as e:
        resolve_model("acme/Zzz-9000-Instruct")
    assert "did you mean" not in e.value.detail and e.value.field == "model"
