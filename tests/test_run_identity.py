"""A result folder says what produced it (run.json) and replays as it was (config.yaml)."""

from __future__ import annotations

import filecmp
import hashlib
import json

import yaml

from servesim.api import load_trace, run, run_scenario
from servesim.simulator.config import SimConfig
from servesim.traces.bundled import DEFAULT_TRACE, bundled_trace_path
from servesim.traces.workload import RequestSpec, Workload


def test_run_json_names_version_build_command_inputs_and_seed(tmp_path):
    cfg = SimConfig()
    cfg.seed = 7
    run(cfg, load_trace(None, max_requests=12), out_dir=tmp_path / "r")
    ident = json.loads((tmp_path / "r" / "run.json").read_text())
    assert ident["seed"] == 7 and ident["command"].startswith("python API")
    assert set(ident["servesim"]) == {"version", "commit", "local_changes", "build"}
    assert set(ident["servesim"]["build"]) == {"scheduler", "simulator", "kernels"}
    [inp] = ident["inputs"]
    data = bundled_trace_path(DEFAULT_TRACE).read_bytes()
    assert inp["sha256"] == hashlib.sha256(data).hexdigest() and inp["bytes"] == len(data)
    assert ident["workload"]["num_requests"] == 12 and ident["num_gpu_blocks_derived"] is True


def test_config_yaml_replays_the_run_byte_for_byte(tmp_path):
    run(SimConfig(), load_trace(None, max_requests=30), out_dir=tmp_path / "r")
    config = yaml.safe_load((tmp_path / "r" / "config.yaml").read_text())
    assert config["workload"] == {"trace": DEFAULT_TRACE, "format": "auto", "max_requests": 30}
    assert config["derive_num_gpu_blocks"] is False and config["cache"]["num_gpu_blocks"] > 1000
    sweep = run_scenario(tmp_path / "r" / "config.yaml", out_dir=tmp_path / "again")
    [variant] = [p for p in (tmp_path / "again" / "variants").iterdir()]
    assert sweep.table["status"].tolist() == ["ok"]
    for name in ("requests.parquet", "steps.parquet", "timeseries.csv"):
        assert filecmp.cmp(tmp_path / "r" / name, variant / name, shallow=False), name


def test_a_workload_built_by_hand_is_described_not_replayable(tmp_path):
    wl = Workload([RequestSpec("a", 0.0, 30, 4), RequestSpec("b", 0.5, 40, 3)], "handmade", "python")
    run(SimConfig(), wl, out_dir=tmp_path / "r")
    config = yaml.safe_load((tmp_path / "r" / "config.yaml").read_text())
    assert config["workload"]["name"] == "handmade" and "trace" not in config["workload"]
    assert json.loads((tmp_path / "r" / "run.json").read_text())["inputs"] == []
