"""The GPU runner's model from any dense Llama-style config (servesim/gpu.py runner_model): what
`calibrate --model` and `replay --executor gpu` accept besides the presets."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from servesim.gpu import runner_model
from servesim.gpu_runner.weights import PRESETS
from servesim.traces.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
TINY = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": 64,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 512,
        "max_position_embeddings": 1024, "rope_theta": 50000.0, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16"}


def _write(tmp_path: Path, cfg: dict, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    return path


def test_a_config_json_gives_its_shapes(tmp_path):
    m = runner_model(str(_write(tmp_path, TINY)))
    assert (m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads, m.head_dim, m.intermediate_size,
            m.vocab_size, m.max_position) == (2, 64, 4, 2, 16, 128, 512, 1024)
    assert m.tie_embeddings and m.rope_theta == 50000.0 and m.rms_eps == 1e-6 and not m.qk_norm
    assert runner_model(str(tmp_path)) == m  # the folder holding it


def test_presets_and_catalogue_ids():
    assert runner_model("TINY-LLAMA") is PRESETS["tiny-llama"]
    qwen3 = runner_model("Qwen/Qwen3-8B")  # the shipped catalogue: per-head q/k norms from model_type
    assert qwen3.qk_norm and (qwen3.num_layers, qwen3.hidden_size, qwen3.num_kv_heads) == (36, 4096, 8)


@pytest.mark.parametrize("model,reason", [("qwen3-30b-a3b", "Mixture-of-Experts"), ("deepseek-v3", "MLA"),
                                          ("gemma-3-27b", "sliding-window"), ("llama-4-scout-fp8", "fp8")])
def test_models_the_runner_cannot_run_are_refused_with_the_reason(model, reason):
    with pytest.raises(InputError) as e:
        runner_model(model)
    assert reason in str(e.value) and e.value.field == "--model" and "tiny-llama" in e.value.allowed


def test_unknown_model_and_unreadable_config(tmp_path):
    with pytest.raises(InputError) as e:
        runner_model("no-such-model")
    assert e.value.field == "--model" and "config.json" in e.value.allowed
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(InputError) as e:
        runner_model(str(bad))
    assert e.value.path == str(bad)


@pytest.mark.slow
def test_calibrate_a_config_json_on_the_cpu(tmp_path):
    cfg = _write(tmp_path, TINY)
    out = tmp_path / "prof.csv"
    p = subprocess.run([sys.executable, "-m", "servesim", "calibrate", "--model", str(cfg), "--device", "cpu",
                        "--gpu-label", "h100", "--quick", "--out", str(out)], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert out.exists() and "step-time error" in p.stdout
    q = subprocess.run([sys.executable, "-m", "servesim", "calibrate", "--model", "qwen3-30b-a3b", "--device", "cpu",
                        "--out", str(tmp_path / "moe.csv")], capture_output=True, text=True, cwd=ROOT)
    assert q.returncode == 2 and "Mixture-of-Experts" in q.stderr and not (tmp_path / "moe.csv").exists()
