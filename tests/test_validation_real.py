"""`servesim validate` on the real vLLM 0.19 run (RTX PRO 6000, Llama-3.1-8B); skipped without /work/shared."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

RUN = Path("/work/shared/data/benchmarks/llmservingsim_vllm_runs/RTXPRO6000_Llama-3.1-8B")
WORKLOAD = Path("/work/shared/data/traces/llmservingsim_sharegpt/sharegpt-llama-3.1-8b-300-sps10.jsonl.gz")

pytestmark = [pytest.mark.skipif(not (RUN.is_dir() and WORKLOAD.is_file()), reason="/work/shared data not present"),
              pytest.mark.slow]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    from typer.testing import CliRunner

    from servesim.cli import _register, app

    _register()
    out = tmp_path_factory.mktemp("validate")
    res = CliRunner().invoke(app, ["validate", str(RUN), "--workload", str(WORKLOAD), "--out", str(out)])
    assert res.exit_code == 0, res.output
    return json.loads((out / "validation.json").read_text()), out, res.output


def test_validation_json_has_every_required_key(report):
    rep, out, _ = report
    for m in ("ttft", "tpot", "e2e"):
        assert set(rep["per_request"][m]) >= {"mape", "median_ape"}
    for m in ("ttft", "tpot", "e2e", "queueing"):
        for st in ("mean", "p50", "p90", "p99"):
            assert set(rep["aggregate"][m][st]) == {"measured", "simulated", "error"}
    for series in ("running", "waiting", "kv_cache_pct"):
        assert "mae" in rep["timeseries"][series]
    assert (out / "index.html").exists() and (out / "cdf.png").exists() and (out / "timeseries.png").exists()


def test_values_are_sane(report):
    rep, _, output = report
    assert rep["pairing"]["num_paired"] == 300 and rep["pairing"]["num_length_mismatch"] == 0
    assert rep["pairing"]["max_arrival_offset_s"] < 0.2
    s = rep["settings"]
    assert (s["max_num_seqs"], s["max_num_batched_tokens"], s["tp"], s["gpu"]) == (128, 2048, 1, "rtx-pro-6000")
    assert s["async_scheduling"] is True  # vLLM 0.19 default
    assert rep["kv_cache"]["source"] == "derived" and not rep["kv_cache"]["pool_was_binding"]
    assert rep["cost_model"]["name"] == "calibrated"
    for m in ("ttft", "tpot", "e2e"):  # errors are fractions, well below 100 %
        assert 0 <= rep["per_request"][m]["median_ape"] < 0.3
        assert 0 <= rep["per_request"][m]["mape"] < 0.5
    agg = rep["aggregate"]["e2e"]["mean"]
    assert 25 < agg["measured"] < 32 and 20 < agg["simulated"] < 36  # measured mean E2E 28.2 s
    assert abs(rep["makespan"]["error"]) < 0.2
    assert rep["timeseries"]["running"]["mae"] < 20
    assert rep["timeseries"]["kv_cache_pct"]["measured_valid"] is False  # the run logged 0 % throughout
    assert "median APE" in output
    assert rep["cost_model"]["skew_alpha"] == 0.0543  # the profile's measured skew fit
    assert rep["cost_model"]["skew_alpha_source"] == "measured (the profile's skew sweep, skew_fit alpha_default)"


def test_meets_the_fidelity_targets(report):
    """Regression guard for docs/FIDELITY.md: nothing in the cost model was fitted to this run."""
    rep = report[0]
    assert rep["per_request"]["e2e"]["median_ape"] <= 0.05
    assert rep["per_request"]["ttft"]["median_ape"] <= 0.10


def test_skew_alpha_override(tmp_path):
    from servesim.validation_report import ValidateOptions, validate_run
    from servesim.traces.errors import InputError

    off = validate_run(RUN, WORKLOAD, ValidateOptions(skew_alpha=0.0, plots=False), out_dir=tmp_path / "off")
    assert off["cost_model"]["skew_alpha"] == 0.0
    assert off["cost_model"]["skew_alpha_source"] == "given (skew_alpha)"  # --skew-alpha is the parameter
    # Without the correction decode steps are cheaper, so the simulated run finishes sooner.
    assert off["aggregate"]["e2e"]["mean"]["simulated"] < 0.97 * off["aggregate"]["e2e"]["mean"]["measured"]
    # the roofline prices the decodes' imbalance too: the factor is taken, and reported
    roof = validate_run(RUN, WORKLOAD, ValidateOptions(cost_model="roofline", skew_alpha=0.1, plots=False),
                        out_dir=tmp_path / "roof")
    assert roof["cost_model"]["skew_alpha"] == 0.1
    with pytest.raises(InputError):
        validate_run(RUN, WORKLOAD, ValidateOptions(cost_model="roofline", skew_alpha=1.5, plots=False),
                     out_dir=tmp_path / "bad")
