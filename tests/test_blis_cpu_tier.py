"""BLIS runs that served with vLLM's CPU KV tier: the recorded cpu_kv_blocks become the run's
`--kv-offloading-size`, sized by vLLM's arithmetic (over all TP ranks); skipped without the shared data."""

from dataclasses import replace
from pathlib import Path

import pytest

from servesim.simulator.build import build_engine
from servesim.simulator.kv_offload import tier_num_blocks
from servesim.simulator.validation.blis import (BlisStage, blis_config, blis_workload, cpu_tier_gib, find_experiment,
                                                format_blis_report, load_experiments)
from servesim.traces.errors import InputError

BLIS = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "benchmarks" / "blis_h100_trainval"
pytestmark = pytest.mark.skipif(not BLIS.is_dir(), reason="shared BLIS data not present")


def test_every_recorded_tier_is_8_gib_and_the_scout_runs_17_20_21_have_none():
    tiers = {e.id: cpu_tier_gib(e) for e in load_experiments(BLIS)}
    assert {i for i, g in tiers.items() if g is None} == {"17", "20", "21"}
    assert {g for g in tiers.values() if g is not None} == {8}


@pytest.mark.parametrize("exp_id, tp, num_blocks", [
    ("67", 1, 1024),   # Llama-2-7B: 8 GiB // (512 KiB/token x 16); recorded 1023 (upstream's estimate)
    ("63", 1, 3276),   # Mistral-Nemo TP1: as recorded
    ("62", 2, 3276),   # Mistral-Nemo TP2: recorded 6553 = 8 GiB over ONE GPU's block; vLLM divides by both ranks'
    ("60", 4, 1638),   # Llama-3.1-70B TP4: recorded 6553
    ("48", 2, 2730),   # Llama-4-Scout TP2: recorded 5461
])
def test_the_modelled_tier_has_vllms_block_count_over_all_ranks(exp_id, tp, num_blocks):
    e = find_experiment(BLIS, exp_id)
    cfg, info = blis_config(e)
    assert cfg.kv_offload.kv_offloading_size == 8 and info["cpu_kv_tier_gib"] == 8
    assert cfg.hardware.tp == tp and tier_num_blocks(cfg, cfg.cache) == num_blocks


def test_no_cpu_tier_leaves_the_run_without_offload_but_records_it():
    cfg, info = blis_config(find_experiment(BLIS, "60"), cpu_tier=False)
    assert not cfg.kv_offload.enabled
    assert info["cpu_kv_tier_gib"] is None and info["cpu_kv_tier_recorded_gib"] == 8
    cfg, info = blis_config(find_experiment(BLIS, "17"))  # no tier recorded: nothing to model
    assert not cfg.kv_offload.enabled and info["cpu_kv_tier_recorded_gib"] is None


def test_a_block_count_that_is_no_whole_gib_of_the_models_kv_is_refused():
    e = find_experiment(BLIS, "67")  # Llama-2-7B TP1: 8 MiB per block, 128 blocks per GiB
    assert cpu_tier_gib(replace(e, cpu_kv_blocks=640)) == 5
    assert cpu_tier_gib(replace(e, cpu_kv_blocks=639)) == 5  # one block under, as upstream's estimate gives
    with pytest.raises(InputError) as err:
        cpu_tier_gib(replace(e, cpu_kv_blocks=700))
    assert err.value.field == "cpu_kv_blocks" and "640" in err.value.allowed
    assert "blis_trainval15_experiment_configs.json" in str(err.value)
    with pytest.raises(InputError):  # under half a GiB: no whole GiB at all
        cpu_tier_gib(replace(e, cpu_kv_blocks=3))


def test_a_short_run_with_the_tier_stores_every_full_block_and_reports_it():
    # Run 67's deployment (Llama-2-7B, 8 GiB tier), 12 s of its workload at 1 req/s.
    e = replace(find_experiment(BLIS, "67"), stages=(BlisStage(12.0, 1.0),), output_len=16)
    wl, _ = blis_workload(e)
    cfg, _ = blis_config(e, cpu_overhead="zero", frontend=False)
    res = build_engine(cfg, wl).run()
    ko = res.kv_offload.summary()
    # 12 requests from 12 of the 23 system prompts (one user each, nothing shared): no GPU or CPU
    # hit; each request's 1059 + 16 - 1 computed tokens fill 67 blocks, stored once each: 66 after
    # the one-chunk prefill, the 67th once decode fills it (two stores per request).
    prompt = e.system_prompt_len + e.question_len + 25
    assert len(wl.requests) == 12 and prompt == 1059 and res.prefix_hits == 0
    assert ko["cpu_query_tokens"] == 12 * prompt and ko["cpu_hit_tokens"] == 0 and ko["num_loads"] == 0
    assert ko["num_stores"] == 24 and ko["bytes_stored_per_gpu"] == 12 * 67 * (8 << 20)
    rep = {"experiment": e.label, "num_requests": len(wl.requests), "settings": blis_config(e)[1],
           "stages": {}, "notes": [], "kv_offload": ko,
           "prefix_cache": {"hit_tokens": res.prefix_hits, "query_tokens": res.prefix_queries, "hit_rate": 0.5}}
    text = format_blis_report(rep)
    assert "CPU KV tier: 0 hit tokens" in text and "GPU prefix cache:" in text
