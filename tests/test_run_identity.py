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


def test_compare_lists_the_settings_that_differ_and_each_metric_against_the_first(tmp_path):
    import pytest
    from typer.testing import CliRunner

    from servesim.api import compare
    from servesim.cli import _register, app
    from servesim.compare import delta_text
    from servesim.traces.errors import InputError

    a, b = SimConfig(), SimConfig()
    b.scheduler.max_num_seqs = 4
    run(a, load_trace(None, max_requests=20), out_dir=tmp_path / "a")
    run(b, load_trace(None, max_requests=20), out_dir=tmp_path / "b")
    cmp = compare([tmp_path / "a", tmp_path / "b"])
    assert cmp.names == ["a", "b"] and cmp.settings == {"scheduler.max_num_seqs": [256, 4]}
    ttft = dict((m[0], m[3]) for m in cmp.metrics)["TTFT p50"]
    assert ttft[0] == pytest.approx(1e3 * cmp.summaries[0]["ttft_s"]["p50"]) and ttft[1] > ttft[0]
    assert delta_text(12.0, 10.0, 1) == "+2.0 (+20.0 %)" and delta_text(3.0, 0.0, 0) == "+3"
    _register()
    result = CliRunner().invoke(app, ["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "c")])
    assert result.exit_code == 0, result.output
    assert "scheduler.max_num_seqs" in result.output and "TTFT p50" in result.output
    page = (tmp_path / "c" / "report.html").read_text()
    assert "data:image/png;base64," in page and "scheduler.max_num_seqs" in page
    with pytest.raises(InputError, match="two or more"):
        compare([tmp_path / "a"])
    with pytest.raises(InputError, match="no summary.json"):
        compare([tmp_path / "a", tmp_path])


def test_a_dataset_name_run_replays_from_its_config_yaml(tmp_path):
    from servesim.api import replay

    replay(dataset_name="random", num_prompts=40, request_rate=6.0, burstiness=0.5, random_input_len=300,
           random_output_len=40, random_range_ratio=0.5, seed=3, out_dir=tmp_path / "r")
    config = yaml.safe_load((tmp_path / "r" / "config.yaml").read_text())
    assert config["workload"] == {"bench": {"dataset_name": "random", "random_input_len": 300, "random_output_len": 40,
                                            "random_range_ratio": 0.5, "num_prompts": 40, "request_rate": 6.0,
                                            "burstiness": 0.5}, "seed": 3}
    run_scenario(tmp_path / "r" / "config.yaml", out_dir=tmp_path / "again")
    [variant] = [p for p in (tmp_path / "again" / "variants").iterdir()]
    for name in ("requests.parquet", "steps.parquet", "timeseries.csv"):
        assert filecmp.cmp(tmp_path / "r" / name, variant / name, shallow=False), name


def _bench_error(tmp_path, workload: str) -> str:
    import pytest

    from servesim.scenario import load_scenario
    from servesim.traces.errors import InputError

    path = tmp_path / "s.yaml"
    path.write_text(f"name: s\nworkload:\n  {workload}\n")
    with pytest.raises(InputError) as err:
        load_scenario(path)
    return str(err.value)


def test_a_bench_workload_section_is_validated_with_file_line_and_field(tmp_path):
    msg = _bench_error(tmp_path, "bench: {dataset_name: random, num_promts: 5}")
    assert "s.yaml" in msg and "line 3" in msg and "num_promts" in msg and "num_prompts" in msg
    msg = _bench_error(tmp_path, "bench: {dataset_name: random, request_rate: -1}")
    assert "workload.bench.request_rate" in msg and "> 0, or inf" in msg
    msg = _bench_error(tmp_path, "bench: {dataset_name: tweets}")
    assert "workload.bench.dataset_name" in msg and "sharegpt" in msg
    msg = _bench_error(tmp_path, "{bench: {dataset_name: random}, trace: sharegpt-300}")
    assert "exactly one of" in msg
