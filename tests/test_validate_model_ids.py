"""`validate` loads runs of checkpoints the registry knows by architecture, with its defaults: a
Qwen3-30B-A3B-Instruct-2507 DP2 + EP run on RTX PRO 6000 (calibrated -> roofline fallback, the
measured rtx-pro-6000 MoE table, version and re-release warnings) and FP8 checkpoints. A 30-request
slice of the shared RTX PRO 6000 run with its meta.json edited keeps each test to about a second."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

_SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
RUN = _SHARED / "benchmarks" / "llmservingsim_vllm_runs" / "RTXPRO6000_Llama-3.1-8B"
WORKLOAD = _SHARED / "traces" / "llmservingsim_sharegpt" / "sharegpt-llama-3.1-8b-300-sps10.jsonl.gz"
NUM_REQUESTS = 30

pytestmark = pytest.mark.skipif(not (RUN.is_dir() and WORKLOAD.is_file()), reason="/work/shared data not present")


def _slice(tmp_path: Path, folder: str, **engine_kwargs) -> tuple[Path, Path]:
    """The run's first NUM_REQUESTS requests (and workload lines), served as engine_kwargs say."""
    run = tmp_path / folder
    run.mkdir()
    meta = json.loads((RUN / "meta.json").read_text())
    meta["model"] = meta["engine_kwargs"]["model"] = engine_kwargs.pop("model")
    meta["engine_kwargs"].update(engine_kwargs)
    (run / "meta.json").write_text(json.dumps(meta))
    lines = (RUN / "requests.jsonl").read_text().splitlines()[:NUM_REQUESTS]
    (run / "requests.jsonl").write_text("\n".join(lines) + "\n")
    shutil.copy(RUN / "timeseries.csv", run / "timeseries.csv")
    with gzip.open(WORKLOAD, "rt") as fh:
        wl = [next(fh) for _ in range(NUM_REQUESTS)]
    (tmp_path / "wl.jsonl").write_text("".join(wl))
    return run, tmp_path / "wl.jsonl"


def _validate(run: Path, wl: Path, capsys) -> tuple[dict, str]:
    from servesim.simulator.validation.replay import ValidateOptions, compare_run

    rep = compare_run(run, wl, ValidateOptions(plots=False)).report  # the defaults: calibrated, no --model
    return rep, capsys.readouterr().err


def test_qwen3_30b_a3b_instruct_2507_dp2_ep_runs_with_defaults(tmp_path, capsys):
    run, wl = _slice(tmp_path, "RTXPRO6000_Qwen3-30B-A3B", model="Qwen/Qwen3-30B-A3B-Instruct-2507",
                     tensor_parallel_size=1, data_parallel_size=2, enable_expert_parallel=True)
    rep, err = _validate(run, wl, capsys)
    s, cm = rep["settings"], rep["cost_model"]
    assert s["model"] == "qwen3-30b-a3b" and s["model_id"] == "Qwen/Qwen3-30B-A3B-Instruct-2507"
    assert s["model_resolution"] == ("Qwen/Qwen3-30B-A3B-Instruct-2507 -> qwen3-30b-a3b "
                                     "(qwen/ dropped; suffix -instruct-2507: same architecture and config)")
    assert cm["name"] == "roofline"
    assert cm["fallback"]["from"] == "calibrated" and cm["fallback"]["to"] == "roofline"
    assert cm["fallback"]["reason"].startswith("no calibrated fit for qwen3-30b-a3b on rtx-pro-6000 tp=1")
    assert cm["moe_experts"] == ("measured table rtx-pro-6000 vllm 0.24.0 (aiconfigurator moe_perf), "
                                 "moe_tp=1 moe_ep=2, balanced")
    assert rep["pairing"]["num_paired"] == NUM_REQUESTS and rep["simulation"]["data_parallel_size"] == 2
    warnings = rep["warnings"]
    assert len(warnings) == 3
    assert warnings[0].startswith("cost model calibrated -> roofline: no calibrated fit")
    assert "dated re-release" in warnings[1]
    assert "measured on vllm 0.24.0; this run is vllm 0.19.0" in warnings[2]
    assert [line for line in err.splitlines() if line.startswith("warning: ")] == [f"warning: {w}" for w in warnings]


def test_fp8_checkpoint_id_loads_with_no_hand_edits(tmp_path, capsys):
    """Qwen/Qwen3-32B-FP8 on one H100: the fp8 variant, and its calibrated fit (vLLM 0.14 and 0.24
    profiles: both differ from the run's 0.19)."""
    run, wl = _slice(tmp_path, "H100_Qwen3-32B-FP8", model="Qwen/Qwen3-32B-FP8", tensor_parallel_size=1)
    rep, err = _validate(run, wl, capsys)
    assert rep["settings"]["model"] == "qwen3-32b@fp8-kvauto" and rep["settings"]["weight_dtype"] == "fp8"
    assert rep["cost_model"]["name"] == "calibrated" and "fallback" not in rep["cost_model"]
    assert [w.split(" was measured on ")[1].split(";")[0] for w in rep["warnings"]] == ["vllm 0.14.0", "vllm 0.24.0"]
    assert err.count("warning: ") == 2


def test_a_missing_fitted_file_is_an_error(tmp_path):
    from servesim.simulator.validation.replay import cost_model_config
    from servesim.simulator.validation.cpu import cpu_overhead_preset
    from servesim.traces.errors import InputError

    with pytest.raises(InputError) as e:
        cost_model_config(str(tmp_path / "nope.json"), "llama-3.1-8b", "h100", 1, cpu_overhead_preset("default"))
    assert e.value.field == "--cost-model" and "not found" in e.value.detail
