"""Closed-loop check against aiconfigurator silicon rows (a few rows, few requests per client)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from servesim.simulator.validation.closed_loop import (
    ClosedLoopOptions,
    load_silicon_rows,
    vllm_serving_defaults,
)
from servesim.validation_report import closed_loop_report

SILICON = Path("/work/shared/data/benchmarks/aiconfigurator_silicon/silicon_sample.csv.gz")
needs_data = pytest.mark.skipif(not SILICON.is_file(), reason="/work/shared data not present")


def test_vllm_serving_defaults():
    h100 = vllm_serving_defaults("0.12.0", "h100")
    assert (h100["max_num_seqs"], h100["max_num_batched_tokens"], h100["async_scheduling"]) == (1024, 8192, False)
    a100 = vllm_serving_defaults("0.19.0", "a100-80gb")
    assert (a100["max_num_seqs"], a100["max_num_batched_tokens"], a100["async_scheduling"]) == (256, 2048, True)


def _row(**kw):
    base = {"id": "x", "model_path": "Qwen/Qwen3-32B", "precision": "bf16", "system": "h100_sxm",
            "backend_version": "0.12.0", "tp_size": 8, "pp_size": 1, "isl": 256, "osl": 16, "batch_size": 4,
            "silicon_ttft_ms": 50.0, "silicon_tpot_ms": 7.0}
    base.update(kw)
    return base


@pytest.mark.slow
def test_report_on_hand_made_rows(tmp_path):
    rows = pd.DataFrame([_row(), _row(id="y", tp_size=4), _row(id="z", model_path="meta-llama/Llama-3.1-70B",
                                                                   precision="fp8"),
                         _row(id="w", precision="fp6")])
    rep = closed_loop_report(rows, ClosedLoopOptions(requests_per_client=2), out_dir=tmp_path)
    ok = [r for r in rep["rows"] if r["status"] == "ok"]
    # fp8 rows run as "<model>@fp8-kvauto" (issue 16); an unknown precision is still refused
    assert len(ok) == 3 and rep["summary"]["num_unsupported"] == 1
    assert "fp6" in rep["rows"][3]["status"]
    ok = ok[:2]
    for r in ok:
        assert r["sim_ttft_ms"] > 0 and 0 < r["sim_tpot_ms"] < 100
        assert r["ttft_error"] == pytest.approx((r["sim_ttft_ms"] - 50.0) / 50.0)
    # TP4 is slower per token than TP8 for the same model
    assert ok[1]["sim_tpot_ms"] > ok[0]["sim_tpot_ms"]
    saved = json.loads((tmp_path / "closed_loop.json").read_text())
    assert saved["summary"]["overall"]["tpot_error"]["n"] == 3
    assert (tmp_path / "closed_loop.html").exists() and (tmp_path / "closed_loop.png").exists()


@pytest.mark.slow
def test_lock_step_start_is_the_slow_case():
    rows = pd.DataFrame([_row(batch_size=8, isl=1024)])
    stag = closed_loop_report(rows, ClosedLoopOptions(requests_per_client=2, stagger="cycle"))["rows"][0]
    lock = closed_loop_report(rows, ClosedLoopOptions(requests_per_client=2, stagger="none"))["rows"][0]
    assert lock["sim_ttft_ms"] > 2 * stag["sim_ttft_ms"]  # 8 prompts in one step vs one at a time


@pytest.mark.slow
@needs_data
def test_real_silicon_rows():
    rows = load_silicon_rows(SILICON)
    assert set(rows["model_path"]) == {"Qwen/Qwen3-32B", "meta-llama/Llama-3.1-70B"}
    qwen = rows[(rows["precision"] == "bf16") & (rows["isl"] == 1024) & (rows["osl"] == 128)
                & (rows["batch_size"] == 8) & rows["tp_size"].isin([4, 8])]
    fp8 = rows[rows["precision"] == "fp8"].head(1)
    rep = closed_loop_report(pd.concat([qwen, fp8]), ClosedLoopOptions(requests_per_client=2))
    ok = [r for r in rep["rows"] if r["status"] == "ok"]
    assert len(ok) == 3 and rep["summary"]["num_unsupported"] == 0  # fp8 runs since issue 16
    ok = ok[:2]
    for r in ok:  # steady-state TPOT within 30 % of the measured mean (it is ~-10 % here)
        assert abs(r["tpot_error"]) < 0.3
        assert r["sim_ttft_ms"] > 0
