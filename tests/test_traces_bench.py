"""`vllm bench serve` / inference-perf workloads: arrivals, lengths, prefixes, stages, the replay flags."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from servesim.traces.bench import BenchConfig, StageConfig, arrival_schedule, bench_workload, parse_goodput
from servesim.traces.errors import InputError

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


def test_random_dataset_lengths_and_shared_prefix():
    wl = bench_workload(BenchConfig(dataset_name="random", num_prompts=400, random_input_len=100,
                                    random_output_len=10, random_range_ratio=0.5, random_prefix_len=32))
    prompts = np.array([r.prompt_len for r in wl.requests])
    outputs = np.array([r.output_len for r in wl.requests])
    assert prompts.min() >= 32 + 50 and prompts.max() <= 32 + 150
    assert outputs.min() >= 5 and outputs.max() <= 15
    first = [r.token_ids()[:32] for r in wl.requests[:3]]
    assert first[0] == first[1] == first[2]  # the --random-prefix-len prefix is shared
    assert wl.requests[0].token_ids()[32:40] != wl.requests[1].token_ids()[32:40]


def test_request_rate_inf_sends_everything_at_once_and_burstiness_sets_the_cv():
    assert arrival_schedule(BenchConfig(num_prompts=5), np.random.default_rng(0)).tolist() == [0.0] * 5
    rng = np.random.default_rng(1)
    poisson = np.diff(arrival_schedule(BenchConfig(num_prompts=20000, request_rate=10.0), rng))
    bursty = np.diff(arrival_schedule(BenchConfig(num_prompts=20000, request_rate=10.0, burstiness=0.25), rng))
    assert poisson.mean() == pytest.approx(0.1, rel=0.03) and bursty.mean() == pytest.approx(0.1, rel=0.05)
    assert poisson.std() / poisson.mean() == pytest.approx(1.0, rel=0.05)
    assert bursty.std() / bursty.mean() == pytest.approx(2.0, rel=0.1)  # cv = 1/sqrt(shape)


def test_shared_prefix_stages_are_evenly_spaced_and_cycle_users():
    cfg = BenchConfig(dataset_name="shared_prefix", num_prompts=10_000, num_groups=2, users_per_group=3,
                      system_prompt_len=64, question_len=16, output_len=8,
                      stages=(StageConfig(10.0, 2.0), StageConfig(5.0, 4.0)))
    wl = bench_workload(cfg)
    times = [r.arrival_time_s for r in wl.requests]
    assert len(times) == 20 + 20 and times[:3] == [0.0, 0.5, 1.0] and times[20:23] == [10.0, 10.25, 10.5]
    groups = [r.prefix_group for r in wl.requests[:7]]
    assert groups == [0, 0, 0, 1, 1, 1, 0]
    a, b, c, a2 = (wl.requests[i].token_ids() for i in (0, 1, 3, 6))
    assert a[:64] == b[:64] and a[:64] != c[:64] and a[64:] != b[64:]
    assert a2 == a  # inference-perf re-sends each user's prompt: request 6 is user 0 again


def test_same_seed_same_workload_and_bad_flags_are_named():
    cfg = BenchConfig(dataset_name="sonnet", num_prompts=50, request_rate=3.0, seed=7)
    assert [r.arrival_time_s for r in bench_workload(cfg).requests] == \
        [r.arrival_time_s for r in bench_workload(cfg).requests]
    for kw, flag in ((dict(dataset_name="randon"), "--dataset-name"), (dict(request_rate=0.0), "--request-rate"),
                     (dict(random_range_ratio=1.5), "--random-range-ratio"), (dict(burstiness=math.inf), "--burstiness"),
                     (dict(sonnet_prefix_len=600), "--sonnet-prefix-len")):
        with pytest.raises(InputError, match=flag):
            BenchConfig(**kw)
    assert parse_goodput(["ttft:500 tpot:50", "e2el:2000"]) == {"slo.ttft_s": 0.5, "slo.tpot_s": 0.05, "slo.e2e_s": 2.0}
    with pytest.raises(InputError, match="--goodput"):
        parse_goodput(["itl:5"])


def test_replay_translates_a_vllm_bench_command_line(tmp_path):
    from servesim.cli import _register, app

    _register()
    out = tmp_path / "r"
    args = ["replay", "--dataset-name", "random", "--num-prompts", "40", "--request-rate", "20",
            "--random-input-len", "256", "--random-output-len", "16", "--goodput", "ttft:1000 tpot:100",
            "--frontend", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    bench = summary["bench_serve"]
    assert (bench["completed"], bench["failed"]) == (40, 0)
    assert bench["request_goodput"] == pytest.approx(bench["request_throughput"])
    assert summary["goodput"]["slo_ttft_s"] == 1.0


def test_validate_bench_round_trip_reproduces_a_simulated_client_run(tmp_path):
    """A run written in vllm bench's format, from the simulator itself, validates to ~0 error."""
    from servesim.cli import _register, app
    from servesim.simulator.bench_metrics import bench_serve_result, per_request
    from servesim.simulator.config import ClientConfig, SimConfig
    from servesim.simulator.engine import Engine
    from servesim.simulator.frontend import FrontendConfig
    from servesim.simulator.validation.bench_result import load_bench_result, result_workload

    n = 60
    fake = {"request_rate": 12.0, "burstiness": 1.0, "max_concurrency": 16, "num_prompts": n,
            "input_lens": [200 + 7 * i for i in range(n)], "output_lens": [20 + (i % 9) for i in range(n)],
            "errors": [""] * n, "completed": n}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(fake))
    cfg = SimConfig(frontend=FrontendConfig(enabled=True), client=ClientConfig(max_concurrency=16))
    res = Engine(cfg, result_workload(load_bench_result(path), seed=0)).run()
    req = res.metrics.requests_frame()
    fake.update(bench_serve_result(req))
    fake["output_lens"] = per_request(req)["output_len"].tolist()
    path.write_text(json.dumps(fake))

    _register()
    out = tmp_path / "v"
    result = CliRunner().invoke(app, ["validate-bench", str(path), "--model", "llama-3.1-8b", "--gpu", "h100",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    rows = json.loads((out / "validation.json").read_text())["rows"]
    metrics = {r["metric"]: r for r in rows}
    assert {"completed", "mean_ttft_ms", "p99_itl_ms", "median_e2el_ms"} <= set(metrics)
    assert metrics["failed"]["measured"] == metrics["failed"]["simulated"] == 0
    assert all(abs(r["rel_error"]) < 1e-9 for r in rows if r["metric"] != "failed"), rows


def test_validate_bench_refuses_a_summary_only_result(tmp_path):
    from servesim.simulator.validation.bench_result import load_bench_result

    path = tmp_path / "summary.json"
    path.write_text(json.dumps({"completed": 10, "mean_ttft_ms": 5.0}))
    with pytest.raises(InputError, match="--save-detailed"):
        load_bench_result(path)
    path.write_text("{not json")
    with pytest.raises(InputError, match="not a readable JSON"):
        load_bench_result(path)
