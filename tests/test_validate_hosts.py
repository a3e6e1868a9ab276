"""The host of a measured run: the llmservingsim adapter's default and records, and `servesim validate
--host / --set` (a TP2 Qwen3-32B copy of the shared RTX PRO 6000 run); skipped without /work/shared."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from servesim.simulator.validation.replay import ValidateOptions, build_config
from servesim.simulator.validation.runs import load_run
from servesim.traces.errors import InputError

RUN = Path("/work/shared/data/benchmarks/llmservingsim_vllm_runs/RTXPRO6000_Llama-3.1-8B")
WORKLOAD = Path("/work/shared/data/traces/llmservingsim_sharegpt/sharegpt-llama-3.1-8b-300-sps10.jsonl.gz")
WS, ACS_OFF = "rtx-pro-6000-workstation", "rtx-pro-6000-pcie-acs-off"
BENCH_WHY = "default: LLMServingSim's bench host, measured NCCL figures, configs/cluster/README.md"

pytestmark = pytest.mark.skipif(not (RUN.is_dir() and WORKLOAD.is_file()), reason="/work/shared data not present")


def _tp2_run(tmp_path: Path, **meta_changes) -> Path:
    """The shared run folder with its meta.json made a TP2 Qwen3-32B run (old schema), plus changes."""
    folder = tmp_path / "RTXPRO6000_Qwen3-32B"
    shutil.copytree(RUN, folder)
    meta = json.loads((folder / "meta.json").read_text())
    meta["model"] = meta["engine_kwargs"]["model"] = "Qwen/Qwen3-32B"
    meta["engine_kwargs"]["tensor_parallel_size"] = 2
    meta.update(meta_changes)
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


def test_old_meta_defaults_to_the_bench_host(tmp_path):
    run = load_run(_tp2_run(tmp_path))
    s = run.settings
    assert (s.tp, s.gpu, s.host, s.disable_custom_all_reduce) == (2, "rtx-pro-6000", WS, False)
    assert s.provenance["host"] == BENCH_WHY
    cfg, info = build_config(run, ValidateOptions())
    assert (cfg.hardware.host, cfg.hardware.disable_custom_all_reduce) == (WS, False)
    assert info["settings"]["host"] == WS and info["settings"]["provenance"]["host"] == BENCH_WHY
    assert info["settings"]["provenance"]["disable_custom_all_reduce"] == "default: vLLM 0.19.0 default (false)"
    col = info["collectives"]
    assert col["custom_allreduce"] == f"off: no GPU P2P on host {WS}"
    assert col["allreduce"].startswith("model: ring, 16.37 GB/s bus bandwidth, 16.1 us")


def test_new_meta_records_the_flag_and_the_environment(tmp_path):
    env = {"VLLM_ALLREDUCE_USE_SYMM_MEM": "0"}
    folder = _tp2_run(tmp_path, hardware={"device_name": "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
                                          "all_reduce_environment": env},
                      resolved_config={"parallel_config": {"disable_custom_all_reduce": True,
                                                           "tensor_parallel_size": 2, "data_parallel_size": 1,
                                                           "enable_expert_parallel": False,
                                                           "all2all_backend": "allgather_reducescatter"}},
                      kv_cache={"num_gpu_blocks": 20000})
    run = load_run(folder)
    s = run.settings
    assert (s.host, s.disable_custom_all_reduce, s.num_gpu_blocks) == (WS, True, 20000)
    assert s.provenance["disable_custom_all_reduce"] == "recorded (meta.json)"
    assert s.provenance["gpu"] == "recorded (meta.json hardware.device_name)"
    assert s.provenance["host"] == BENCH_WHY  # the meta says nothing of the host or P2P
    assert any("all_reduce_environment" in n and "VLLM_ALLREDUCE_USE_SYMM_MEM" in n for n in run.notes)
    cfg, info = build_config(run, ValidateOptions())
    assert cfg.hardware.disable_custom_all_reduce is True
    assert info["collectives"]["custom_allreduce"] == "off: disable_custom_all_reduce"


def test_recorded_p2p_and_host(tmp_path):
    meta = json.loads((RUN / "meta.json").read_text())
    kw = dict(meta["engine_kwargs"], tensor_parallel_size=2, disable_custom_all_reduce=True)
    run = load_run(_tp2_run(tmp_path / "a", hardware={"p2p": True}, engine_kwargs=kw))
    assert run.settings.host == ACS_OFF
    assert run.settings.provenance["host"] == "recorded (meta.json hardware.p2p: true)"
    assert run.settings.provenance["disable_custom_all_reduce"] == "recorded (meta.json)"
    run = load_run(_tp2_run(tmp_path / "b", hardware={"host": "rtx-pro-6000-server"}))
    assert run.settings.host == "rtx-pro-6000-server"
    assert run.settings.provenance["host"] == "recorded (meta.json hardware.host)"


def test_validate_options_host_and_sets(tmp_path):
    run = load_run(_tp2_run(tmp_path))
    cfg, info = build_config(run, ValidateOptions(host=ACS_OFF, sets=("hardware.disable_custom_all_reduce=true",
                                                                      "scheduler.max_num_seqs=64")))
    s = info["settings"]
    assert (cfg.hardware.host, cfg.hardware.disable_custom_all_reduce, cfg.scheduler.max_num_seqs) == \
        (ACS_OFF, True, 64)
    assert (s["host"], s["max_num_seqs"], s["provenance"]["host"]) == (ACS_OFF, 64, "given (--host)")
    assert s["provenance"]["max_num_seqs"] == s["provenance"]["scheduler.max_num_seqs"] == "given (--set)"
    assert s["provenance"]["hardware.disable_custom_all_reduce"] == "given (--set)"
    assert s["overrides"] == {"hardware.disable_custom_all_reduce": "true", "scheduler.max_num_seqs": "64"}
    assert info["collectives"]["custom_allreduce"] == "off: disable_custom_all_reduce"
    with pytest.raises(InputError, match="did you mean 'rtx-pro-6000-workstation'") as e:
        build_config(run, ValidateOptions(host="rtx-pro-6000-workstaton"))
    assert e.value.field == "hardware.host"
    with pytest.raises(InputError, match="unknown key 'hots'") as e:
        build_config(run, ValidateOptions(sets=("hardware.hots=x",)))
    assert e.value.field == "hardware.hots"


def test_collectives_profile_through_set_replaces_the_hosts_allreduce(tmp_path):
    from servesim.simulator.cost_model.profile_schema import make_profile, write_profile

    rows = [{"source": "servesim", "gpu": "rtx-pro-6000", "op": "allreduce", "tp": 2, "bytes": b,
             "latency_s": t} for b, t in ((1024, 30e-6), (2**26, 3e-3))]
    write_profile(make_profile(rows), tmp_path / "ar.csv")
    run = load_run(_tp2_run(tmp_path))
    cfg, info = build_config(run, ValidateOptions(sets=(f"cost_model.params.collectives_profile={tmp_path / 'ar.csv'}",)))
    assert info["collectives"]["allreduce"] == "measured on this host (ar.csv, 2 GPUs)"
    from servesim.simulator.cost_model import run_cost_model

    assert run_cost_model(cfg)._ar(1024) == pytest.approx(30e-6, rel=1e-12)


def test_cli_validate_with_host_and_set(tmp_path):
    from typer.testing import CliRunner

    from servesim.cli import _register, app

    _register()
    folder, out = _tp2_run(tmp_path), tmp_path / "out"
    args = ["validate", str(folder), "--workload", str(WORKLOAD), "--out", str(out), "--no-plots",
            "--host", ACS_OFF, "--set", "hardware.disable_custom_all_reduce=true"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    rep = json.loads((out / "validation.json").read_text())
    assert rep["settings"]["host"] == ACS_OFF and rep["collectives"]["host"] == ACS_OFF
    assert rep["settings"]["provenance"]["hardware.disable_custom_all_reduce"] == "given (--set)"
    assert f"host {ACS_OFF} (given (--host)); custom all-reduce off: disable_custom_all_reduce" in res.output
    bad = CliRunner().invoke(app, ["validate", str(folder), "--workload", str(WORKLOAD), "--out",
                                   str(tmp_path / "bad"), "--host", "rtx-pro-6000-workstaton"])
    assert bad.exit_code != 0 and "did you mean 'rtx-pro-6000-workstation'" in bad.output
