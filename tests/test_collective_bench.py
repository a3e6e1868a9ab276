"""`servesim calibrate --collectives` (gpu_runner/collectives.py): the refusal without 2 GPUs, and
on the CPU (gloo, 2 processes) a profile that the `allreduce_profile=` path turns into the cost
model's all-reduce. Plumbing only: gloo times on a CPU say nothing about a GPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from servesim.gpu_runner.collectives import CollectiveGrid, group_sizes
from servesim.traces.errors import InputError

ROOT = Path(__file__).resolve().parents[1]


def _cli(args: list[str]):
    from servesim.cli import _register, app

    _register()
    return CliRunner().invoke(app, ["calibrate", *args])


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="this machine has 2+ GPUs")
def test_collectives_refused_with_fewer_than_two_gpus(tmp_path):
    with pytest.raises(ValueError, match="at least 2 CUDA GPUs"):
        group_sizes("cuda", None)
    out = tmp_path / "ar.csv"
    res = _cli(["--collectives", "--gpu-label", "h100", "--out", str(out)])
    assert res.exit_code == 2, res.output
    assert "--collectives: measuring collectives needs at least 2 CUDA GPUs" in res.output
    assert "--nccl-tests" in res.output and "Traceback" not in res.output
    assert not out.exists() and not list(tmp_path.iterdir())  # nothing written, not even a .tmp


def test_collectives_flag_errors_name_the_flag(tmp_path):
    with pytest.raises(ValueError, match="group of 2 or more"):
        group_sizes("cpu", [1, 2])
    assert group_sizes("cpu", None) == [2] and group_sizes("cpu", [4, 2, 2]) == [2, 4]
    res = _cli(["--collectives", "--device", "cpu", "--tp-sizes", "2,x", "--gpu-label", "h100"])
    assert res.exit_code == 2 and "--tp-sizes: not a comma-separated list" in res.output
    res = _cli(["--device", "cpu", "--tp-sizes", "2", "--model", "tiny-llama", "--gpu-label", "h100"])
    assert res.exit_code == 2 and "--tp-sizes" in res.output and "--collectives" in res.output
    res = _cli(["--device", "cpu"])
    assert res.exit_code == 2 and "--model: name the model" in res.output


def test_quick_grid_doubles():
    assert CollectiveGrid.quick().sizes_bytes() == [1024, 2048, 4096, 8192]
    full = CollectiveGrid().sizes_bytes()
    assert full[0] == 4096 and full[-1] == 256 * 2**20 and len(full) == 17


@pytest.mark.slow
def test_gloo_collectives_become_the_cost_models_allreduce(tmp_path):
    """2 CPU processes (gloo) time all-reduce and all-gather; the profile the command writes loads
    through allreduce_profile= and the roofline's TP all-reduce is then exactly those times."""
    from servesim.simulator.cost_model import make_cost_model
    from servesim.simulator.cost_model.collectives import host_allreduce_table
    from servesim.simulator.cost_model.profile_schema import read_profile

    out = tmp_path / "ar.csv"
    p = subprocess.run([sys.executable, "-m", "servesim", "calibrate", "--collectives", "--device", "cpu",
                        "--gpu-label", "rtx4090", "--quick", "--out", str(out)],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "busbw GB/s" in p.stdout
    assert [f.name for f in tmp_path.iterdir()] == ["ar.csv"]  # no .tmp left behind
    prof = read_profile(out)
    assert set(prof["op"]) == {"allreduce", "allgather", "reducescatter", "alltoall", "sendrecv"}
    assert set(prof["tp"]) == {2}
    assert set(prof["framework"].str.contains("gloo")) == {True}
    # nccl-tests' bus factors at n = 2: 2(n-1)/n; (n-1)/n; (n-1)/n; (n-1)/n; 1
    for op, factor in (("allreduce", 1.0), ("allgather", 0.5), ("reducescatter", 0.5), ("alltoall", 0.5),
                       ("sendrecv", 1.0)):
        rows = prof[prof["op"] == op]
        assert list(rows["bytes"]) == [1024, 2048, 4096, 8192]
        assert (rows["algbw_gb_s"] * rows["latency_s"] * 1e9).tolist() == pytest.approx(rows["bytes"].tolist())
        assert rows["busbw_gb_s"].tolist() == pytest.approx((rows["algbw_gb_s"] * factor).tolist())
    ar = prof[prof["op"] == "allreduce"].set_index("bytes")["latency_s"]
    assert host_allreduce_table(out, 2) == [[float(b), float(t)] for b, t in ar.items()]

    # RTX 4090: no P2P, so vLLM's custom all-reduce is off and the whole curve is this host's NCCL one.
    shipped = make_cost_model("roofline", model="llama-3.1-8b", gpu="rtx4090", tp=2)
    host = make_cost_model("roofline", model="llama-3.1-8b", gpu="rtx4090", tp=2, allreduce_profile=str(out))
    assert "this host" in host.collectives.source.allreduce
    one_token = 4096 * 2  # llama-3.1-8b hidden size x bf16: one decode token's all-reduce message
    assert host.op_time_s("allreduce", one_token) == pytest.approx(ar[one_token], rel=1e-12)
    assert host.op_time_s("allreduce", 2048) == pytest.approx(ar[2048], rel=1e-12)
    assert host.op_time_s("allreduce", one_token) != shipped.op_time_s("allreduce", one_token)
    with pytest.raises(InputError, match="no all-reduce rows for a group of 4"):
        make_cost_model("roofline", model="llama-3.1-8b", gpu="rtx4090", tp=4, allreduce_profile=str(out))

    # collectives_profile: every op the file holds is this host's, the pipeline hand-off included
    every = make_cost_model("roofline", model="llama-3.1-8b", gpu="rtx4090", tp=2, collectives_profile=str(out))
    group = every.collectives
    for op, call in (("allgather", group.allgather_s), ("reducescatter", group.reducescatter_s),
                     ("alltoall", group.alltoall_s), ("sendrecv", group.send_recv_s)):
        t = prof[prof["op"] == op].set_index("bytes")["latency_s"]
        assert call(4096) == pytest.approx(t[4096], rel=1e-12), op
    assert "this host" in group.source.alltoall and "this host" in group.source.reducescatter
    assert every.op_time_s("allreduce", one_token) == pytest.approx(ar[one_token], rel=1e-12)
    with pytest.raises(InputError, match="no collective rows for a group of 4"):
        make_cost_model("roofline", model="llama-3.1-8b", gpu="rtx4090", tp=4, collectives_profile=str(out))
    with pytest.raises(InputError, match="one host profile"):
        make_cost_model("roofline", model="llama-3.1-8b", gpu="rtx4090", tp=2, collectives_profile=str(out),
                        allreduce_profile=str(out))


def test_profile_schema_carries_allgather_and_bandwidth_columns():
    from servesim.simulator.cost_model.profile_schema import make_profile, validate_profile

    df = validate_profile(make_profile([{"source": "servesim", "gpu": "h100", "op": "allgather", "tp": 2,
                                         "bytes": 1024, "latency_s": 1e-5, "algbw_gb_s": 0.1024,
                                         "busbw_gb_s": 0.0512}]))
    assert df["busbw_gb_s"].iloc[0] == pytest.approx(0.0512)
    assert pd.isna(validate_profile(make_profile([{"source": "x", "gpu": "h100", "op": "allreduce", "tp": 2,
                                                   "bytes": 8, "latency_s": 1e-6}]))["algbw_gb_s"].iloc[0])
