"""Multimodal workloads: the canonical mm_items field, the vlm generator's image tokens, the simulated
engine (StepShape.num_encoder_tokens, the encoder-cache hit rate, bad items, the fast path's refusal)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from servesim.scheduler import CacheConfig, SchedulerConfig
from servesim.scheduler.multimodal import MultiModalFeatureSpec
from servesim.simulator.build import build_engine
from servesim.simulator.config import CostModelConfig, SimConfig
from servesim.simulator.cost_model import register_cost_model
from servesim.simulator.cost_model.cpu_overhead import CpuOverheadConfig
from servesim.simulator.engine import Engine
from servesim.simulator.outputs import build_summary
from servesim.traces import load_workload, save_workload
from servesim.traces.errors import InputError
from servesim.traces.synthetic import make_workload
from servesim.traces.synthetic_config import ImageConfig
from servesim.traces.vlm import image_tokens, max_image_tokens
from servesim.traces.workload import RequestSpec, Workload

ITEMS = (MultiModalFeatureSpec(4, 30, "cat"), MultiModalFeatureSpec(40, 12, "dog", "video"))


def _spec(rid: str, items=ITEMS, prompt_len: int = 64, t: float = 0.0) -> RequestSpec:
    return RequestSpec(rid, t, prompt_len=prompt_len, output_len=3, mm_items=items)


@pytest.mark.parametrize("name", ["w.jsonl", "w.csv", "w.parquet"])
def test_canonical_traces_keep_multimodal_items(tmp_path, name):
    workload = Workload([_spec("a"), RequestSpec("b", 1.0, prompt_len=8, output_len=2)], name="w", source="t")
    loaded = load_workload(save_workload(workload, tmp_path / name))
    assert loaded.requests == workload.requests


def test_the_jsonl_field_is_a_list_of_objects(tmp_path):
    path = save_workload(Workload([_spec("a")], name="w", source="t"), tmp_path / "w.jsonl")
    row = json.loads(path.read_text())
    assert row["mm_items"] == [{"offset": 4, "length": 30, "mm_hash": "cat"},
                               {"offset": 40, "length": 12, "mm_hash": "dog", "modality": "video"}]


@pytest.mark.parametrize("items, match", [
    ([{"offset": 60, "length": 10, "mm_hash": "x"}], r"'a'.*past the prompt's end \(64 tokens\)"),
    ([{"offset": 0, "length": 10, "mm_hash": "x"}, {"offset": 9, "length": 2, "mm_hash": "y"}], "overlaps"),
    ([{"offset": 0, "length": 0, "mm_hash": "x"}], "length must be >= 1"),
    ([{"offset": 0, "length": 5}], "bad multimodal item 0"),
    ("not a list", "bad value"),
])
def test_bad_items_are_an_input_error_naming_file_line_and_field(tmp_path, items, match):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"request_id": "a", "arrival_time_s": 0, "prompt_len": 64, "output_len": 2,
                                "mm_items": items}) + "\n")
    with pytest.raises(InputError, match=match) as err:
        load_workload(path)
    assert err.value.field == "mm_items" and err.value.line == 1 and "bad.jsonl" in str(err.value.path)


# Checked against transformers 5.5.3's smart_resize (models/qwen2_vl/image_processing_qwen2_vl.py)
# with Qwen2.5-VL's min_pixels 3136 and max_pixels 12845056.
@pytest.mark.parametrize("height, width, tokens", [
    (720, 1280, 1196), (1080, 1920, 2691), (28, 28, 4), (224, 224, 64), (10000, 10000, 16129),
    (300, 7000, 2750), (4032, 3024, 15552), (50, 60, 4),
])
def test_image_tokens_follow_qwen2_5_vl_processor(height, width, tokens):
    assert image_tokens(height, width, ImageConfig()) == tokens


def test_max_tokens_per_image_and_the_aspect_ratio_refusal():
    assert max_image_tokens(ImageConfig()) == 16384
    with pytest.raises(InputError, match="aspect ratio must be smaller than 200"):
        image_tokens(10, 2100, ImageConfig())


def test_vlm_generator_places_images_after_the_prefix_and_shares_pool_images():
    params = {"num_requests": 40, "prompt_len": 50, "output_len": 5, "prefix": {"num_groups": 1, "prefix_len": 16},
              "images": {"images_per_request": 2, "shared_fraction": 0.5, "num_shared_images": 3}}
    w = make_workload("vlm", params, np.random.default_rng(3))
    assert w == make_workload("vlm", params, np.random.default_rng(3))  # deterministic
    hashes = [it.mm_hash for r in w.requests for it in r.mm_items]
    shared = [h for h in hashes if h.startswith("shared-image-")]
    assert 20 < len(shared) < 60 and len(set(shared)) == 3  # about half of 80, from a pool of 3
    for r in w.requests:
        first, second = r.mm_items
        assert first.offset == 16 and second.offset == first.end  # after the shared prefix, back to back
        assert r.prompt_len == 16 + first.length + second.length + 50
        assert first.length == 1196  # 1280x720
    # An image's placeholder ids are the image's: two requests showing one image hold equal ids there.
    a, b = [r for r in w.requests if r.mm_items[0].mm_hash == "shared-image-0"][:2]
    ids_a, ids_b = a.token_ids(), b.token_ids()
    assert ids_a[16:16 + 1196] == ids_b[16:16 + 1196] and ids_a[:16] == ids_b[:16]


def test_images_and_sessions_do_not_mix():
    with pytest.raises(InputError, match="images or sessions"):
        make_workload("vlm", {"num_requests": 2, "sessions": {}}, np.random.default_rng(0))


class _LinearCost:
    name = "test-mm-linear"
    shapes: list = []

    def step_time_s(self, shape) -> float:
        _LinearCost.shapes.append(shape)
        return 0.005 + 0.001 * sum(shape.num_new_tokens)


register_cost_model("test-mm-linear")(lambda **kw: _LinearCost())


def _cfg(**sched_kw) -> SimConfig:
    return SimConfig(scheduler=SchedulerConfig(max_model_len=256, max_num_batched_tokens=256, **sched_kw),
                     cache=CacheConfig(block_size=4, num_gpu_blocks=200), derive_num_gpu_blocks=False,
                     cost_model=CostModelConfig(name="test-mm-linear", cpu_overhead=CpuOverheadConfig(0.001, 0.0, 0.0)))


def test_the_engine_prices_encoder_tokens_and_reports_the_encoder_cache_hit_rate():
    _LinearCost.shapes.clear()
    items_b = (MultiModalFeatureSpec(10, 30, "cat"),)  # the same image as a's first, elsewhere
    w = Workload([_spec("a"), _spec("b", items_b, t=5.0)], name="t", source="test")
    cfg = _cfg(mm_max_tokens_per_item=64)
    engine = build_engine(cfg, w)
    assert engine.planner_declined.startswith("multimodal requests")
    res = engine.run()
    encoded = [s.num_encoder_tokens for s in _LinearCost.shapes if s.num_encoder_tokens]
    assert encoded == [(30, 12)]  # a's two items in its first step; b reuses "cat" from the cache
    summary = build_summary(cfg, res, 2)
    assert summary["encoder_cache_query_tokens"] == 72 and summary["encoder_cache_hit_tokens"] == 30
    assert summary["encoder_cache_hit_rate"] == pytest.approx(30 / 72)
    assert summary["fast_path"]["declined_reason"].startswith("multimodal requests")


@pytest.mark.parametrize("sched_kw, match", [
    ({}, "takes no multimodal input"),
    ({"mm_max_tokens_per_item": 8, "encoder_cache_size": 20, "max_num_encoder_input_tokens": 20},
     r"'a': multimodal item 0 has 30 tokens.*hold at most 20"),
])
def test_items_the_engine_could_never_encode_are_refused_by_request(sched_kw, match):
    with pytest.raises(InputError, match=match) as err:
        Engine(_cfg(**sched_kw), Workload([_spec("a")], name="t", source="test"))
    assert err.value.field == "scheduler.mm_max_tokens_per_item"


def test_a_cluster_refuses_multimodal_requests():
    from servesim.simulator.cluster.cluster import Cluster
    from servesim.simulator.cluster.config import ClusterConfig

    with pytest.raises(InputError, match="'a' has multimodal items; a cluster does not run"):
        Cluster(ClusterConfig(), Workload([_spec("a")], name="t", source="test"))


def test_one_mm_hash_has_one_size():
    w = Workload([_spec("a"), _spec("b", (MultiModalFeatureSpec(0, 31, "cat"),), t=1.0)], name="t", source="test")
    with pytest.raises(InputError, match=r"'b': multimodal item 0 \('cat'\) has 31 tokens, another request's .* 30"):
        Engine(_cfg(mm_max_tokens_per_item=64), w)


def test_a_vision_language_model_takes_images_as_its_processor_sizes_them():
    """vLLM's max tokens per item comes from the model: Qwen2.5-VL's processor max_pixels 12,845,056
    over 28 x 28 pixels per embedding = 16,384; Gemma 3's mm_tokens_per_image = 256; a text model 0."""
    import dataclasses

    from servesim.simulator.config import SimConfig
    from servesim.simulator.startup import resolved

    def mm(model, **sched):
        cfg = SimConfig()
        cfg.hardware = dataclasses.replace(cfg.hardware, model=model)
        cfg.scheduler = dataclasses.replace(cfg.scheduler, **sched)
        return resolved(cfg).scheduler.mm_max_tokens_per_item

    assert mm("qwen2.5-vl-7b") == 16384 and mm("gemma-3-27b") == 256 and mm("llama-3.1-8b") == 0
    assert mm("qwen2.5-vl-7b", mm_max_tokens_per_item=1280) == 1280  # a smaller max_pixels, set explicitly
