"""Simulation speed, whole process: x real time, engine steps per second and peak RSS per case.

    python benchmarks/sim_speed.py                      # every case whose data is present
    python benchmarks/sim_speed.py --only default hour  # some cases
    python benchmarks/sim_speed.py --vidur-python /path/to/vidur-venv/bin/python   # + Vidur, same workload

Each case is one `servesim replay` in a fresh child process (imports, trace loading, simulation and
writing results included: what a user waits for) on one core; peak RSS is that child's ru_maxrss.
"engine x" is the simulation alone (summary.json's wall_time_s: no start-up, loading or writing).
`--set KEY=VALUE` is passed to every replay case (cluster cases read their YAML) (e.g. `--set scheduler.async_scheduling=false`).
Where both cases of a paired goal ran (PAIRS: spec decode, SGLang and P/D against the plain case on
the same traffic, ...), their ratio of wall seconds per simulated second follows the table. One run
each on a shared machine is noisy: judge a pair with farm-bench runs or instructions.py's counts.

Cases (Llama-3.1-8B on one H100 with vLLM 0.19 defaults unless said):
- default: the bundled trace (`make run`);
- saturating: 3,000 random requests at 50 req/s, prompts 200-2,000 and outputs 50-500 tokens;
- hour / code: the Azure LLM inference 2023 conversation / code traces (1 hour each; ../shared);
- sglang-hour: the hour on the SGLang engine (overlap schedule, radix cache);
- mooncake: the full Mooncake conversation trace (12,031 requests), Llama-3.1-70B on 8 H100 (TP8);
- cpu-kv / cpu-kv-off: 300 requests of the bundled Mooncake sample at 0.25x on a 12,000-block pool,
  with a 512 GiB CPU KV tier (vLLM's OffloadingConnector: the fast path declines it, every step is
  simulated; it loads back 4.7 % of the tokens the GPU cache lacked) and without it;
- spec-hour: the hour with 3 speculative tokens (n-gram drafter: no draft model) at acceptance 0.7 each;
- pd-hour / colocated-hour: the hour at 4x its rate on 2 prefill + 2 decode replicas (P/D over a
  50 GB/s link, `servesim cluster` with benchmarks/configs/pd_hour.yaml) and on 4 colocated replicas;
- cluster32-lo / cluster32-kv / cluster32-prefix: 100 requests/s for 60 s on 32 replicas
  (benchmarks/cluster_speed.py's traffic) routed by `least_outstanding`, `least_kv` and `prefix_aware`;
- cluster32-spec: cluster32-lo with spec-hour's speculative decoding (3 tokens at acceptance 0.7);
- mooncake-steps: `mooncake` with the fast path off (`macro_steps: false`);
- vidur: Vidur's own workload (../shared/data/benchmarks/speed_vidur_workload: 19,366 Azure-conv
  requests, Poisson 1 req/s), Llama-2-70B TP2 on A100, batch cap 128, 4,096 tokens per batch.

Vidur side by side: install Vidur 0.0.26 in its own venv (Python 3.10; `git clone
https://github.com/microsoft/vidur && pip install -r requirements.txt && pip install -e .`), copy
`../shared/data/gpu_profiles/vidur/` into its `data/profiles/`, let it train its predictors once
(about 85 minutes on 2 cores, cached), then pass `--vidur-python`. The script gunzips Vidur's copy
of the workload and runs `python -m vidur.main` with the same engine settings, timed the same way.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "benchmarks" / "configs"
SHARED = ROOT.parent / "shared" / "data"
AZURE = SHARED / "traces" / "azure_llm_inference_2023"
VIDUR_WL = SHARED / "benchmarks" / "speed_vidur_workload"


# The bundled Mooncake sample's first 300 requests at 0.25x (the notebooks' slice) on a 12,000-block
# pool that evicts shared prefixes before they return: the `cpu-kv` case adds a 512 GiB CPU KV tier
# (vLLM's OffloadingConnector; smaller tiers hold none of the prefixes that return here), which the
# fast path declines, so it steps; `cpu-kv-off` is the same
# run without the tier (the fast path's), for comparison.
MOONCAKE_SAMPLE = (str(ROOT / "traces" / "data" / "mooncake_conversation_first5min.jsonl.gz"),
                   "--max-requests", "300", "--rate-scale", "0.25", "--set", "scheduler.max_model_len=131072",
                   "--set", "cache.num_gpu_blocks=12000")


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    args: tuple[str, ...]  # the command's arguments (before --out)
    needs: Path | None = None  # data file the case reads (skipped when absent)
    command: str = "replay"  # the servesim command: replay, or cluster (args: config YAML, trace)


def cases() -> list[Case]:
    return [
        Case("default", ()),
        Case("saturating", ("--dataset-name", "random", "--num-prompts", "3000", "--request-rate", "50",
                            "--random-input-len", "1100", "--random-output-len", "275",
                            "--random-range-ratio", "0.818")),
        Case("hour", (str(AZURE / "AzureLLMInferenceTrace_conv.csv"),), AZURE / "AzureLLMInferenceTrace_conv.csv"),
        Case("code", (str(AZURE / "AzureLLMInferenceTrace_code.csv"),), AZURE / "AzureLLMInferenceTrace_code.csv"),
        Case("sglang-hour", (str(AZURE / "AzureLLMInferenceTrace_conv.csv"), "--engine", "sglang"),
             AZURE / "AzureLLMInferenceTrace_conv.csv"),
        Case("mooncake", (str(SHARED / "traces/mooncake_fast25/conversation_trace.jsonl.gz"),
                          "--model", "llama-3.1-70b", "--tp", "8"),
             SHARED / "traces/mooncake_fast25/conversation_trace.jsonl.gz"),
        Case("cpu-kv-off", MOONCAKE_SAMPLE),
        Case("cpu-kv", (*MOONCAKE_SAMPLE, "--set", "kv_offload.kv_offloading_size=512")),
        Case("spec-hour", (str(AZURE / "AzureLLMInferenceTrace_conv.csv"), "--set", "scheduler.num_spec_tokens=3",
                           "--set", "spec_decode.acceptance=[0.7, 0.7, 0.7]"), AZURE / "AzureLLMInferenceTrace_conv.csv"),
        Case("pd-hour", (str(CONFIGS / "pd_hour.yaml"), str(AZURE / "AzureLLMInferenceTrace_conv.csv"),
                         "--rate-scale", "4"), AZURE / "AzureLLMInferenceTrace_conv.csv", "cluster"),
        Case("colocated-hour", (str(CONFIGS / "colocated_hour.yaml"), str(AZURE / "AzureLLMInferenceTrace_conv.csv"),
                                "--rate-scale", "4"), AZURE / "AzureLLMInferenceTrace_conv.csv", "cluster"),
        Case("cluster32-lo", (str(CONFIGS / "cluster32_least_outstanding.yaml"),), command="cluster"),
        Case("cluster32-kv", (str(CONFIGS / "cluster32_least_kv.yaml"),), command="cluster"),
        Case("cluster32-prefix", (str(CONFIGS / "cluster32_prefix_aware.yaml"),), command="cluster"),
        Case("cluster32-spec", (str(CONFIGS / "cluster32_spec.yaml"),), command="cluster"),
        Case("mooncake-steps", (str(SHARED / "traces/mooncake_fast25/conversation_trace.jsonl.gz"),
                                "--model", "llama-3.1-70b", "--tp", "8", "--set", "macro_steps=false"),
             SHARED / "traces/mooncake_fast25/conversation_trace.jsonl.gz"),
        Case("vidur", (str(VIDUR_WL / "vidur_workload_servesim.csv.gz"), "--model", "llama-2-70b", "--gpu", "a100",
                       "--tp", "2", "--set", "scheduler.max_num_seqs=128",
                       "--set", "scheduler.max_num_batched_tokens=4096"), VIDUR_WL / "vidur_workload_servesim.csv.gz"),
    ]


@dataclass(frozen=True, slots=True)
class Pair:
    """A speed goal between two cases on the same traffic (docs/SPEED.md, "Goals"): `case` costs at
    most `goal` times what `plain` costs per simulated second."""

    case: str
    plain: str
    goal: float


# Issue 43's paired goals: spec decode, SGLang and P/D against the plain vLLM case on the same
# traffic; the state-reading routers against least_outstanding; Mooncake against its own run with
# the fast path off (no slower).
PAIRS = (
    Pair("spec-hour", "hour", 1.5),
    Pair("sglang-hour", "hour", 1.5),
    Pair("pd-hour", "colocated-hour", 1.5),
    Pair("cluster32-kv", "cluster32-lo", 1.5),
    Pair("cluster32-prefix", "cluster32-lo", 1.5),
    Pair("mooncake", "mooncake-steps", 1.0),
)


def paired_ratios(cost_per_sim_s: dict[str, float]) -> list[tuple[Pair, float]]:
    """Each goal of PAIRS whose two cases both have a cost (per simulated second), with its ratio."""
    return [(p, cost_per_sim_s[p.case] / cost_per_sim_s[p.plain]) for p in PAIRS
            if p.case in cost_per_sim_s and p.plain in cost_per_sim_s and cost_per_sim_s[p.plain] > 0]


def pair_lines(cost_per_sim_s: dict[str, float], what: str) -> list[str]:
    """The paired goals as printed lines (none when no pair was measured)."""
    ratios = paired_ratios(cost_per_sim_s)
    if not ratios:
        return []
    lines = [f"paired goals ({what}):"]
    for p, r in ratios:
        verdict = "met" if r <= p.goal else "not met"
        lines.append(f"  {p.case} / {p.plain}: {r:.3f} (goal <= {p.goal:g}: {verdict})")
    return lines


@dataclass(frozen=True, slots=True)
class Measured:
    wall_s: float  # whole process
    peak_rss_mib: float
    sim_s: float | None  # simulated duration (None when the tool does not report it)
    num_steps: int | None
    num_requests: int | None
    engine_wall_s: float | None = None  # the simulation alone, as the run reports it
    error: str | None = None


def child_env() -> dict[str, str]:
    """This checkout first on the children's path, so they run the code being measured."""
    return dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _child(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float, int, str]:
    """Run `cmd`; its wall time, its own peak RSS (os.wait4: one case at a time), exit code, stderr tail."""
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        err.seek(0)
        tail = err.read().decode(errors="replace").strip().splitlines()[-3:]
    return wall, usage.ru_maxrss / 1024, os.waitstatus_to_exitcode(status), " | ".join(tail)


def run_servesim(case: Case, extra: list[str]) -> Measured:
    with tempfile.TemporaryDirectory(prefix="servesim-speed-") as tmp:
        out = Path(tmp) / "out"
        sets = extra if case.command == "replay" else []  # `cluster` takes its settings from its YAML
        cmd = [sys.executable, "-m", "servesim", case.command, *case.args, *sets, "--out", str(out)]
        wall, rss, code, err = _child(cmd, ROOT, child_env())
        if code != 0:
            return Measured(wall, rss, None, None, None, f"exit {code}: {err}")
        summary = json.loads((out / "summary.json").read_text())
    return Measured(wall, rss, summary["sim_duration_s"], summary["num_steps"], summary["num_requests"],
                    summary["wall_time_s"])


def run_vidur(python: str) -> Measured:
    """Vidur 0.0.26 on its own copy of the workload, with the `vidur` case's engine settings."""
    with tempfile.TemporaryDirectory(prefix="vidur-speed-") as tmp:
        trace = Path(tmp) / "vidur_workload.csv"
        with gzip.open(VIDUR_WL / "vidur_workload_vidur.csv.gz") as src, trace.open("wb") as dst:
            shutil.copyfileobj(src, dst)
        vidur_root = Path(subprocess.run([python, "-c", "import vidur, os; print(os.path.dirname(vidur.__path__[0]))"],
                                         capture_output=True, text=True, check=True).stdout.strip())
        cmd = [python, "-m", "vidur.main", "--replica_config_device", "a100",
               "--replica_config_model_name", "meta-llama/Llama-2-70b-hf", "--cluster_config_num_replicas", "1",
               "--replica_config_tensor_parallel_size", "2", "--replica_config_num_pipeline_stages", "1",
               "--request_generator_config_type", "trace_replay",
               "--trace_request_generator_config_trace_file", str(trace),
               "--trace_request_generator_config_max_tokens", "4096",
               "--replica_scheduler_config_type", "vllm", "--vllm_scheduler_config_batch_size_cap", "128",
               "--vllm_scheduler_config_max_tokens_in_batch", "4096",
               "--metrics_config_output_dir", str(Path(tmp) / "out")]
        wall, rss, code, err = _child(cmd, vidur_root, dict(os.environ))
    return Measured(wall, rss, None, None, 19366, None if code == 0 else f"exit {code}: {err}")


def _scheduler_build(env: dict[str, str]) -> str:
    """Which scheduler build the children run (compiled or pure Python; SERVESIM_PURE_PYTHON=1 picks pure)."""
    res = subprocess.run([sys.executable, "-c", "from servesim._native import scheduler_mode; print(scheduler_mode())"],
                         cwd=ROOT, env=env, capture_output=True, text=True)
    return res.stdout.strip() or f"unknown ({res.stderr.strip()[-200:]})"


def _row(name: str, m: Measured, sim_s: float | None = None) -> str:
    if m.error:
        return f"{name:16s} failed after {m.wall_s:.1f} s: {m.error}"
    sim = m.sim_s if m.sim_s is not None else sim_s
    speed = f"{sim / m.wall_s:8.1f}x" if sim else "        -"
    engine = f"{sim / m.engine_wall_s:9.1f}x" if sim and m.engine_wall_s else "         -"
    steps = f"{m.num_steps / m.wall_s:9.0f}" if m.num_steps else "        -"
    return (f"{name:16s} {m.num_requests or 0:8d} {sim or 0:9.1f} {m.wall_s:9.2f} {speed} {engine} {steps} "
            f"{m.num_steps or 0:9d} {m.peak_rss_mib:8.0f}")


def main() -> int:
    names = [c.name for c in cases()]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", choices=names, help="cases to run (default: all with data present)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override, every case")
    ap.add_argument("--vidur-python", help="python of a venv with Vidur 0.0.26 installed (see the docstring)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    extra = [a for kv in args.set for a in ("--set", kv)]
    print(f"servesim sim speed on {platform.machine()} {platform.processor() or ''}, Python {platform.python_version()}"
          f", {os.cpu_count()} CPUs; whole process, one child per case; "
          f"overrides: {args.set or 'none'}")
    print(f"scheduler: {_scheduler_build(child_env())}")
    print(f"{'case':16s} {'requests':>8s} {'sim s':>9s} {'wall s':>9s} {'x real':>9s} {'engine x':>10s} {'steps/s':>9s} "
          f"{'steps':>9s} {'RSS MiB':>8s}")
    figures: dict[str, dict] = {}
    for case in cases():
        if args.only and case.name not in args.only:
            continue
        if case.needs is not None and not case.needs.exists():
            print(f"{case.name:16s} skipped ({case.needs} not found)")
            continue
        m = run_servesim(case, extra)
        print(_row(case.name, m), flush=True)
        figures[case.name] = {f: getattr(m, f) for f in Measured.__slots__}
    costs = {name: f["wall_s"] / f["sim_s"] for name, f in figures.items() if not f["error"] and f["sim_s"]}
    for line in pair_lines(costs, "whole-process wall s per simulated s, one run each: pair them with "
                                  "farm-bench, or count instructions.py"):
        print(line)
    if args.vidur_python:
        m = run_vidur(args.vidur_python)
        sim_s = figures.get("vidur", {}).get("sim_s")  # Vidur's simulated span ~ ours on the same arrivals
        print(_row("vidur (Vidur)", m, sim_s), flush=True)
        figures["vidur_by_vidur"] = {f: getattr(m, f) for f in Measured.__slots__}
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
