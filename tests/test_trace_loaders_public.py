"""Loaders for BurstGPT, raw ShareGPT and ServeGen: hand-built files, exact values, bad rows."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from servesim.traces.errors import InputError
from servesim.traces.formats import load_workload, sniff_format

BURST_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"


def test_burstgpt_rows_failed_left_out_and_model_filter(tmp_path):
    path = tmp_path / "BurstGPT_1.csv"
    path.write_text(BURST_HEADER + "5,ChatGPT,472,18,490,Conversation log\n45,ChatGPT,1087,0,1087,Conversation log\n"
                    "118,GPT-4,417,276,693,API log\n120,GPT-4,0,3,3,API log\n")
    assert sniff_format(path) == "burstgpt"
    wl = load_workload(path)
    assert [(r.arrival_time_s, r.prompt_len, r.output_len) for r in wl.requests] == [(0.0, 472, 18), (113.0, 417, 276)]
    assert "2 rows left out" in wl.source and "CC-BY-4.0" in wl.attribution
    assert [r.prompt_len for r in load_workload(path, model="GPT-4").requests] == [417]
    with pytest.raises(InputError, match="did you mean 'GPT-4'"):
        load_workload(path, model="gpt-4")


def test_burstgpt_bad_cells_name_line_and_column(tmp_path):
    path = tmp_path / "b.csv"
    path.write_text(BURST_HEADER + "5,ChatGPT,472,18,490,x\n6,ChatGPT,12.5,3,15,x\n")
    with pytest.raises(InputError, match=r"b.csv, line 3, field 'Request tokens'"):
        load_workload(path)
    path.write_text(BURST_HEADER + "9,ChatGPT,4,1,5,x\n6,ChatGPT,4,3,7,x\n")
    with pytest.raises(InputError, match="line 3, field 'Timestamp'.*require_sorted"):
        load_workload(path)
    assert [r.arrival_time_s for r in load_workload(path, require_sorted=False).requests] == [0.0, 3.0]
    path.write_text(BURST_HEADER + "9,ChatGPT,4,0,4,x\n")
    with pytest.raises(InputError, match="no request left"):
        load_workload(path)


def _conv(*turns: str) -> dict:
    return {"id": "x", "conversations": [{"from": "human" if i % 2 == 0 else "gpt", "value": t}
                                         for i, t in enumerate(turns)]}


def test_sharegpt_lengths_by_the_four_characters_estimate(tmp_path):
    path = tmp_path / "ShareGPT_V3.json"
    path.write_text(json.dumps([_conv("a" * 9, "b" * 8), _conv("only one turn"), _conv("c", "d" * 401, "e")],
                               indent=2))
    assert sniff_format(path) == "sharegpt"
    wl = load_workload(path, rate_per_s=math.inf)
    # ceil(9 / 4) = 3, ceil(8 / 4) = 2; "c" -> 1 (at least 1); ceil(401 / 4) = 101; the third turn is not read
    assert [(r.arrival_time_s, r.prompt_len, r.output_len) for r in wl.requests] == [(0.0, 3, 2), (0.0, 1, 101)]
    assert "1 entries skipped" in wl.source and "~4 chars/token" in wl.source
    assert [r.prompt_len for r in load_workload(path, rate_per_s=math.inf, chars_per_token=2.0).requests] == [5, 1]
    # vLLM's is_valid_sequence: 3- and 1-token prompts are under its 4-token minimum
    with pytest.raises(InputError, match="within the prune limits"):
        load_workload(path, rate_per_s=math.inf, prune=True)
    path.write_text(json.dumps([_conv("a" * 16, "b" * 16), _conv("a" * 4100, "b")]))
    assert [r.prompt_len for r in load_workload(path, rate_per_s=math.inf, prune=True).requests] == [4]
    timed = load_workload(path, rate_per_s=2.0, seed=1)
    assert timed.requests[0].arrival_time_s == 0.0 and timed.requests[1].arrival_time_s > 0


def test_sharegpt_bad_input(tmp_path):
    path = tmp_path / "s.json"
    path.write_text('[\n  {"conversations": [{"value": "hi"}, {"value": "yo"}]},\n  {"id": 3}\n]')
    with pytest.raises(InputError, match=r"s.json, line 3, field 'conversations'"):
        load_workload(path, rate_per_s=1.0)
    path.write_text('[\n {"conversations": [{"value": "hi"},\n {"value": 7}]}]')
    with pytest.raises(InputError, match=r"line 2, field 'conversations\[1\].value'"):
        load_workload(path, fmt="sharegpt", rate_per_s=1.0)
    path.write_text(json.dumps([_conv("hello", "there")]))
    with pytest.raises(InputError, match="no arrival times.*--request-rate"):
        load_workload(path)
    if _no_transformers():
        with pytest.raises(InputError, match="needs the transformers package"):
            load_workload(path, rate_per_s=1.0, tokenizer="meta-llama/Llama-3.1-8B")
    with pytest.raises(InputError, match="chars_per_token"):
        load_workload(path, rate_per_s=1.0, chars_per_token=0)


def _no_transformers() -> bool:
    import importlib.util

    return importlib.util.find_spec("transformers") is None


def _servegen(tmp_path, rows: str, dataset: dict):
    (tmp_path / "chunk-7-trace.csv").write_text(rows)
    (tmp_path / "chunk-7-dataset.json").write_text(json.dumps(dataset))
    return tmp_path / "chunk-7-trace.csv"


DATASET = {"0": {"input_tokens": "{100: 0.5, 200: 0.5}", "output_tokens": "{10: 1.0}", "reason_ratio": "{}"},
           "1200": {"input_tokens": "{}", "output_tokens": "{}", "reason_ratio": "{}"}}


def test_servegen_windows_rates_and_lengths(tmp_path):
    path = _servegen(tmp_path, "0,2.0,1.0,Gamma,1.0,0.5\n600,0,0,,0,0\n1200,1.0,0.8,Weibull,1.5,0.9\n", DATASET)
    wl = load_workload(path, fmt="servegen", duration_s=1800, seed=4)
    t = np.array([r.arrival_time_s for r in wl.requests])
    first, second = np.sum(t < 600), np.sum(t >= 1200)
    assert np.sum((t >= 600) & (t < 1200)) == 0  # the empty window sends nothing
    assert 1000 < first < 1400 and 480 < second < 720  # 2/s and 1/s over 600 s each
    assert {r.prompt_len for r in wl.requests} == {100, 200} and {r.output_len for r in wl.requests} == {10}
    again = load_workload(path, fmt="servegen", duration_s=1800, seed=4)
    assert [r.arrival_time_s for r in again.requests] == t.tolist()  # one seed, the same requests
    part = load_workload(path, fmt="servegen", start_s=1200, duration_s=60, seed=4)
    assert all(0 <= r.arrival_time_s < 60 for r in part.requests) and "ServeGen" in part.attribution


def test_servegen_bad_input(tmp_path):
    path = _servegen(tmp_path, "0,2.0,1.0,Poisson,1.0,0.5\n", DATASET)
    with pytest.raises(InputError, match="line 1, field 'pattern'"):
        load_workload(path, fmt="servegen")
    path = _servegen(tmp_path, "0,2.0,1.0,Gamma,1.0\n", DATASET)
    with pytest.raises(InputError, match="line 1.*6 fields"):
        load_workload(path, fmt="servegen")
    path = _servegen(tmp_path, "0,2.0,1.0,Gamma,1.0,0.5\n", {"0": {"input_tokens": "{1: -1}", "output_tokens": "{}"}})
    with pytest.raises(InputError, match="field '0.input_tokens'"):
        load_workload(path, fmt="servegen")
    path = _servegen(tmp_path, "0,2.0,1.0,Gamma,1.0,0.5\n", DATASET)
    with pytest.raises(InputError, match="no request in"):
        load_workload(path, fmt="servegen", start_s=5000)
    (tmp_path / "chunk-7-dataset.json").unlink()
    with pytest.raises(InputError, match="dataset file is missing"):
        load_workload(path, fmt="servegen")
    with pytest.raises(InputError, match="did you mean 'servegen'"):
        load_workload(path, fmt="servgen")
