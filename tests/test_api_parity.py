"""servesim.api = the CLI: replay's bench options, cluster, plan and validate through the API, with
the CLI's validation, and the same numbers as the same command line."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from servesim import api
from servesim.traces.errors import InputError

CLUSTER = {"replicas": [{"count": 2}], "router": "round_robin",
           "workload": {"trace": "sharegpt-300", "max_requests": 12}}


def _cli(*args):
    from servesim.cli import _register, app

    _register()
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result


def _same(a: dict, b: dict) -> None:
    drop = ("wall_time_s", "sim_speedup_x", "metrics")  # wall-clock figures differ run to run
    assert {k: v for k, v in a.items() if k not in drop} == {k: v for k, v in b.items() if k not in drop}


def test_replay_takes_the_clis_options(tmp_path):
    res = api.replay(max_requests=5)
    assert res.summary["num_requests"] == 5
    res = api.replay(dataset_name="random", num_prompts=6, request_rate=20.0, random_input_len=64,
                     random_output_len=4, max_concurrency=1, out_dir=tmp_path / "a")
    arrival, finish = res.requests["arrival_s"].to_numpy(), res.requests["finish_s"].to_numpy()
    assert len(arrival) == 6 and np.all(arrival[1:] >= finish[:-1] - 1e-12)  # one request in flight at a time
    _cli("replay", "--dataset-name", "random", "--num-prompts", 6, "--request-rate", 20, "--random-input-len", 64,
         "--random-output-len", 4, "--max-concurrency", 1, "--out", tmp_path / "b")
    _same(res.summary, json.loads((tmp_path / "b" / "summary.json").read_text()))


@pytest.mark.parametrize("kwargs, match", [
    (dict(random_input_len=64), "--random-input-len"),
    (dict(num_prompts=3, max_requests=3), "one of the two"),
    (dict(request_rate=2.0), "bundled trace"),
    (dict(max_concurrency=0), "--max-concurrency"),
    (dict(goodput=["itl:5"]), "--goodput"),
    (dict(pp=0), "field 'pp'"),
    (dict(scheduler__max_num_seqz=4), "max_num_seqs"),
])
def test_replay_refuses_what_the_cli_refuses(kwargs, match):
    with pytest.raises(InputError, match=match):
        api.replay(**kwargs)


def test_cluster_through_the_api_matches_the_cli(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(CLUSTER))
    res = api.cluster(path, out_dir=tmp_path / "a")
    assert res.summary["num_finished"] == 12 and (tmp_path / "a" / "summary.json").is_file()
    _cli("cluster", path, "--out", tmp_path / "b")
    _same(json.loads((tmp_path / "a" / "summary.json").read_text()),
          json.loads((tmp_path / "b" / "summary.json").read_text()))
    assert api.cluster(path, max_requests=4).summary["num_finished"] == 4
    with pytest.raises(InputError, match="--max-requests"):
        api.cluster(path, max_requests=0)
    with pytest.raises(InputError, match="field 'config'"):
        api.cluster(3)


def test_plan_and_validate_through_the_api(tmp_path):
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump({"cluster": {"router": "round_robin", "slo": {"ttft_s": 5.0, "tpot_s": 0.5}},
                                    "search": {"tp": [1], "colocated": {"min": 1, "max": 1}, "pd": {"ratios": []},
                                               "goodput_threshold": 0.5},
                                    "workload": {"trace": "sharegpt-300", "max_requests": 8}}))
    table = api.plan(path, out_dir=tmp_path / "p")
    assert len(table) == 1 and bool(table["meets_slo"].iloc[0]) and (tmp_path / "p" / "plan.csv").is_file()
    with pytest.raises(InputError, match="did you mean 'cost_model'"):
        api.validate(tmp_path, tmp_path / "w.jsonl", out_dir=tmp_path / "v", cost_modle="roofline")
