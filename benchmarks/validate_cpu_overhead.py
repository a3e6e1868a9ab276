"""Microbenchmark: vLLM 0.19.1's own scheduler CPU time per engine step, to size cost_model.cpu_overhead.

    python benchmarks/validate_cpu_overhead.py [--out cpu_overhead.json]

Runs the real vLLM V1 ``AsyncScheduler`` (the 0.19 default) through the shared oracle driver
(/work/shared/tools/vllm_oracle, venv $VLLM_ORACLE_VENV, default /tmp/vllm-oracle-venv) on
synthetic workloads that hold the batch at a fixed size (decode-dominated) or fill the token budget
with prefill chunks, reads the driver's mean ``schedule()`` + ``update_from_output()`` wall time,
and fits ``fixed + per_request * requests + per_token * tokens`` per step by least squares over the
runs (the mean of a linear cost is the same linear function of the mean step shape).

This measures the engine-core scheduling work only: the model runner's input preparation and the
sampler's CPU side are not covered (no microbenchmark of them exists in our data), so the fit is a
lower bound of vLLM's per-step CPU time. No end-to-end latency is used.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# (requests, prompt tokens, output tokens, max_num_seqs)
CASES = [(1, 64, 256, 1), (8, 64, 256, 8), (32, 64, 256, 32), (128, 64, 256, 128), (256, 64, 256, 256),
         (48, 1984, 2, 256)]


def workload(n: int, prompt: int, out: int) -> list[dict]:
    return [{"req_id": f"r{i:05d}", "prompt_token_ids": [100 + (i * 7919 + j * 31) % 30000 for j in range(prompt)],
             "max_tokens": out, "arrival_step": 0, "priority": 0, "prefix_group": -1} for i in range(n)]


def run_case(venv: Path, oracle: Path, work: Path, n: int, prompt: int, out: int, seqs: int) -> dict:
    wl = work / f"w{n}_{prompt}.jsonl"
    wl.write_text("".join(json.dumps(r) + "\n" for r in workload(n, prompt, out)))
    trace = work / f"t{n}_{prompt}.jsonl"
    blocks = n * ((prompt + out) // 16 + 2) + 16
    res = subprocess.run([str(venv / "bin" / "python"), str(oracle / "drive.py"), "--workload-in", str(wl),
                          "--out", str(trace), "--max-num-seqs", str(seqs), "--num-blocks", str(blocks),
                          "--max-model-len", str(prompt + out + 16), "--async-scheduling"],
                         check=True, capture_output=True, text=True,
                         env=dict(os.environ, HF_HUB_OFFLINE="1", PYTHONHASHSEED="0"))
    summary = json.loads(res.stdout[res.stdout.index("{"):])
    steps = [json.loads(x) for x in trace.read_text().splitlines() if x]
    reqs = float(np.mean([len(s["num_scheduled_tokens"]) for s in steps]))
    toks = float(np.mean([s["total_num_scheduled_tokens"] for s in steps]))
    return {"requests": n, "prompt": prompt, "output": out, "max_num_seqs": seqs, "steps": summary["steps"],
            "mean_requests_per_step": reqs, "mean_tokens_per_step": toks,
            "schedule_ms": summary["schedule_mean_ms"], "update_ms": summary["update_from_output_mean_ms"],
            "step_ms": summary["schedule_mean_ms"] + summary["update_from_output_mean_ms"],
            "vllm_version": summary["vllm_version"]}


def fit(rows: list[dict]) -> dict:
    a = np.array([[1.0, r["mean_requests_per_step"], r["mean_tokens_per_step"]] for r in rows])
    y = np.array([r["step_ms"] * 1e-3 for r in rows])
    # Ordinary least squares: the large batches, where CPU time can exceed a GPU step, dominate.
    coef = _nnls(a, y)
    pred = a @ coef
    return {"fixed_s": float(coef[0]), "per_request_s": float(coef[1]), "per_token_s": float(coef[2]),
            "residual_ms": [round(1e3 * float(p - t), 3) for p, t in zip(pred, y)]}


def _nnls(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with non-negative coefficients (drop a negative one and refit)."""
    active = list(range(a.shape[1]))
    while True:
        coef = np.zeros(a.shape[1])
        sol, *_ = np.linalg.lstsq(a[:, active], y, rcond=None)
        coef[active] = sol
        neg = [i for i in active if coef[i] < 0]
        if not neg:
            return coef
        active.remove(neg[0])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    venv = Path(os.environ.get("VLLM_ORACLE_VENV", "/tmp/vllm-oracle-venv"))
    oracle_src = Path(os.environ.get("VLLM_ORACLE_DIR", ROOT.parent / "shared" / "tools" / "vllm_oracle"))
    if not (venv / "bin" / "python").exists() or not oracle_src.exists():
        print(f"needs the vLLM oracle venv ({venv}) and driver ({oracle_src}); see its README", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="servesim-cpu-"))
    try:
        shutil.copytree(oracle_src, work / "oracle")
        rows = []
        for case in CASES:
            r = run_case(venv, work / "oracle", work, *case)
            print(f"batch {r['mean_requests_per_step']:7.1f} req, {r['mean_tokens_per_step']:7.1f} tok/step: "
                  f"schedule {r['schedule_ms']:.3f} ms + update {r['update_ms']:.3f} ms", flush=True)
            rows.append(r)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {"what": "vLLM AsyncScheduler schedule()+update_from_output() CPU time per step",
              "machine_cpus": os.cpu_count(), "cases": rows, "fit": fit(rows)}
    print(json.dumps(result["fit"], indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
