"""Hybrid and multimodal models read from config.json, and the cache a run gets for them."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from servesim.scheduler.kv.kinds import MANAGERS
from servesim.simulator.config import HardwareConfig, SimConfig
from servesim.simulator.kv_groups import kv_layout
from servesim.simulator.specs import model_from_hf_config, resolve_model, weight_bytes
from servesim.simulator.specs.hf_config import CATALOGUE_DIR, spec_from_hf_dict
from servesim.simulator.startup import blocks_for_max_model_len, resolve_cache
from servesim.traces.errors import InputError


def _raw(name: str) -> dict:
    return {k: v for k, v in json.loads((CATALOGUE_DIR / f"{name}.json").read_text()).items() if not k.startswith("_")}


@pytest.mark.parametrize("name,counts,params_b", [
    # (full, sliding, chunked, mamba, mlp); published parameter counts (model cards), billions
    ("qwen3-next-80b-a3b", (12, 0, 0, 36, 0), 80.0),
    ("qwen3.5-35b-a3b", (10, 0, 0, 30, 0), 35.0),
    ("nemotron-h-8b", (4, 0, 0, 24, 24), 8.1),
    ("jamba-1.5-mini", (4, 0, 0, 28, 0), 52.0),
    ("llama-4-scout-17b-16e", (12, 0, 36, 0, 0), 109.0),
    ("gemma-3-27b", (10, 52, 0, 0, 0), 27.4),
    ("qwen2.5-vl-7b", (28, 0, 0, 0, 0), 8.29),
])
def test_layer_kinds_and_parameter_counts(name, counts, params_b):
    m = resolve_model(name)
    assert tuple(m.count_layers(k) for k in ("full", "sliding_window", "chunked_local", "mamba", "mlp")) == counts
    assert weight_bytes(m) / 2 / 1e9 == pytest.approx(params_b, rel=0.03)


def test_state_shapes_as_vllm_writes_them():
    qn = resolve_model("qwen3-next-80b-a3b").linear_attention
    assert qn.state_shapes(4) == ((3, 2048), (8, 128, 128))  # conv (k-1, conv_dim/tp), (heads/tp, v, k)
    nh = resolve_model("nemotron-h-8b").linear_attention
    assert nh.state_shapes(1) == ((3, 128 * 64 + 2 * 8 * 128), (128, 64, 128))
    assert nh.state_dtype_bytes(2) == (2, 2)  # vLLM's NemotronH default: float16 ssm state
    jb = resolve_model("jamba-1.5-mini").linear_attention
    assert jb.state_shapes(2) == ((3, 4096), (4096, 16))  # mamba1: d_inner = 2 x 4096, over tp
    assert resolve_model("qwen3.5-35b-a3b").linear_attention.state_dtype_bytes(2) == (2, 4)  # float32 ssm
    with pytest.raises(InputError, match="not divisible by tp=3"):
        qn.state_shapes(3)


def test_llama4_chunked_layers_are_no_longer_a_sliding_window():
    m = resolve_model("llama-4-scout-17b-16e")
    assert (m.sliding_window, m.num_sliding_layers, m.attention_chunk_size) == (None, 0, 8192)
    assert m.layer_kinds[:4] == ("chunked_local", "chunked_local", "chunked_local", "full")
    assert m.vision.patches_per_token == 4  # pixel shuffle 0.5


def test_vision_towers():
    vl = resolve_model("qwen2.5-vl-7b").vision
    assert (vl.depth, vl.patches_per_token, vl.window_patches, vl.num_full_layers, vl.gated_mlp) == (32, 4, 64, 4, True)
    g3 = resolve_model("gemma-3-27b").vision
    assert (g3.patches_per_token, g3.pooled) == (16, True)  # 64 x 64 patches pooled to 256 tokens


@pytest.mark.parametrize("edit,match", [
    (lambda c: c.update(layer_types=["linear_attention"] * 47 + ["moe_attention"]), "unknown layer kind"),
    (lambda c: c.update(layer_types=["linear_attention", "full_attention"] * 10), "20 layer kinds for num_hidden_layers=48"),
])
def test_bad_hybrid_configs_say_what_is_wrong(edit, match):
    cfg = _raw("qwen3-next-80b-a3b")
    edit(cfg)
    with pytest.raises(InputError, match=match):
        spec_from_hf_dict(cfg, "bad", "x/bad")


def test_a_bad_hybrid_pattern_and_a_missing_state_key_are_input_errors(tmp_path: Path):
    cfg = _raw("nemotron-h-8b")
    cfg["hybrid_override_pattern"] = cfg["hybrid_override_pattern"][:-1] + "X"
    with pytest.raises(InputError, match="unknown layer kind"):
        spec_from_hf_dict(cfg, "bad", "x/bad")
    cfg = _raw("nemotron-h-8b")
    cfg["num_hidden_layers"] = 51
    with pytest.raises(InputError, match="52 layer kinds for num_hidden_layers=51"):
        spec_from_hf_dict(cfg, "bad", "x/bad")
    cfg = _raw("jamba-1.5-mini")
    del cfg["mamba_d_conv"]
    path = tmp_path / "jamba" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(cfg))
    with pytest.raises(InputError, match="mamba_d_conv") as err:
        model_from_hf_config(path)
    assert str(path) in str(err.value)


def test_a_config_json_path_replays_as_the_catalogue_entry(tmp_path: Path):
    path = tmp_path / "Qwen3-Next-80B-A3B-Instruct" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(_raw("qwen3-next-80b-a3b")))
    from_file = model_from_hf_config(path)
    assert replace(from_file, name="", hf_id="", aliases=()) == \
        replace(resolve_model("qwen3-next-80b-a3b"), name="", hf_id="", aliases=())


def _cfg(model: str, tp: int, **cache) -> SimConfig:
    """A config for `model`, built without SimConfig's start-up check (which refuses the group
    kinds the scheduler has no manager for yet): resolve_cache is what is tested."""
    cfg = SimConfig()
    cfg.hardware = HardwareConfig(model=model, gpu="h100", tp=tp)
    cfg.cache = replace(cfg.cache, **cache)
    return cfg


def test_a_hybrid_model_runs_with_vllms_groups_and_pool():
    cfg = _cfg("gemma-3-27b", 2)
    cache, cap = resolve_cache(cfg)
    layout = kv_layout(resolve_model("gemma-3-27b"), 2, 16, max_model_len=131072)
    assert cache.attention == "groups" and cache.kv_cache_groups == layout.groups
    assert cap.num_gpu_blocks == cache.num_gpu_blocks == layout.num_blocks(cap.free_bytes)
    assert cap.kv_bytes_per_block == layout.page_size_bytes * 10  # 10 layers per group
    # one request of max_model_len: 131072/16 blocks in the full group, the window's in each of six
    assert blocks_for_max_model_len(cache, 131072, 2048) == 8192 + 6 * (-(-(1023 + 2048) // 16) + 1)


def test_chunked_layers_run_as_full_attention_as_vllms_default_has_them():
    """vLLM 0.19.1 turns its hybrid manager off for chunked local attention unless
    VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1 (config/vllm.py, "a latency regression")."""
    cache, cap = resolve_cache(_cfg("llama-4-scout-17b-16e", 4))
    assert cache.attention == "full" and not cache.kv_cache_groups
    layout = kv_layout(resolve_model("llama-4-scout-17b-16e"), 4, 16, max_model_len=4096,
                       disable_hybrid_kv_cache_manager=True)  # vLLM with its hybrid manager off
    assert cap.num_gpu_blocks == layout.num_blocks(cap.free_bytes)


def test_kv_events_turn_the_hybrid_manager_off_as_in_vllm():
    cache, _ = resolve_cache(_cfg("gemma-3-27b", 2, enable_kv_cache_events=True))
    assert cache.attention == "full" and cache.kv_cache_groups == ()  # one full group: the plain layout
    with pytest.raises(InputError, match="failed to convert"):
        resolve_cache(_cfg("nemotron-h-8b", 1, enable_kv_cache_events=True))


def test_mamba_cache_mode_and_block_size_come_out_as_vllm_resolves_them():
    cache, _ = resolve_cache(_cfg("qwen3-next-80b-a3b", 4))
    assert (cache.block_size, cache.mamba_cache_mode) == (272, "align")  # GDN state at tp 4: 17 x 16 tokens
    assert {g.block_size for g in cache.kv_cache_groups} == {272}
    cache, _ = resolve_cache(_cfg("nemotron-h-8b", 1, mamba_cache_mode="align"))
    assert cache.mamba_cache_mode == "align" and cache.block_size == 528
    cache, _ = resolve_cache(_cfg("nemotron-h-8b", 1))
    assert cache.mamba_cache_mode == "all" and cache.block_size == 768  # lcm(256, 16) x 3
    cache, _ = resolve_cache(_cfg("qwen3-next-80b-a3b", 4, enable_prefix_caching=False))
    assert cache.mamba_cache_mode == "none"
    assert [g.block_size for g in cache.kv_cache_groups] == [262144] * 3 + [272]  # max_model_len per state


def test_a_plain_model_keeps_its_cache_config():
    cfg = _cfg("qwen2.5-vl-7b", 1)
    cache, _ = resolve_cache(cfg)
    assert cache.attention == "full" and not cache.kv_cache_groups


@pytest.mark.skipif("mamba" in MANAGERS.names(), reason="the scheduler has a Mamba manager now")
def test_a_hybrid_mamba_model_gets_its_groups():
    cache, _ = resolve_cache(_cfg("qwen3-next-80b-a3b", 4))
    assert cache.attention == "groups" and {g.kind for g in cache.kv_cache_groups} == {"full", "mamba"}


@pytest.mark.slow
@pytest.mark.parametrize("model,tp", [("gemma-3-27b", 2), ("qwen2.5-vl-7b", 1), ("llama-4-scout-17b-16e", 4),
                                      ("qwen3-next-80b-a3b", 4), ("nemotron-h-8b", 1)])
def test_a_short_replay_runs_where_the_scheduler_has_the_kinds(model, tp):
    """End to end: skipped for a model whose group kinds the scheduler has no manager for yet."""
    layout = kv_layout(resolve_model(model), tp, 16, max_model_len=4096)
    missing = {g.kind for g in layout.groups} - set(MANAGERS.names())
    if missing:
        pytest.skip(f"the scheduler has no manager for {sorted(missing)} yet (branch kvgroups)")
    from servesim.running import load_trace, run

    cfg = SimConfig(hardware=HardwareConfig(model=model, gpu="h100", tp=tp))
    cfg.scheduler = replace(cfg.scheduler, max_model_len=4096)
    result = run(cfg, load_trace(None, max_requests=8), out_dir=None)
    assert result.summary["num_finished"] == 8
    cache, _ = resolve_cache(cfg)  # vLLM's layout: Llama 4's hybrid manager is off by default
    if cache.attention == "groups":  # vLLM's start-up figures for the pool of groups
        assert result.summary["kv_cache_groups"]["groups"] == [f"{g.kind}:{g.block_size}" for g in cache.kv_cache_groups]
