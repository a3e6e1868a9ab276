"""Parity with the real vLLM 0.19.1 scheduler: replay every golden trace and compare every field.

The traces were recorded with ../shared/tools/vllm_oracle (tools/record_golden.py); each folder holds
the oracle's workload, its flags and its trace.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from servesim.scheduler.oracle_trace import StepTraceConfig, run_step_trace

GOLDEN = Path(__file__).parent / "golden"
CASES = sorted(p.name for p in GOLDEN.iterdir() if (p / "trace.jsonl.gz").exists())


def _load(case: str):
    d = GOLDEN / case
    workload = [json.loads(x) for x in (d / "workload.jsonl").read_text().splitlines() if x.strip()]
    with gzip.open(d / "trace.jsonl.gz", "rt") as f:
        expected = [json.loads(x) for x in f if x.strip()]
    flags = json.loads((d / "config.json").read_text())["trace_flags"]
    return workload, expected, StepTraceConfig(**flags)


def test_at_least_twelve_golden_configs():
    assert len(CASES) >= 12


@pytest.mark.parametrize("case", CASES)
def test_golden_trace_matches_field_for_field(case):
    workload, expected, cfg = _load(case)
    ours = list(run_step_trace(workload, cfg))
    assert len(ours) == len(expected), f"{case}: {len(ours)} steps vs oracle {len(expected)}"
    for got, want in zip(ours, expected):
        assert list(got) == list(want), f"step {want['step']}: field order/set differs"
        for key in want:
            g, w = got[key], want[key]
            if key == "num_scheduled_tokens":  # the scheduler's order is part of the decision
                g, w = list(g.items()), list(w.items())
            assert g == w, f"{case} step {want['step']} field {key!r}: ours {g} != oracle {w}"


# Each oracle extension (a trace_flags key that switches it on) and the golden configs covering it.
FEATURE_FLAGS = {
    "spec_ngram": lambda f: f.get("num_spec_tokens", 0) > 0 and f.get("spec_method", "ngram") == "ngram",
    "spec_eagle": lambda f: f.get("num_spec_tokens", 0) > 0 and f.get("spec_method") == "eagle",
    "spec_draft_model": lambda f: f.get("num_spec_tokens", 0) > 0 and f.get("spec_method") == "draft_model",
    "stop_rules": lambda f: bool(f.get("eos_rate") or f.get("stop_token_ids") or f.get("min_tokens")),
    "aborts": lambda f: bool(f.get("abort_rate") or f.get("abort_preempted_rate")),
    "sliding_window": lambda f: f.get("sliding_window", 0) > 0 and not f.get("hybrid"),
    "hybrid": lambda f: bool(f.get("hybrid")),
    "lora": lambda f: f.get("num_loras", 0) > 0,
    "cache_salt": lambda f: f.get("cache_salt", 0) > 0,
    "kv_connector": lambda f: f.get("kv_connector_rate", 0) > 0,
    "pipeline_parallel": lambda f: f.get("pipeline_parallel_size", 1) > 1,
    "offload_lru": lambda f: f.get("offload_cpu_blocks", 0) > 0 and f.get("offload_eviction_policy", "lru") == "lru",
    "offload_arc": lambda f: f.get("offload_cpu_blocks", 0) > 0 and f.get("offload_eviction_policy") == "arc",
    # KV cache groups of the other kinds (tools/kv_groups_oracle.py)
    "mamba_none": lambda f: "mamba" in f.get("groups", "") and f.get("mamba_cache_mode", "none") == "none",
    "mamba_align": lambda f: "mamba" in f.get("groups", "") and f.get("mamba_cache_mode") == "align",
    "mamba_all": lambda f: "mamba" in f.get("groups", "") and f.get("mamba_cache_mode") == "all",
    "chunked_local": lambda f: "chunked_local" in f.get("groups", ""),
    "sink_full": lambda f: "sink_full" in f.get("groups", ""),
    "offload_store_threshold": lambda f: f.get("offload_cpu_blocks", 0) > 0 and f.get("offload_store_threshold", 0) >= 2,
    "grammar": lambda f: f.get("grammar_rate", 0) > 0,
    "streaming_input": lambda f: f.get("streaming_rate", 0) > 0,
    "encoder": lambda f: f.get("encoder_budget", 0) > 0,
}


def test_every_oracle_extension_has_two_golden_configs_one_async_where_allowed():
    flags = {c: json.loads((GOLDEN / c / "config.json").read_text())["trace_flags"] for c in CASES}
    for feature, on in FEATURE_FLAGS.items():
        covered = [c for c, f in flags.items() if on(f)]
        assert len(covered) >= 2, f"{feature}: golden configs {covered}"
        if feature != "spec_ngram":  # vLLM refuses async scheduling with ngram
            assert any(flags[c].get("async_scheduling") for c in covered), f"{feature}: no async golden"


@pytest.mark.parametrize("case", ["stop_rules_async_spec", "kv_connector_aborts", "hybrid_async_priority",
                                  "pp3_spec_eagle_async", "mamba_align_eagle", "blocked_mixed_async_aborts",
                                  "encoder_threshold_async_priority"])
def test_step_trace_cli_takes_the_oracle_flags(case, tmp_path):
    from typer.testing import CliRunner

    from servesim.cli import _register, app

    _register()
    d = GOLDEN / case
    argv = ["step-trace", str(d / "workload.jsonl"), "--out", str(tmp_path / "t.jsonl")]
    for k, v in json.loads((d / "config.json").read_text())["trace_flags"].items():
        opt = "--" + k.replace("_", "-")
        if v is True:
            argv.append(opt)
        elif isinstance(v, list):
            argv += [opt, ",".join(map(str, v))]
        elif v is not False:
            argv += [opt, str(v)]
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 0, res.output
    with gzip.open(d / "trace.jsonl.gz", "rt") as f:
        assert (tmp_path / "t.jsonl").read_text() == f.read()


@pytest.mark.parametrize("extra, field", [
    ({"stop_token_ids": ["x"]}, "stop_token_ids"), ({"lora_id": -1}, "lora_id"), ({"cache_salt": 3}, "cache_salt"),
    ({"abort_step": 4, "abort_phase": "later"}, "abort_phase"), ({"abort_step": 4}, "abort_step"),
    ({"remote_prefill": 1}, "remote_prefill"), ({"abort_on_preempt": "never"}, "abort_on_preempt"),
    ({"grammar_steps": -1}, "grammar_steps"), ({"stream": "yes"}, "stream"),
    ({"stream_chunk": 1}, "req_id"),  # a session line without the session's first line
    ({"mm_items": [{"offset": 1, "length": 2, "mm_hash": "x"}]}, "mm_items"),  # past the 2-token prompt
    ({"mm_items": [{"offset": 0, "length": 1}]}, "mm_items"),
])
def test_oracle_workload_extension_fields_are_validated(extra, field, tmp_path):
    from servesim.oracle_io import read_oracle_workload
    from servesim.traces.errors import InputError

    p = tmp_path / "w.jsonl"
    p.write_text(json.dumps(dict({"req_id": "a", "prompt_token_ids": [1, 2], "max_tokens": 3, "arrival_step": 0},
                                 **extra)) + "\n")
    with pytest.raises(InputError) as e:
        read_oracle_workload(p)
    assert field in str(e.value)


def test_every_golden_workload_passes_validation():
    from servesim.oracle_io import read_oracle_workload

    for case in CASES:
        assert read_oracle_workload(GOLDEN / case / "workload.jsonl")
