"""Replicates through the commands: replay and cluster --replicates, compare beyond noise, plan with a
probability, the plot of a replicates folder (issue 45)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from servesim.cli import _register, app
from servesim.compare import compare_runs
from servesim.replicate_plan import evaluate_replicated, plan_evaluator
from servesim.replicates import Replicate, cluster_replicate, replicate_seed
from servesim.simulator.cluster import cluster_config_from_dict
from servesim.simulator.cluster.plan import Shape, evaluate, plan_config_from_dict
from servesim.traces.errors import InputError

_register()
ROOT = Path(__file__).resolve().parents[1]
BENCH = ["--dataset-name", "random", "--num-prompts", "24", "--request-rate", "12", "--random-input-len", "64",
         "--random-output-len", "12"]


def _replay(out: Path, *extra: str):
    r = CliRunner().invoke(app, ["replay", *BENCH, "--replicates", "3", "--workers", "1", "--out", str(out), *extra])
    assert r.exit_code == 0, r.output
    return r.output


def test_replay_replicates_prints_and_writes_intervals(tmp_path):
    out = _replay(tmp_path / "a")
    for label in ("TTFT p99", "TPOT p50", "ITL p90", "E2E mean", "queueing p95", "CI of mean", "prediction interval"):
        assert label in out
    assert "reseeded" in out and "cost-model error" in out
    s = json.loads((tmp_path / "a" / "summary.json").read_text())
    for key in ("ttft_s.p50", "tpot_s.p99", "itl_s.mean", "e2e_s.p90", "queueing_s.p99"):
        iv = s["replicates"]["metrics"][key]
        assert iv["num_replicates"] == 3 and iv["pi_low"] <= iv["ci_low"] <= iv["mean"] <= iv["ci_high"] <= iv["pi_high"]
    cfg = yaml.safe_load((tmp_path / "a" / "config.yaml").read_text())
    assert cfg["replicates"] == 3 and cfg["cost_model"]["name"] == "roofline"
    r1 = yaml.safe_load((tmp_path / "a" / "replicates" / "r01" / "config.yaml").read_text())
    assert r1["cost_model"]["name"] == "perturbed" and r1["cost_model"]["params"]["base"] == "roofline"
    # the replicate's traffic, drawn again from its seed, as a section that rebuilds it (scenario/workload.py)
    assert r1["seed"] == replicate_seed(0, 1) and r1["workload"]["seed"] == replicate_seed(0, 1)
    assert r1["workload"]["bench"]["dataset_name"] == "random"


@pytest.mark.slow
def test_a_replicate_reruns_alone_from_its_config(tmp_path):
    """Any replicate's folder holds what reproduces it: its config.yaml (seed, factors) reruns to the
    same requests."""
    r = CliRunner().invoke(app, ["replay", "--max-requests", "8", "--replicates", "2", "--workers", "1",
                                 "--out", str(tmp_path / "a")])
    assert r.exit_code == 0, r.output
    rerun = CliRunner().invoke(app, ["run", str(tmp_path / "a" / "replicates" / "r01" / "config.yaml"),
                                     "--out", str(tmp_path / "again"), "--workers", "1"])
    assert rerun.exit_code == 0, rerun.output
    variant = next((tmp_path / "again" / "variants").iterdir())
    a = pd.read_parquet(tmp_path / "a" / "replicates" / "r01" / "requests.parquet")
    b = pd.read_parquet(variant / "requests.parquet")
    pd.testing.assert_frame_equal(a, b)
    # and the folder's own config.yaml reruns every replicate (a scenario with `replicates:`)
    rerun = CliRunner().invoke(app, ["run", str(tmp_path / "a" / "config.yaml"), "--out", str(tmp_path / "all"),
                                     "--workers", "1"])
    assert rerun.exit_code == 0, rerun.output
    variant = next((tmp_path / "all" / "variants").iterdir())
    first, again = (json.loads(p.read_text()) for p in (tmp_path / "a" / "summary.json", variant / "summary.json"))
    assert again["replicates"]["seeds"] == first["replicates"]["seeds"]
    assert again["replicates"]["metrics"] == first["replicates"]["metrics"]


def test_compare_says_beyond_or_within_noise(tmp_path):
    _replay(tmp_path / "a")
    _replay(tmp_path / "b", "--gpu", "a100-80gb")
    _replay(tmp_path / "c", "--set", "scheduler.max_num_seqs=255")  # no effect at 24 requests
    cmp = compare_runs([tmp_path / "a", tmp_path / "b", tmp_path / "c"])
    rows = {label: noise for (label, *_), noise in zip(cmp.metrics, cmp.noise)}
    assert rows["TTFT p50"] == ["beyond noise", "within noise"]
    assert "hardware.gpu" in cmp.settings
    r = CliRunner().invoke(app, ["compare", str(tmp_path / "a"), str(tmp_path / "b")])
    assert r.exit_code == 0 and "beyond noise" in r.output and "Welch" in r.output


@pytest.mark.slow  # matplotlib: ~10 s on a loaded 2-core machine
def test_plot_of_a_replicates_folder(tmp_path):
    _replay(tmp_path / "a")
    r = CliRunner().invoke(app, ["plot", str(tmp_path / "a")])
    assert r.exit_code == 0, r.output
    assert {p.name for p in (tmp_path / "a" / "plots").iterdir()} >= {"latency_bands.png", "intervals.png",
                                                                       "report.html"}


CLUSTER = {"base": {"hardware": {"model": "llama-3.1-8b", "gpu": "h100"}},
           "replicas": [{"count": 2}], "router": "round_robin", "seed": 4}


def test_cluster_replicate_derives_every_seed_and_shares_the_factors():
    cfg = cluster_config_from_dict(CLUSTER)
    f = {"prefill": 1.2, "decode": 0.8, "mixed": 1.0}
    r0 = cluster_replicate(cfg, Replicate(0, 4, f))
    assert r0.seed == 4 and r0.replicas[0].sim.seed == cfg.replicas[0].sim.seed
    r3 = cluster_replicate(cfg, Replicate(3, 99, f))
    assert r3.seed == 99 and r3.replicas[0].sim.seed == replicate_seed(99, 1)
    assert r3.replicas[0].sim.cost_model.params["factors"] == f


def test_cluster_replicates_cli(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**CLUSTER, "workload": {"trace": "sharegpt-300", "max_requests": 16}}))
    r = CliRunner().invoke(app, ["cluster", str(path), "--replicates", "2", "--workers", "1", "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert s["replicates"]["num_replicates"] == 2 and any("trace" in line for line in s["replicates"]["fixed"])
    assert (tmp_path / "o" / "replicates" / "r01" / "summary.json").is_file()


def test_replicates_key_in_a_cluster_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**CLUSTER, "replicates": 2, "workload": {"trace": "sharegpt-300", "max_requests": 8}}))
    r = CliRunner().invoke(app, ["cluster", str(path), "--workers", "1", "--no-perturb-cost-model", "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert s["replicates"]["num_replicates"] == 2 and s["replicates"]["cost_model_factors"] == [None, None]
    cfg = yaml.safe_load((tmp_path / "o" / "config.yaml").read_text())  # reads back as a cluster file
    assert cfg["replicates"] == {"num_replicates": 2, "perturb_cost_model": False}
    path.write_text(yaml.safe_dump({**CLUSTER, "replicates": 0}))
    r = CliRunner().invoke(app, ["cluster", str(path), "--out", str(tmp_path / "p")])
    assert r.exit_code == 2 and "replicates" in r.output


SCENARIO = {"name": "rep", "workload": {"generator": "poisson", "num_requests": 16, "arrival": {"rate_per_s": 8}},
            "replicates": 2, "sweep": {"scheduler.max_num_seqs": [4, 64]}}


def test_a_sweep_with_replicates(tmp_path):
    from servesim.scenario import load_scenario
    from servesim.scenario.runner import run_sweep

    sc = load_scenario(SCENARIO)
    assert sc.replicates == 2 and sc.perturb_cost_model
    plain = load_scenario({k: v for k, v in SCENARIO.items() if k != "replicates"})
    assert [v.key for v in sc.variants] != [v.key for v in plain.variants]  # a replicated variant is another result
    outcomes = run_sweep(sc, tmp_path / "s", workers=1)
    assert [o.status for o in outcomes] == ["ok", "ok"]
    table = pd.read_parquet(tmp_path / "s" / "sweep.parquet")
    assert (table["replicates.num_replicates"] == 2).all()
    assert (table["replicates.metrics.ttft_s.p99.ci_low"] <= table["ttft_s.p99"]).all()
    folders = sorted((tmp_path / "s" / "variants").iterdir())
    cmp = compare_runs(folders)  # a variant's replicates.csv feeds the noise test
    assert all(n is not None for row in cmp.noise for n in row)
    variant = yaml.safe_load((folders[0] / "variant.yaml").read_text())
    assert variant["replicates"] == 2  # variant.yaml reruns it with its replicates


@pytest.mark.parametrize("bad", [0, "x", {"num_replicates": 2, "perturb": False}, {"perturb_cost_model": "no"}])
def test_bad_scenario_replicates(bad):
    from servesim.scenario import load_scenario

    with pytest.raises(InputError, match="replicates"):
        load_scenario({**SCENARIO, "replicates": bad})


PLAN = {"workload": {"trace": "sharegpt-300", "max_requests": 20},
        "cluster": {"base": {"hardware": {"model": "llama-3.1-8b", "gpu": "h100"}}, "slo": {"ttft_s": 1.0, "tpot_s": 0.05}},
        "search": {"colocated": {"min": 1, "max": 2}, "replicates": 3, "probability": 0.6}}


def test_plan_with_replicates_answers_with_a_probability():
    from servesim.simulator.cluster.plan import load_plan_workload

    plan = plan_config_from_dict(PLAN)
    assert (plan.search.replicates, plan.search.probability) == (3, 0.6)
    wl = load_plan_workload(plan.workload)
    row = evaluate_replicated(plan, Shape("colocated", 1), 1, wl, workers=1)
    assert row["probability"] in (0.0, 1 / 3, 2 / 3, 1.0)
    assert row["probability_low"] <= row["probability"] <= row["probability_high"]
    assert row["meets_slo"] == (row["probability"] >= 0.6)
    assert row["goodput_min"] <= row["goodput_fraction"] <= row["goodput_max"]
    one = plan_config_from_dict({**PLAN, "search": {"colocated": {"min": 1, "max": 2}}})
    assert plan_evaluator(one) is evaluate


@pytest.mark.parametrize("search, field", [({"replicates": 0}, "search.replicates"),
                                           ({"replicates": True}, "search.replicates"),
                                           ({"probability": 0}, "search.probability"),
                                           ({"probability": 1.5}, "search.probability")])
def test_bad_plan_replicate_settings(search, field):
    with pytest.raises(InputError, match=field.replace(".", r"\.")):
        plan_config_from_dict({**PLAN, "search": {"colocated": {"min": 1, "max": 2}, **search}})


def test_api_replay_with_replicates(tmp_path):
    from servesim.api import load_results, load_trace, replay
    from servesim.traces.canonical import save_workload

    trace = save_workload(load_trace(None, max_requests=12), tmp_path / "t.jsonl")
    res = replay(trace, replicates=2, workers=1, out_dir=tmp_path / "r", perturb_cost_model=False,
                 seed=3)
    assert res.summary["replicates"]["seeds"] == [3, replicate_seed(3, 1)]
    assert sorted(res.requests["replicate"].unique()) == ["r00", "r01"] and len(res.requests) == 24
    again = load_results(tmp_path / "r")
    assert again.summary == res.summary and len(again.steps) == len(res.steps)
    with pytest.raises(InputError, match="out_dir"):
        replay(None, replicates=2)
