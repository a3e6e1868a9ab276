"""Calibration on the CPU (functional): the sweep writes a valid profile that `fit` accepts, and the
report pairs predicted with measured step times."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from servesim.gpu_runner.calibrate import CalibrationGrid, calibrate
from servesim.gpu_runner.model import LlamaModel
from servesim.gpu_runner.weights import preset
from servesim.simulator.cost_model.profile_schema import make_profile, validate_profile

ROOT = Path(__file__).resolve().parents[1]


def test_nccl_tests_rows_join_a_calibration_profile(tmp_path):
    from servesim.simulator.cost_model.importers.nccl_tests import host_collective_rows
    from test_collectives import NCCL_TESTS_H100

    path = tmp_path / "all_reduce_perf.txt"
    path.write_text(NCCL_TESTS_H100)
    rows = host_collective_rows(path, "h100")
    df = validate_profile(make_profile(rows))
    assert list(df["bytes"]) == [1024, 16777216, 268435456] and set(df["tp"]) == {2}
    assert list(df["latency_s"]) == pytest.approx([10e-6, 200e-6, 2000e-6], rel=1e-12)


def test_sweep_rows_follow_the_profile_schema():
    m = LlamaModel.random(preset("tiny-llama"), dtype=torch.bfloat16, backend="torch")
    rows = calibrate(m, "tiny-llama", "h100", CalibrationGrid.quick())
    df = validate_profile(make_profile(rows))
    assert set(df["framework"]) == {"servesim torch"}  # no graphs on the CPU, so no timing mode named
    ops = set(df["op"])
    assert {"qkv_proj", "down_proj", "attn_prefill", "attn_decode", "model_prefill", "model_decode"} <= ops
    assert (df["latency_s"] > 0).all()


@pytest.mark.slow
def test_calibrate_cli_writes_profile_and_report_and_fit_accepts_it(tmp_path):
    from test_collectives import NCCL_TESTS_H100

    out = tmp_path / "tiny.csv"
    nccl = tmp_path / "all_reduce_perf.txt"
    nccl.write_text(NCCL_TESTS_H100)
    p = subprocess.run([sys.executable, "-m", "servesim", "calibrate", "--model", "tiny-llama", "--device", "cpu",
                        "--gpu-label", "h100", "--quick", "--eager-timing", "--out", str(out), "--nccl-tests", str(nccl)],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    prof = pd.read_csv(out)
    ar = prof[prof["op"] == "allreduce"]
    assert len(ar) == 3 and set(ar["gpu"]) == {"h100"} and set(ar["tp"]) == {2}  # the host's all-reduce rows
    assert "step-time error" in p.stdout
    report = pd.read_csv(tmp_path / "tiny.report.csv")
    assert len(report) == 6 and (report["predicted_s"] > 0).all()
    assert (tmp_path / "tiny.report.png").exists()
    q = subprocess.run([sys.executable, "-m", "servesim", "fit", str(out), "--out", str(tmp_path / "cm.json"),
                        "--model", "tiny-llama", "--gpu", "h100"], capture_output=True, text=True, cwd=ROOT)
    assert q.returncode == 0, q.stderr
    assert (tmp_path / "cm.json").exists()


@pytest.mark.slow
def test_calibrate_refuses_without_cuda(tmp_path):
    if torch.cuda.is_available():
        return
    p = subprocess.run([sys.executable, "-m", "servesim", "calibrate", "--model", "tiny-llama", "--out",
                        str(tmp_path / "x.csv")], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 2 and "needs a CUDA GPU" in p.stderr
