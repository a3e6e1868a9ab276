"""BLIS per-stage runs (../shared/data/benchmarks/blis_h100_trainval): adapter structure only
(the full comparisons run in tools/fidelity_table.py); skipped without the shared data."""

from pathlib import Path

import pytest

from servesim.simulator.validation.blis import blis_config, blis_workload, find_experiment, is_blis_dir, load_experiments

BLIS = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "benchmarks" / "blis_h100_trainval"
pytestmark = pytest.mark.skipif(not BLIS.is_dir(), reason="shared BLIS data not present")


def test_thirteen_measured_runs_resolve_to_specs_and_gpus():
    assert is_blis_dir(BLIS)
    exps = load_experiments(BLIS)
    assert len(exps) == 13
    for e in exps:
        cfg, info = blis_config(e)
        assert info["gpu"] == "h100" and cfg.cache.num_gpu_blocks == e.num_gpu_blocks
    scout = find_experiment(BLIS, "17")
    assert blis_config(scout)[1]["weight_dtype"] == "fp8"
    # every dense deployment has a shipped H100 kernel fit; the FP8 MoE runs use the roofline +
    # measured MoE tables
    models = {e.id: blis_config(e)[1] for e in exps}
    assert {i: m["cost_model"] for i, m in models.items() if m["cost_model"] != "calibrated"} == \
        {i: "roofline" for i, m in models.items() if m["model"].startswith("llama-4-scout")}


def test_workload_follows_the_stage_spec():
    e = find_experiment(BLIS, "17")  # 600 s at 2.5 req/s, then 600 s at 6 req/s
    wl, stage = blis_workload(e)
    assert len(wl.requests) == 600 * 2.5 + 600 * 6.0
    assert (stage == 0).sum() == 1500
    r = wl.requests[0]
    assert r.prompt_len == e.system_prompt_len + e.question_len + 25 and r.prefix_len == e.system_prompt_len
    assert {q.prefix_group for q in wl.requests} == set(range(e.num_system_prompts))
    assert wl.requests[1500].arrival_time_s == pytest.approx(600.0)


def test_host_and_sets_apply_on_top_of_the_rebuilt_config():
    from servesim.simulator.validation.blis import _with_overrides
    from servesim.traces.errors import InputError

    e = find_experiment(BLIS, "60")  # Llama-3.1-70B TP 4
    cfg, info = blis_config(e)
    same, same_info = _with_overrides(cfg, info, None, ())
    assert same is cfg and "overrides" not in same_info
    cfg2, info2 = _with_overrides(cfg, info, "h100-hgx", ("hardware.disable_custom_all_reduce=true",))
    assert cfg2.hardware.host == "h100-hgx" and cfg2.hardware.disable_custom_all_reduce is True
    assert info2["overrides"] == {"hardware.host": "h100-hgx", "hardware.disable_custom_all_reduce": "true"}
    assert info2["host"] == "h100-hgx"
    with pytest.raises(InputError) as err:  # another GPU's host
        _with_overrides(cfg, info, "rtx-pro-6000-workstation", ())
    assert "hardware.host" in str(err.value)
    with pytest.raises(InputError):
        _with_overrides(cfg, info, None, ("hardware.no_such_key=1",))
