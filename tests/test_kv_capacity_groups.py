"""KV cache groups and pool size of hybrid models, exactly as vLLM 0.19.1 computes them.

The expected values in tests/golden/kv_capacity_vllm.json come from vLLM 0.19.1's own functions
(tools/kv_capacity_oracle.py, run in the oracle's install): for every layer its KVCacheSpec
(v1/kv_cache_interface.py: FullAttentionSpec, SlidingWindowSpec, ChunkedLocalAttentionSpec,
MambaSpec with the model class's get_mamba_state_shape_from_config), then
HybridAttentionMambaModelConfig.verify_and_update_config (model_executor/models/config.py:156-318:
the attention block raised to hold a Mamba state, the Mamba page padded to the attention page;
MambaModelConfig :423-480: mamba_cache_mode and mamba_block_size), then get_kv_cache_configs
(v1/core/kv_cache_utils.py:1508-1617: get_kv_cache_groups :1222-1262 with
_get_kv_cache_groups_uniform_page_size :959-1078 and unify_hybrid_kv_cache_specs :1160-1219,
get_num_blocks :839-854, the per-stage minimum), _report_kv_cache_config :1287-1329 (the logged KV
size in tokens), get_max_concurrency_for_kv_cache_config :802-820 and
_check_enough_kv_cache_memory / _estimate_max_model_len_from_groups :619-653, :1370-1402.
"""

import json
from pathlib import Path

import pytest

from servesim.simulator.kv_groups import kv_cache_report, kv_layout, resolve_mamba_cache_mode, stage_ranges
from servesim.simulator.specs import resolve_model
from servesim.traces.errors import InputError

GOLDEN = json.loads((Path(__file__).parent / "golden" / "kv_capacity_vllm.json").read_text())
_NAMES = {"llama-4-scout": "llama-4-scout-17b-16e"}  # config file -> catalogue name


def _layout(case):
    model = resolve_model(_NAMES.get(case["model"], case["model"]))
    return model, kv_layout(model, case["tp"], case["block_size"], mamba_cache_mode=case["mamba_cache_mode"],
                            enable_prefix_caching=case["enable_prefix_caching"], max_model_len=case["max_model_len"],
                            disable_hybrid_kv_cache_manager=case["disable_hybrid_kv_cache_manager"])


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=[c["name"] for c in GOLDEN["cases"]])
def test_groups_and_num_blocks_equal_vllms(case):
    model, layout = _layout(case)
    stages = stage_ranges(model.num_layers, case["pp"]) if case["pp"] > 1 else None
    num_blocks = layout.num_blocks(case["available_bytes"], stages)
    want = case["expect"]
    assert num_blocks == want["num_blocks"]
    assert layout.page_size_bytes == want["page_size_bytes"]
    assert layout.block_size == want["attention_block_size"]
    assert [(g.kind, g.block_size) for g in layout.groups] == [(g["kind"], g["block_size"]) for g in want["groups"]]
    if case["pp"] == 1:  # the stage's own layers when pipelined
        assert [sorted(x) for x in layout.group_layers] == [g["layers"] for g in want["groups"]]
    mamba = [g for g in layout.groups if g.kind == "mamba"]
    assert layout.mamba_cache_mode == want["resolved_mamba_cache_mode"]
    if mamba:
        assert {g.block_size for g in mamba} == {want["mamba_block_size"]}
        assert {g.mamba_cache_mode for g in mamba} == {want["resolved_mamba_cache_mode"]}
    assert layout.kv_cache_size_tokens(num_blocks) == want["kv_cache_size_tokens"]
    if want["max_concurrency"] is not None:
        assert layout.max_concurrency(num_blocks, case["max_model_len"], case["max_num_batched_tokens"]) == \
            pytest.approx(want["max_concurrency"], rel=1e-12)
        report = kv_cache_report(layout.groups, num_blocks, case["max_model_len"], case["max_num_batched_tokens"])
        assert report["max_concurrency"] == pytest.approx(want["max_concurrency"], rel=1e-12)
        assert report["gpu_kv_cache_size_tokens"] == want["kv_cache_size_tokens"]


def test_a_pool_too_small_for_one_request_estimates_vllms_max_model_len():
    case = GOLDEN["refusals"][0]
    _, layout = _layout(case)
    num_blocks = layout.num_blocks(case["available_bytes"])
    assert layout.blocks_per_request(case["max_model_len"], case["max_num_batched_tokens"]) > num_blocks
    assert layout.estimate_max_model_len(num_blocks, case["max_model_len"], case["max_num_batched_tokens"]) == \
        case["estimated_max_model_len"]


def test_qwen3_next_state_and_block_size_by_hand():
    """GDN state at tp=1: conv (3, 2*16*128 + 32*128) bf16 + temporal (32, 128, 128) bf16 =
    49152 + 1048576 bytes; attention 2 KV heads x 256 x (K+V) x 2 bytes = 2048 bytes a token, so
    the block is 16 * cdiv(1097728, 16 * 2048) = 544 tokens and the Mamba page is padded to
    544 * 2048 = 1114112 bytes. Groups: 36 GDN layers in three groups of 12, then the 12 full."""
    m = resolve_model("qwen3-next-80b-a3b")
    assert m.linear_attention.state_bytes(1, 2) == 49152 + 1048576
    layout = kv_layout(m, 1, 16, max_model_len=4096)
    assert (layout.block_size, layout.page_size_bytes, layout.group_size) == (544, 1114112, 12)
    assert [g.kind for g in layout.groups] == ["mamba"] * 3 + ["full"]
    assert layout.group_layers[0] == tuple(range(0, 48, 4))  # every third GDN layer: 0, 4, 8, ...
    assert layout.group_layers[3] == tuple(range(3, 48, 4))  # the full layers
    assert layout.num_blocks(12 * 1114112 * 10 + 5) == 10


def test_mamba_cache_mode_resolution_follows_vllm():
    qn, nh = resolve_model("qwen3-next-80b-a3b"), resolve_model("nemotron-h-8b")
    assert resolve_mamba_cache_mode(qn, "none", True) == "align"  # GDN: no "all" support
    assert resolve_mamba_cache_mode(qn, "all", True) == "align"
    assert resolve_mamba_cache_mode(nh, "none", True) == "all"
    assert resolve_mamba_cache_mode(nh, "align", True) == "align"
    assert resolve_mamba_cache_mode(nh, "all", False) == "none"  # prefix caching off
    assert resolve_mamba_cache_mode(resolve_model("llama-3.1-8b"), "align", True) == "none"


def test_a_mamba_model_without_the_hybrid_manager_is_refused():
    with pytest.raises(InputError, match="failed to convert"):
        kv_layout(resolve_model("qwen3-next-80b-a3b"), 1, 16, max_model_len=4096,
                  disable_hybrid_kv_cache_manager=True)


def test_group_sizes_use_the_larger_kind_under_one_and_a_half_times_the_smaller():
    """gpt-oss-20b: 12 sliding + 12 full layers, one group each of 12."""
    layout = kv_layout(resolve_model("gpt-oss-20b"), 1, 16, max_model_len=4096)
    assert [(g.kind, len(x)) for g, x in zip(layout.groups, layout.group_layers)] == \
        [("sliding_window", 12), ("full", 12)]


def test_a_full_attention_model_is_one_group_of_every_layer():
    layout = kv_layout(resolve_model("llama-3.1-8b"), 1, 16, max_model_len=8192)
    assert len(layout.groups) == 1 and layout.group_size == 32
    assert layout.num_blocks(32 * 2 * 8 * 128 * 2 * 16 * 7) == 7
