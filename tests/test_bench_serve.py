"""`replay`'s `vllm bench serve` surface: the result file (vLLM 0.19.1's save_result schema), the
flags that act on a TRACE, and the client's --max-concurrency semaphore."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from servesim.bench_serve import (BenchResultOptions, BenchTraffic, parse_metadata, parse_metric_percentiles,
                                  result_json, result_path, write_result)
from servesim.simulator.bench_metrics import GoodputSlo
from servesim.traces.errors import InputError


def _requests() -> pd.DataFrame:
    """Three requests by hand: two complete (one with a two-token chunk), one rejected."""
    return pd.DataFrame({
        "request_id": ["a", "b", "c"],
        "arrival_s": [0.0, 0.5, 0.7],
        "first_token_s": [0.1, 0.8, np.nan],
        "finish_s": [0.4, 1.6, np.nan],
        "prompt_len": [10, 20, 30],
        "output_len": [4, 3, 0],
        "itl_s": [np.array([0.1, 0.0, 0.2]), np.array([0.3, 0.5]), np.array([])],
        "status": ["completed", "completed", "rejected"],
    })


def test_result_json_has_vllms_keys_in_its_order_and_exact_figures():
    opts = BenchResultOptions(percentile_metrics=("ttft", "e2el"), metric_percentiles=(50.0, 99.9),
                              save_result=True, label="sim", metadata=(("tp", "1"),))
    out = result_json(_requests(), opts, BenchTraffic(3, 4.0, 1.0, 2), "org/M", date="20260101-000000")
    assert list(out)[:20] == ["date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts",
                              "tp", "request_rate", "burstiness", "max_concurrency", "duration", "completed",
                              "failed", "total_input_tokens", "total_output_tokens", "request_throughput",
                              "request_goodput", "output_throughput", "total_token_throughput"]
    assert list(out)[20:23] == ["max_output_tokens_per_s", "max_concurrent_requests", "rtfx"]
    assert [k for k in out if k.endswith("_ms")] == [
        "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p50_ttft_ms", "p99.9_ttft_ms",
        "mean_e2el_ms", "median_e2el_ms", "std_e2el_ms", "p50_e2el_ms", "p99.9_e2el_ms"]
    assert (out["completed"], out["failed"], out["total_input_tokens"], out["total_output_tokens"]) == (2, 1, 30, 7)
    assert out["duration"] == pytest.approx(1.6)
    assert out["mean_ttft_ms"] == pytest.approx(200.0) and out["p50_e2el_ms"] == pytest.approx(750.0)
    assert out["request_goodput"] is None and out["request_rate"] == 4.0 and out["max_concurrency"] == 2
    # 1-s buckets from t = 0: chunks at 0.1, 0.2, 0.4 (a) and 0.8, 1.1, 1.6 (b): 4 in [0, 1), 2 in [1, 2)
    assert out["max_output_tokens_per_s"] == 4.0 and out["max_concurrent_requests"] == 2
    assert "ttfts" not in out and "mean_tpot_ms" not in out


def test_detailed_result_goodput_and_inf_rate():
    opts = BenchResultOptions(save_result=True, save_detailed=True)
    out = result_json(_requests(), opts, BenchTraffic(3), "org/M", GoodputSlo(ttft_ms=150.0), date="d")
    assert out["request_rate"] == "inf" and out["label"] is None
    assert out["request_goodput"] == pytest.approx(1 / 1.6)  # only a meets TTFT <= 150 ms
    assert out["input_lens"] == [10, 20, 30] and out["output_lens"] == [4, 3, 0]
    assert out["ttfts"] == pytest.approx([0.1, 0.3, 0.0]) and out["itls"][0] == pytest.approx([0.1, 0.2])
    assert out["errors"] == ["", "", "request rejected"] and out["generated_texts"] == ["", "", ""]
    assert list(out)[19:26] == ["input_lens", "output_lens", "ttfts", "itls", "start_times", "generated_texts",
                                "errors"]
    assert [k for k in out if k.startswith("p") and k.endswith("_ms")] == ["p99_ttft_ms", "p99_tpot_ms", "p99_itl_ms"]


def test_result_file_name_follows_vllm(tmp_path, monkeypatch):
    opts = BenchResultOptions(save_result=True, result_dir=str(tmp_path / "res"))
    assert result_path(opts, BenchTraffic(5, 8.0, 1.0, 16), "meta-llama/Llama-3.1-8B", "D") == \
        tmp_path / "res" / "servesim-8.0qps-concurrency16-Llama-3.1-8B-D.json"
    assert result_path(BenchResultOptions(save_result=True, label="x"), BenchTraffic(5), "m", "D").name == \
        "x-infqps-m-D.json"
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "0")
    path = write_result(_requests(), BenchResultOptions(save_result=True, result_dir=str(tmp_path), result_filename="r.json"),
                        BenchTraffic(3), "m")
    assert path == tmp_path / "r.json" and json.loads(path.read_text())["date"] == "19700101-000000"
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "soon")
    with pytest.raises(InputError, match="SOURCE_DATE_EPOCH"):
        write_result(_requests(), BenchResultOptions(save_result=True), BenchTraffic(3), "m")


def test_option_parsing_and_validation():
    assert parse_metric_percentiles("25, 50,99.9") == (25.0, 50.0, 99.9)
    assert parse_metadata(["a=1 b=x=y"]) == (("a", "1"), ("b", "x=y"))  # split at the first "="
    assert parse_metadata(["version=0.3.3", "tp=1"]) == (("version", "0.3.3"), ("tp", "1"))
    for kw, flag in ((dict(percentile_metrics=("ttft", "xx")), "--percentile-metrics"),
                     (dict(metric_percentiles=(-1.0,)), "--metric-percentiles"),
                     (dict(metric_percentiles=(math.nan,)), "--metric-percentiles"),
                     (dict(save_detailed=True), "--save-detailed"), (dict(label="l"), "--label")):
        with pytest.raises(InputError, match=flag):
            BenchResultOptions(**kw)


def _cli(*args):
    from servesim.cli import _register, app

    _register()
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result


def test_replay_save_result_with_max_concurrency_one(tmp_path):
    """--max-concurrency 1: the client sends a request only after the previous one finished, so no
    two requests overlap; the result file names the cap and holds the chosen percentiles."""
    out, res = tmp_path / "r", tmp_path / "res"
    _cli("replay", "--dataset-name", "random", "--num-prompts", 12, "--request-rate", 50, "--random-input-len", 64,
         "--random-output-len", 8, "--max-concurrency", 1, "--save-result", "--save-detailed", "--result-dir", res,
         "--percentile-metrics", "ttft,e2el", "--metric-percentiles", "50,90", "--label", "sim",
         "--metadata", "gpu=h100", "--out", out)
    (path,) = res.glob("sim-50.0qps-concurrency1-Llama-3.1-8B-*.json")
    data = json.loads(path.read_text())
    assert (data["max_concurrency"], data["num_prompts"], data["completed"], data["gpu"]) == (1, 12, 12, "h100")
    assert {"p50_ttft_ms", "p90_e2el_ms"} <= set(data) and "p99_ttft_ms" not in data
    start = np.array(data["start_times"])
    end = start + np.array(data["ttfts"]) + np.array([sum(x) for x in data["itls"]])
    assert np.all(start[1:] >= end[:-1] - 1e-9)
    config = (out / "config.yaml").read_text()
    assert "max_concurrency: 1" in config


def test_length_only_trace_gets_its_rate_from_request_rate(tmp_path):
    trace = tmp_path / "len.csv"
    trace.write_text("num_prefill_tokens,num_decode_tokens\n" + "".join(f"{50 + i},{4 + i % 3}\n" for i in range(9)))
    _cli("replay", trace, "--request-rate", "inf", "--num-prompts", 6, "--out", tmp_path / "a")
    frame = pd.read_parquet(tmp_path / "a" / "requests.parquet")
    assert len(frame) == 6 and (frame["arrival_s"] == 0.0).all()
    _cli("replay", trace, "--request-rate", 2, "--burstiness", 4, "--seed", 3, "--out", tmp_path / "b")
    first = pd.read_parquet(tmp_path / "b" / "requests.parquet")["arrival_s"].to_numpy()
    assert first[0] == 0.0 and np.all(np.diff(first) > 0)
    # the rate is a loader option in config.yaml, so the run's own config replays the same arrivals
    _cli("run", tmp_path / "b" / "config.yaml", "--out", tmp_path / "c")
    (again,) = (tmp_path / "c").rglob("requests.parquet")
    assert np.array_equal(pd.read_parquet(again)["arrival_s"].to_numpy(), first)


def test_sharegpt_json_as_trace_and_as_dataset_path(tmp_path):
    path = tmp_path / "sg.json"
    path.write_text(json.dumps([{"conversations": [{"value": "q" * (40 + i)}, {"value": "a" * (8 * (i + 1))}]}
                                for i in range(5)]))
    _cli("replay", "--dataset-path", path, "--request-rate", "inf", "--out", tmp_path / "a")
    frame = pd.read_parquet(tmp_path / "a" / "requests.parquet")
    assert frame["prompt_len"].tolist() == [10, 11, 11, 11, 11] and frame["output_len"].tolist() == [2, 4, 6, 8, 10]
    _cli("replay", "--dataset-name", "sharegpt", "--dataset-path", path, "--num-prompts", 20, "--out", tmp_path / "b")
    frame = pd.read_parquet(tmp_path / "b" / "requests.parquet")
    assert len(frame) == 20 and set(frame["output_len"]) <= {2, 4, 6, 8, 10}


def test_eta_follows_simulated_time_while_requests_arrive_and_speed_has_two_digits():
    from servesim.report import _speed, eta_s

    # 10 s elapsed, 25 of 100 simulated seconds of arrivals done: 30 s more, whatever has finished
    assert eta_s(10.0, 25.0, 1, 50, span_s=100.0) == pytest.approx(30.0)
    assert eta_s(10.0, 25.0, 40, 50, span_s=100.0) == pytest.approx(30.0)
    # every request has arrived: draining, paced by requests finished
    assert eta_s(10.0, 120.0, 40, 50, span_s=100.0) == pytest.approx(2.5)
    assert eta_s(10.0, 0.0, 0, 50, span_s=100.0) is None and eta_s(10.0, 5.0, 50, 50, span_s=100.0) is None
    assert _speed({"sim_speedup_x": 0.31}) == ", 0.31x real time"
    assert _speed({"sim_speedup_x": 950.4}) == ", 950x real time" and _speed({"sim_speedup_x": None}) == ""


def test_trace_options_reach_the_loader(tmp_path):
    from servesim.bench_traffic import parse_trace_options

    assert parse_trace_options(["start_s=60 all_clients=true", "model=GPT-4", "x=", "n=null"]) == \
        {"start_s": 60, "all_clients": True, "model": "GPT-4", "x": "", "n": None}
    with pytest.raises(InputError, match="--trace-option"):
        parse_trace_options(["start_s"])
    (tmp_path / "chunk-3-trace.csv").write_text("0,0,0,,0,0\n60,3.0,1.0,Gamma,1.0,0.3\n")
    (tmp_path / "chunk-3-dataset.json").write_text(json.dumps({"0": {"input_tokens": "{64: 1.0}",
                                                                     "output_tokens": "{4: 1.0}"}}))
    _cli("replay", tmp_path / "chunk-3-trace.csv", "--format", "servegen", "--trace-option", "start_s=60",
         "--trace-option", "duration_s=20", "--out", tmp_path / "r")
    frame = pd.read_parquet(tmp_path / "r" / "requests.parquet")
    assert 20 < len(frame) < 110 and set(frame["prompt_len"]) == {64}  # ~3/s over 20 s
    assert "start_s: 60" in (tmp_path / "r" / "config.yaml").read_text()
    from servesim.cli import app

    bad = CliRunner().invoke(app, ["replay", str(tmp_path / "chunk-3-trace.csv"), "--format", "servegen",
                                   "--trace-option", "start=60", "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "unknown option(s) start" in bad.output and "start_s" in bad.output
    bad = CliRunner().invoke(app, ["replay", "--dataset-name", "random", "--trace-option", "a=1",
                                   "--out", str(tmp_path / "y")])
    assert bad.exit_code == 2 and "--trace-option" in bad.output


def test_append_result_adds_a_line_as_vllm_a_plus_mode_does(tmp_path):
    """--append-result alone writes a new file; again, the second result follows a newline (serve.py:
    `open(..., "a+")`, "\\n" when the file is not empty); results are the same run's figures."""
    res = tmp_path / "res.json"
    args = ("replay", "--dataset-name", "random", "--num-prompts", 6, "--random-input-len", 32, "--random-output-len",
            4, "--result-filename", res, "--append-result")
    _cli(*args, "--out", tmp_path / "a")
    first = res.read_text()
    assert "\n" not in first and json.loads(first)["completed"] == 6
    _cli(*args, "--request-rate", 10, "--out", tmp_path / "b")
    lines = res.read_text().split("\n")
    assert lines[0] == first and len(lines) == 2
    assert (json.loads(lines[1])["request_rate"], json.loads(first)["request_rate"]) == (10.0, "inf")


def test_append_result_refuses_a_file_that_is_not_results(tmp_path):
    from servesim.cli import _register, app

    _register()
    notes = tmp_path / "notes.json"
    notes.write_text('{"a": 1}\nmy thesis notes\n')
    bad = CliRunner().invoke(app, ["replay", "--dataset-name", "random", "--num-prompts", 4, "--random-input-len", 32,
                                   "--random-output-len", 4, "--result-filename", str(notes), "--append-result",
                                   "--out", str(tmp_path / "r")])
    assert bad.exit_code == 2 and "line 2 is not a result" in bad.output and str(notes) in bad.output.replace("\n", "")
    assert not (tmp_path / "r").exists()  # refused before the run
    assert notes.read_text() == '{"a": 1}\nmy thesis notes\n'
    bad = CliRunner().invoke(app, ["replay", "--dataset-name", "random", "--result-dir", str(tmp_path),
                                   "--out", str(tmp_path / "r2")])
    assert bad.exit_code == 2 and "--save-result or --append-result" in bad.output
