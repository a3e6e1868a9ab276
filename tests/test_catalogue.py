"""A catalogue of bad inputs: files, flags, YAML and the Python API.

Every case asserts the exit code (or the exception), what the message says, and that nothing on disk
changed: the whole tree of inputs and of the working folder (where `--out` folders live) is
snapshotted before and after. Run in-process (typer's CliRunner): the catalogue takes seconds.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servesim.cli import _register, app
from servesim.simulator.outdir import MARKER
from servesim.traces.bundled import DEFAULT_TRACE, bundled_trace_path
from servesim.traces.errors import InputError

_register()

SHAREGPT = bundled_trace_path(DEFAULT_TRACE)


def _write_inputs(d: Path) -> None:
    raw = gzip.decompress(SHAREGPT.read_bytes())
    lines = raw.decode().splitlines()
    (d / "five.jsonl").write_text("\n".join(lines[:5]) + "\n")
    (d / "empty.jsonl").write_text("")
    (d / "empty.csv").write_text("")
    (d / "blank.jsonl.gz").write_bytes(gzip.compress(b"\n\n"))
    (d / "trunc.jsonl.gz").write_bytes(SHAREGPT.read_bytes()[:3000])
    (d / "late_trunc.jsonl.gz").write_bytes(SHAREGPT.read_bytes()[: len(SHAREGPT.read_bytes()) // 2])
    (d / "junk.jsonl").write_bytes(bytes(range(256)) * 8)
    (d / "unknown_keys.jsonl").write_text('{"foo": 1, "bar": 2}\n')
    (d / "bad_row.jsonl").write_text('{"request_id": "a", "arrival_time_s": 0, "prompt_len": 10, "output_len": 5}\n'
                                     '{"request_id": "b", "arrival_time_s": 1, "prompt_len": 10, "output_len": -3}\n')
    (d / "far.jsonl").write_text('{"request_id": "a", "arrival_time_s": 0, "prompt_len": 10, "output_len": 5}\n'
                                 '{"request_id": "b", "arrival_time_s": 1e300, "prompt_len": 10, "output_len": 5}\n')
    bomb = 'a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n' + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8))
    (d / "scen_bomb.yaml").write_text("workload: {generator: poisson, num_requests: 4}\n" + bomb)
    (d / "cluster_bomb.yaml").write_text(bomb)
    (d / "scen_unknown_key.yaml").write_text("workload: {generator: poisson, num_requests: 4}\n"
                                             "scheduler: {max_num_seq: 4}\n")
    (d / "scen_escape.yaml").write_text("name: ../../escape\nworkload: {generator: poisson, num_requests: 4}\n")
    (d / "scen_slash.yaml").write_text("name: a/b\nworkload: {generator: poisson, num_requests: 4}\n")
    (d / "scen_no_workload.yaml").write_text("name: x\nscheduler: {max_num_seqs: 4}\n")
    (d / "scen_syntax.yaml").write_text("name: x\nworkload: {generator: poisson\n")
    (d / "scen_cost.yaml").write_text("workload: {generator: poisson, num_requests: 4}\ncost_model: {name: roofine}\n")
    (d / "scen_engine.yaml").write_text("workload: {generator: poisson, num_requests: 4}\nengine: sglng\n")
    (d / "scen_generator.yaml").write_text("workload: {generator: poison, num_requests: 4}\n")
    (d / "scen_ok.yaml").write_text("name: ok\nworkload: {generator: poisson, num_requests: 4}\n")
    (d / "scen_bench_key.yaml").write_text("workload:\n  bench: {dataset_name: random, num_promts: 4}\n")
    (d / "scen_bench_value.yaml").write_text("workload:\n  bench: {dataset_name: random, random_range_ratio: 1.5}\n")
    (d / "scen_two_kinds.yaml").write_text("workload: {bench: {dataset_name: random}, trace: sharegpt-300}\n")
    (d / "not_results.json").write_text('{"completed": 1}\nmy notes, not JSON\n')
    (d / "cluster_list.yaml").write_text("- a\n- b\n")
    (d / "cluster_router.yaml").write_text("base: {hardware: {model: llama-3.1-8b, gpu: h100}}\n"
                                           "replicas: [{count: 2}]\nrouter: round_robn\n")
    (d / "cluster_gpu.yaml").write_text("base: {hardware: {model: llama-3.1-8b, gpu: h10}}\nreplicas: [{count: 2}]\n")
    (d / "burst_bad.csv").write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                                     "5,ChatGPT,472,18,490,x\n6,ChatGPT,four,3,7,x\n")
    (d / "sg.json").write_text('[{"conversations": [{"value": "hi there"}, {"value": "yo"}]},\n {"id": 2}]')
    (d / "chunk-1-trace.csv").write_text("0,2.0,1.0,Gamma,1.0,0.5\n")
    (d / "plan_replicas.yaml").write_text("cluster: {replicas: [{count: 1}]}\nsearch: {tp: [1]}\n")
    (d / "plan_key.yaml").write_text("cluster: {base: {hardware: {model: llama-3.1-8b, gpu: h100}}}\n"
                                     "serch: {tp: [1]}\n")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("inputs")
    _write_inputs(d)
    return d


def _snapshot(*roots: Path) -> dict[str, tuple]:
    out = {}
    for root in roots:
        for p in sorted(root.rglob("*")):
            st = p.lstat()
            out[str(p)] = (p.is_dir(), st.st_size, st.st_mtime_ns, st.st_mode)
        out[str(root)] = (True, 0, 0, root.stat().st_mode)
    return out


def _prepare(work: Path, prep: str | None) -> None:
    if prep == "foreign":
        (work / "out").mkdir()
        (work / "out" / "notes.txt").write_text("mine")
    elif prep == "file":
        (work / "out").write_text("a file")
    elif prep == "result":
        (work / "out").mkdir()
        (work / "out" / MARKER).write_text("replay\n")
        (work / "out" / "summary.json").write_text("{}")
        (work / "out" / "config.yaml").write_text("{}")
    elif prep == "thesis":  # a user's folder holding files with our names, no marker
        (work / "out").mkdir()
        for name in ("summary.json", "config.yaml", "chapter1.tex"):
            (work / "out" / name).write_text("{}")
    elif prep == "result+foreign":
        _prepare(work, "result")
        (work / "mine").mkdir()
        (work / "mine" / "report.html").write_text("my own page")
    elif prep == "lock-link":
        (work / "victim.txt").write_text("someone else's file")
        (work / ".out.lock").symlink_to(work / "victim.txt")
    elif prep == "locked":
        import fcntl

        lock = work / ".out.lock"
        fd = os.open(lock, os.O_RDWR | os.O_CREAT)
        os.write(fd, b"4242\n")
        fcntl.flock(fd, fcntl.LOCK_EX)
        _HELD.append(fd)


_HELD: list[int] = []

# (id, command line ({in} = inputs folder), preparation, exit code, message parts)
CLI_CASES = [
    # --- files ---------------------------------------------------------------------------------
    ("missing-trace", "replay {in}/nope.jsonl", None, 2, ["nope.jsonl: file not found"]),
    ("trace-is-folder", "replay {in}", None, 2, ["this is a folder, not a trace file"]),
    ("empty-jsonl", "replay {in}/empty.jsonl", None, 2, ["empty.jsonl: the file is empty"]),
    ("empty-csv", "replay {in}/empty.csv --format lengths", None, 2, ["empty.csv: the file is empty"]),
    ("empty-after-gunzip", "replay {in}/blank.jsonl.gz", None, 2, ["empty (after decompression)"]),
    ("truncated-gz", "replay {in}/trunc.jsonl.gz", None, 2, ["trunc.jsonl.gz: corrupt or truncated gzip"]),
    ("truncated-gz-late", "replay {in}/late_trunc.jsonl.gz", None, 2, ["corrupt or truncated gzip"]),
    ("junk-bytes", "replay {in}/junk.jsonl", None, 2, ["junk.jsonl", "cannot tell the trace format"]),
    ("unknown-keys", "replay {in}/unknown_keys.jsonl", None, 2, ["cannot tell the trace format", "bar, foo"]),
    ("azure-on-jsonl", "replay {in}/five.jsonl --format azure", None, 2,
     ["five.jsonl: --format: format 'azure' reads csv files, but this is a jsonl file", "'llmservingsim'"]),
    ("lengths-on-jsonl", "replay {in}/five.jsonl --format lengths", None, 2, ["reads csv files"]),
    ("mooncake-on-sharegpt", "replay {in}/five.jsonl --format mooncake", None, 2, ["line 1", "timestamp"]),
    ("format-typo", "replay {in}/five.jsonl --format mooncak", None, 2, ["did you mean 'mooncake'?"]),
    ("bad-row", "replay {in}/bad_row.jsonl", None, 2, ["bad_row.jsonl, line 2", "output_len"]),
    ("arrival-1e300", "replay {in}/far.jsonl", None, 2, ["far.jsonl", "request 'b' arrives at 1e+300 s"]),
    # --- flags ---------------------------------------------------------------------------------
    ("model-typo", "replay --model llama-3.1-8c", None, 2, ["--model: unknown model", "did you mean 'llama-3.1-8b'?"]),
    ("gpu-typo", "replay --gpu h10O", None, 2, ["--gpu: unknown gpu", "did you mean 'h100'?"]),
    ("engine-typo", "replay --engine sglng", None, 2, ["--engine: unknown engine", "did you mean 'sglang'?"]),
    ("cost-model-typo", "replay --cost-model roofine", None, 2, ["--cost-model", "did you mean 'roofline'?"]),
    ("executor", "replay --executor tpu", None, 2, ["--executor: unknown executor 'tpu'", "sim, gpu"]),
    ("clock", "replay --clock wall", None, 2, ["--clock"]),
    ("sampling", "replay --sampling random", None, 2, ["--sampling"]),
    ("tp-zero", "replay --tp 0", None, 2, ["--tp"]),
    ("max-requests-negative", "replay --max-requests -1", None, 2, ["--max-requests"]),
    ("max-requests-zero", "replay --max-requests 0", None, 2, ["--max-requests", "an integer >= 1"]),
    ("workers-negative", "run {in}/scen_ok.yaml --workers -3", None, 2, ["--workers", "an integer >= 1"]),
    ("rate-scale-zero", "replay --rate-scale 0", None, 2, ["--rate-scale", "> 0"]),
    ("set-no-equals", "replay --set foo", None, 2, ["--set: expects key=value, got 'foo'"]),
    ("set-unknown-key", "replay --set scheduler.max_num_seq=3", None, 2,
     ["--set scheduler.max_num_seq", "did you mean max_num_seqs"]),
    ("switch-given-a-value", "replay --macro-steps true", None, 2, ["switches take no value"]),
    ("option-typo", "replay --macro-step", None, 2, ["No such option", "--macro-steps"]),
    ("backend-typo", "run {in}/scen_ok.yaml --backend rey", None, 2, ["--backend", "did you mean 'ray'?"]),
    ("ray-address-local", "run {in}/scen_ok.yaml --ray-address 1.2.3.4:6379", None, 2,
     ["--ray-address only applies to --backend ray"]),
    ("validate-format-typo", "replay {in}/five.jsonl --format lengthz", None, 2, ["did you mean 'lengths'?"]),
    # --- output folders ------------------------------------------------------------------------
    ("out-foreign", "replay --max-requests 2 --out out", "foreign", 2, ["not a servesim result", "notes.txt"]),
    ("out-file", "replay --max-requests 2 --out out", "file", 2, ["out is a file"]),
    ("out-dot", "replay --max-requests 2 --out .", None, 2, ["current folder"]),
    ("out-earlier-result", "replay --max-requests 2 --out out", "result", 2, ["--overwrite to replace it"]),
    ("out-unwritable", "replay --max-requests 2 --out /proc/servesim/out", None, 2, ["cannot write results"]),
    ("out-locked", "replay --max-requests 2 --out out", "locked", 2, ["another servesim run (pid 4242)"]),
    ("cluster-out-foreign", "cluster {in}/cluster_router.yaml --out out", "foreign", 2, ["not a servesim result"]),
    ("run-out-replay-result", "run {in}/scen_ok.yaml --out out", "result", 2, ["replay result, not a sweep"]),
    ("run-out-foreign", "run {in}/scen_ok.yaml --out out", "foreign", 2, ["not a servesim result"]),
    ("plan-out-file", "plan {in}/plan_key.yaml --out out", "file", 2, ["out is a file"]),
    ("fit-out-exists", "fit {in}/five.jsonl --out {in}/five.jsonl --model llama-3.1-8b --gpu h100", None, 2,
     ["five.jsonl already exists", "--overwrite"]),
    ("fit-out-folder", "fit {in}/five.jsonl --out {in} --model llama-3.1-8b --gpu h100", None, 2, ["is a folder"]),
    ("step-trace-exists", "replay --max-requests 2 --out new --step-trace {in}/five.jsonl", None, 2,
     ["--step-trace", "will not replace it"]),
    ("step-trace-unwritable", "replay --max-requests 2 --out new --step-trace /proc/servesim/t.jsonl", None, 2,
     ["--step-trace", "cannot write results"]),
    ("overwrite-not-ours", "replay --max-requests 2 --out out --overwrite", "thesis", 2,
     ["not a servesim result", "chapter1.tex"]),
    ("lock-through-symlink", "replay --max-requests 2 --out out", "lock-link", 2, ["symbolic link"]),
    ("step-trace-cmd-exists", "step-trace {in}/five.jsonl --out {in}/five.jsonl", None, 2,
     ["five.jsonl already exists", "--overwrite"]),
    ("calibrate-frontend-exists",
     "calibrate-frontend --base-url http://127.0.0.1:9 --model m --out {in}/five.jsonl", None, 2,
     ["five.jsonl already exists", "--overwrite"]),
    ("plot-out-foreign", "plot out --out mine", "result+foreign", 2, ["not a servesim result", "report.html"]),
    ("plot-out-dot", "plot out --out .", "result", 2, ["current folder"]),
    ("validate-bench-out-foreign", "validate-bench {in}/five.jsonl --model llama-3.1-8b --gpu h100 --out out",
     "foreign", 2, ["not a servesim result"]),
    # --- vllm bench serve flags ----------------------------------------------------------------
    ("bench-rate-on-timed-trace", "replay {in}/five.jsonl --request-rate 4", None, 2,
     ["five.jsonl", "--request-rate", "has its own arrival times", "--rate-scale"]),
    ("bench-rate-on-bundled", "replay --request-rate 4", None, 2, ["--request-rate", "bundled trace"]),
    ("bench-burstiness-alone", "replay --burstiness 2", None, 2, ["--burstiness", "with --request-rate"]),
    ("bench-prompts-and-max", "replay --num-prompts 3 --max-requests 3", None, 2, ["--num-prompts", "one of the two"]),
    ("bench-random-flag-no-dataset", "replay --random-input-len 64", None, 2,
     ["--random-input-len", "with --dataset-name random"]),
    ("bench-random-flag-sonnet", "replay --dataset-name sonnet --random-output-len 64", None, 2,
     ["--random-output-len", "not sonnet"]),
    ("bench-dataset-max-requests", "replay --dataset-name random --max-requests 3", None, 2,
     ["--max-requests", "--num-prompts"]),
    ("bench-dataset-rate-scale", "replay --dataset-name random --rate-scale 2", None, 2,
     ["--rate-scale", "--request-rate"]),
    ("bench-dataset-path-random", "replay --dataset-name random --dataset-path {in}/five.jsonl", None, 2,
     ["--dataset-path", "--dataset-name sharegpt"]),
    ("bench-dataset-path-and-trace", "replay {in}/five.jsonl --dataset-path {in}/five.jsonl", None, 2,
     ["--dataset-path", "not both"]),
    ("bench-concurrency-zero", "replay --max-concurrency 0", None, 2, ["--max-concurrency", "got 0"]),
    ("bench-rate-zero", "replay --dataset-name random --request-rate 0", None, 2, ["--request-rate", "> 0"]),
    ("bench-percentile-metric-typo", "replay --save-result --percentile-metrics ttft,tbt", None, 2,
     ["--percentile-metrics", "'tbt'", "ttft, tpot, itl, e2el"]),
    ("bench-percentile-not-number", "replay --save-result --metric-percentiles 50,p99", None, 2,
     ["--metric-percentiles", "'p99'"]),
    ("bench-percentile-range", "replay --save-result --metric-percentiles 101", None, 2,
     ["--metric-percentiles", "[0, 100]"]),
    ("bench-result-dir-no-save", "replay --result-dir res", None, 2, ["--result-dir", "--save-result"]),
    ("bench-filename-no-save", "replay --result-filename r.json", None, 2, ["--result-filename", "--save-result"]),
    ("bench-detailed-no-save", "replay --save-detailed", None, 2, ["--save-detailed", "--save-result"]),
    ("bench-label-no-save", "replay --label sim", None, 2, ["--label", "--save-result"]),
    ("bench-append-to-not-results", "replay --dataset-name random --num-prompts 2 --append-result "
     "--result-filename {in}/not_results.json", None, 2, ["not_results.json", "line 2 is not a result"]),
    ("bench-percentiles-no-save", "replay --metric-percentiles 50", None, 2, ["--metric-percentiles", "--save-result"]),
    ("bench-metadata-format", "replay --save-result --metadata tp", None, 2, ["--metadata", "KEY=VALUE"]),
    ("burstgpt-bad-cell", "replay {in}/burst_bad.csv", None, 2, ["burst_bad.csv, line 3, field 'Request tokens'"]),
    ("sharegpt-no-rate", "replay {in}/sg.json", None, 2, ["sg.json", "no arrival times", "--request-rate"]),
    ("sharegpt-bad-entry", "replay {in}/sg.json --request-rate 2", None, 2,
     ["sg.json, line 2, field 'conversations'"]),
    ("servegen-no-dataset", "replay {in}/chunk-1-trace.csv --format servegen", None, 2,
     ["chunk-1-dataset.json", "dataset file is missing"]),
    ("servegen-not-sniffed", "replay {in}/chunk-1-trace.csv", None, 2, ["cannot tell the trace format"]),
    ("export-trace-not-run", "export-trace {in} --out t.json", None, 2, ["no completed run"]),
    # --- YAML ----------------------------------------------------------------------------------
    ("scenario-missing", "run {in}/nope.yaml", None, 2, ["nope.yaml"]),
    ("scenario-alias-bomb", "run {in}/scen_bomb.yaml", None, 2, ["scen_bomb.yaml", "expands to 4.9e+08 values"]),
    ("cluster-alias-bomb", "cluster {in}/cluster_bomb.yaml", None, 2, ["cluster_bomb.yaml", "expands to"]),
    ("scenario-unknown-key", "run {in}/scen_unknown_key.yaml", None, 2,
     ["scen_unknown_key.yaml, line 2", "did you mean max_num_seqs"]),
    ("scenario-name-escapes", "run {in}/scen_escape.yaml", None, 2, ["cannot be a folder name inside runs/"]),
    ("scenario-name-slash", "run {in}/scen_slash.yaml", None, 2, ["scen_slash.yaml, line 1", "'a/b'"]),
    ("scenario-no-workload", "run {in}/scen_no_workload.yaml", None, 2, ["needs a `workload:` section"]),
    ("scenario-syntax", "run {in}/scen_syntax.yaml", None, 2, ["scen_syntax.yaml"]),
    ("scenario-cost-model", "run {in}/scen_cost.yaml", None, 2, ["did you mean 'roofline'?"]),
    ("scenario-engine", "run {in}/scen_engine.yaml", None, 2, ["did you mean 'sglang'?"]),
    ("scenario-generator", "run {in}/scen_generator.yaml", None, 2, ["did you mean 'poisson'?"]),
    ("scenario-bench-key", "run {in}/scen_bench_key.yaml", None, 2,
     ["scen_bench_key.yaml, line 2", "workload.bench", "did you mean num_prompts"]),
    ("scenario-bench-value", "run {in}/scen_bench_value.yaml", None, 2,
     ["workload.bench.random_range_ratio", "[0, 1)"]),
    ("scenario-two-workload-kinds", "run {in}/scen_two_kinds.yaml", None, 2, ["exactly one of"]),
    ("scenario-library-typo", "run kv_size_preemtions", None, 2, ["did you mean 'kv_size_preemptions'?"]),
    ("scenario-library-cluster", "run cluster/pd_vs_colocated_pd", None, 2, ["cannot read scenario"]),
    ("scenario-set-typo", "run {in}/scen_ok.yaml --set scheduler.max_num_seq=3", None, 2, ["max_num_seqs"]),
    ("cluster-not-mapping", "cluster {in}/cluster_list.yaml", None, 2, ["cluster_list.yaml", "must be a mapping"]),
    ("cluster-router-typo", "cluster {in}/cluster_router.yaml", None, 2, ["did you mean 'round_robin'?"]),
    ("cluster-gpu-typo", "cluster {in}/cluster_gpu.yaml", None, 2, ["unknown gpu 'h10'"]),
    ("plan-with-replicas", "plan {in}/plan_replicas.yaml", None, 2, ["without replicas"]),
    ("plan-unknown-key", "plan {in}/plan_key.yaml", None, 2, ["serch"]),
]


@pytest.mark.parametrize("case", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_bad_cli_input(case, inputs, tmp_path, monkeypatch):
    name, line, prep, code, parts = case
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    _prepare(work, prep)
    before = _snapshot(inputs, work)
    try:
        result = CliRunner().invoke(app, line.replace("{in}", str(inputs)).split())
    finally:
        while _HELD:
            os.close(_HELD.pop())
    text = " ".join(result.output.split())  # unwrap
    assert result.exit_code == code, f"{name}: exit {result.exit_code}\n{result.output}"
    for part in parts:
        assert part in text, f"{name}: {part!r} not in\n{result.output}"
    assert "Traceback" not in result.output and "<input>" not in result.output
    after = _snapshot(inputs, work)
    if prep == "locked":  # the holder's lock file is its own
        assert set(after) == set(before)
    else:
        assert after == before, f"{name}: files changed: {sorted(set(after) ^ set(before))}"


def test_help_version_and_switch_spelling():
    runner = CliRunner()
    assert runner.invoke(app, ["--version"]).output.startswith("servesim ")
    help_text = runner.invoke(app, ["replay", "-h"]).output
    assert "--macro-steps / --no-macro-steps" in help_text and "--overwrite / --no-overwrite" in help_text
    assert "<bool>" not in help_text
    assert "--smoke / --no-smoke" in runner.invoke(app, ["run", "-h"]).output
    assert "--install-completion" in runner.invoke(app, ["-h"]).output


# --- the Python API ---------------------------------------------------------------------------

def _api_replay_foreign(work: Path):
    from servesim.api import load_trace, run
    from servesim.simulator.config import SimConfig

    (work / "mine").mkdir()
    (work / "mine" / "x.txt").write_text("x")
    run(SimConfig(), load_trace(None, max_requests=2), out_dir=work / "mine")


def _api_sweep_foreign(work: Path):
    from servesim.api import run_scenario

    (work / "o").mkdir()
    (work / "o" / "f.txt").write_text("x")
    run_scenario({"name": "x", "workload": {"generator": "poisson", "num_requests": 2}}, out_dir=work / "o")


def _api_cases():
    from servesim.api import cluster, load_trace, plan, replay, run, run_scenario, validate
    from servesim.simulator.cluster.routers import make_router
    from servesim.simulator.config import SimConfig
    from servesim.simulator.cost_model import make_cost_model
    from servesim.traces.formats import load_workload

    return [
        ("api-model-typo", lambda w: replay(model="llama-3.1-8c"), "did you mean 'llama-3.1-8b'?"),
        ("api-gpu-typo", lambda w: replay(gpu="a10O"), "unknown gpu"),
        ("api-override-typo", lambda w: replay(scheduler__max_num_seq=4), "did you mean max_num_seqs"),
        ("api-format-typo", lambda w: load_workload(SHAREGPT, fmt="mooncak"), "did you mean 'mooncake'?"),
        ("api-missing-trace", lambda w: load_trace(w / "nope.jsonl"), "file not found"),
        ("api-cost-model-typo", lambda w: make_cost_model("roofine", model="llama-3.1-8b", gpu="h100"),
         "did you mean 'roofline'?"),
        ("api-router-typo", lambda w: make_router("least_outstandin"), "did you mean 'least_outstanding'?"),
        ("api-scenario-name", lambda w: run_scenario({"name": "../x", "workload": {"generator": "poisson"}},
                                                     out_dir=w / "o"), "cannot be a folder name"),
        ("api-scenario-out-foreign", _api_sweep_foreign, "not a servesim result"),
        ("api-replay-foreign", _api_replay_foreign, "not a servesim result"),
        ("api-replay-int-trace", lambda w: replay(123), "field 'trace': got 123"),
        ("api-run-no-workload", lambda w: run(SimConfig(), None), "field 'workload': got None"),
        ("api-run-list-workload", lambda w: run(SimConfig(), [1, 2]), "a Workload"),
        ("api-run-no-config", lambda w: run(None, load_trace(None, max_requests=2)), "field 'cfg'"),
        ("api-replay-tp", lambda w: replay(tp=0), "field 'tp'"),
        ("api-replay-random-no-dataset", lambda w: replay(random_input_len=64), "with --dataset-name random"),
        ("api-replay-rate-on-timed", lambda w: replay(SHAREGPT, request_rate=3.0), "has its own arrival times"),
        ("api-replay-concurrency", lambda w: replay(max_concurrency=0), "--max-concurrency"),
        ("api-cluster-missing", lambda w: cluster(w / "nope.yaml"), "cannot read cluster config"),
        ("api-plan-max-requests", lambda w: plan(w / "p.yaml", max_requests=0), "--max-requests"),
        ("api-validate-option-typo", lambda w: validate(w, w / "x.jsonl", out_dir=w / "v", gpus="h100"),
         "did you mean 'gpu'?"),
        ("api-out-dir-type", lambda w: run(SimConfig(), load_trace(None, max_requests=2), out_dir=3), "out_dir"),
        ("api-sweep-workers", lambda w: run_scenario({"name": "x", "workload": {"generator": "poisson"}},
                                                     out_dir=w / "o", workers=-3), "--workers"),
    ]


API_CASES = _api_cases()


@pytest.mark.parametrize("case", API_CASES, ids=[c[0] for c in API_CASES])
def test_bad_api_input(case, tmp_path, monkeypatch):
    name, call, part = case
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError) as e:
        call(tmp_path)
    assert part in str(e.value), f"{name}: {e.value}"
    leftovers = [p.name for p in tmp_path.rglob("*") if ".servesim-tmp." in p.name or p.name.endswith(".lock")]
    assert not leftovers and not (tmp_path / "runs").exists()


def test_validate_refuses_a_workload_that_does_not_match(tmp_path, monkeypatch):
    """A servesim result replayed as the "measured" run, validated against another workload."""
    from servesim.api import load_trace, run
    from servesim.simulator.config import SimConfig
    from servesim.traces.canonical import save_workload

    monkeypatch.chdir(tmp_path)
    wl = load_trace(None, max_requests=6)
    run(SimConfig(), wl, out_dir=tmp_path / "measured")
    save_workload(wl, tmp_path / "same.jsonl")
    other = load_trace(None, max_requests=7)
    save_workload(other, tmp_path / "more.jsonl")
    lengths = [json.loads(x) for x in (tmp_path / "same.jsonl").read_text().splitlines()]
    lengths[3]["output_len"] += 1
    (tmp_path / "changed.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lengths))
    before = _snapshot(tmp_path)
    runner = CliRunner()
    for wl_file, parts in (("more.jsonl", ["the run has 6 requests, the workload 7"]),
                           ("changed.jsonl", ["first differing request", lengths[3]["request_id"], "output_len"])):
        res = runner.invoke(app, ["validate", "measured", "--workload", wl_file, "--run-format", "servesim",
                                  "--cost-model", "roofline", "--out", "v"])
        assert res.exit_code == 2, res.output
        text = " ".join(res.output.split())
        assert all(p in text for p in parts), res.output
    assert _snapshot(tmp_path) == before
