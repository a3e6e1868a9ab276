"""Shipped calibrated cost models: lookup by (model, gpu, tp), index consistency, sane step times."""

from __future__ import annotations

import pytest

from servesim.simulator.cost_model import StepShape, make_cost_model
from servesim.simulator.cost_model.calibrated import (
    HERE,
    available_calibrated,
    find_calibrated,
    load_calibrated,
    read_fitted_data,
)
from servesim.traces.errors import InputError

REQUIRED = [("llama-3.1-8b", "h100", 1), ("llama-3.1-8b", "a100-80gb", 1), ("llama-3.1-8b", "rtx4090", 1),
            ("llama-3.1-8b", "rtx-pro-6000", 1), ("llama-3.1-70b", "h100", 2), ("llama-3.1-70b", "h100", 4)]


@pytest.mark.parametrize("model,gpu,tp", REQUIRED)
def test_required_combinations_are_shipped(model, gpu, tp):
    path = find_calibrated(model, gpu, tp)
    assert path is not None and path.exists()


def test_lookup_accepts_aliases_and_misses_cleanly():
    assert find_calibrated("meta-llama/Llama-3.1-8B", "NVIDIA H100 80GB HBM3", 1) == \
        find_calibrated("llama-3.1-8b", "h100", 1)
    assert find_calibrated("llama-3.1-8b", "RTXPRO6000") is not None
    assert find_calibrated("llama-3.1-8b", "l40s", 1) is None
    assert find_calibrated("llama-3.1-70b", "h100", 3) is None
    with pytest.raises(InputError) as exc:
        load_calibrated("llama-3.1-8b", "l40s", 1)
    assert "h100" in str(exc.value)  # lists what exists


def test_registered_name_builds_the_shipped_model():
    cm = make_cost_model("calibrated", model="llama-3.1-8b", gpu="h100", tp=1)
    assert (cm.model, cm.gpu, cm.tp) == ("llama-3.1-8b", "h100", 1)
    with pytest.raises(InputError):
        make_cost_model("calibrated", model="llama-3.1-8b", gpu="h100", tp=1, path="x.json")


def test_skew_alpha_comes_from_the_profiles_that_measured_it():
    alphas = {(e["model"], e["gpu"], e["tp"]): e["skew_alpha"] for e in available_calibrated()}
    assert alphas[("llama-3.1-8b", "rtx-pro-6000", 1)] == 0.0543
    assert alphas[("qwen3-32b", "rtx-pro-6000", 2)] == 0.0649
    assert alphas[("llama-3.1-8b", "rtx4090", 1)] is None  # its profile ran no skew sweep
    assert alphas[("llama-3.1-8b", "h100", 1)] is None  # aiconfigurator: no skew data
    skewed = StepShape((1,) * 64, tuple(100 + 60 * i for i in range(64)), 64)
    measured = make_cost_model("calibrated", model="llama-3.1-8b", gpu="rtx-pro-6000", tp=1)
    off = make_cost_model("calibrated", model="llama-3.1-8b", gpu="rtx-pro-6000", tp=1, skew_alpha=0)
    assert measured.skew_alpha == 0.0543 and off.skew_alpha == 0.0
    assert measured.step_time_s(skewed) > off.step_time_s(skewed)
    uniform = StepShape((1,) * 64, (2000,) * 64, 64)
    assert measured.step_time_s(uniform) == off.step_time_s(uniform)
    # A split (aiconfigurator) table carries the FlashAttention profiles' alpha (decode_skew.py);
    # skew_alpha= overrides it there too.
    carried = make_cost_model("calibrated", model="llama-3.1-8b", gpu="h100", tp=1)
    assert carried.skew_alpha == 0.06095 and carried.skew_alpha_source.startswith("carried from")
    assert make_cost_model("calibrated", model="llama-3.1-8b", gpu="h100", tp=1, skew_alpha=0.1).skew_alpha == 0.1
    with pytest.raises(InputError):
        make_cost_model("calibrated", model="llama-3.1-8b", gpu="rtx-pro-6000", tp=1, skew_alpha=2)


def test_index_matches_files_and_is_small():
    entries = available_calibrated()
    assert len(entries) >= len(REQUIRED)
    files = {p.name for p in HERE.glob("*.json.gz")}
    assert {e["file"] for e in entries} == files
    assert sum((HERE / f).stat().st_size for f in files) < 1_000_000
    for e in entries:
        data = read_fitted_data(HERE / e["file"])
        assert (data["model"], data["gpu"], data["tp"]) == (e["model"], e["gpu"], e["tp"])
        assert data["metadata"]["fit_error"], e["file"]
        assert e["compaction_max_rel_drift"] < 1e-3
        assert all(not p.startswith("/") for p in data["metadata"]["paths"])  # no local paths shipped
        for op, err in e["fit_error"].items():  # measured ops fit their held-out points within 25 %
            if err["origin"] != "roofline" and err["mape_holdout"] is not None:
                assert err["mape_holdout"] < 0.25, (e["file"], op, err)


@pytest.mark.parametrize("entry", available_calibrated(), ids=lambda e: e["file"])
def test_every_shipped_model_gives_sane_step_times(entry):
    cm = load_calibrated(entry["model"], entry["gpu"], entry["tp"])
    one = cm.step_time_s(StepShape((1,), (512,), 1))
    many = cm.step_time_s(StepShape((1,) * 64, (2048,) * 64, 64))
    prefill = cm.step_time_s(StepShape((2048,), (0,), 1))
    assert 1e-3 < one < 0.2 and one < many and one < prefill < 5.0
