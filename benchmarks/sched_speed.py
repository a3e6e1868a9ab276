"""Mean schedule() / update_from_output() time: ours next to real vLLM 0.19.1's on the same workload.

    python benchmarks/sched_speed.py [--num-requests 300] [--num-blocks 1000] [--repeat 3]

The workload comes from the oracle driver's generator (tests/golden/*/workload.jsonl when the oracle
is absent). vLLM's figures come from the oracle driver's own timing summary when its venv exists
($VLLM_ORACLE_VENV, default /tmp/vllm-oracle-venv).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from servesim._native import scheduler_mode  # noqa: E402
from servesim.scheduler import ModelRunnerOutput, Request, SamplingParams, make_scheduler  # noqa: E402
from servesim.scheduler.oracle_trace import StepTraceConfig, oracle_token  # noqa: E402


def time_ours(workload: list[dict], cfg: StepTraceConfig) -> tuple[float, float, int]:
    """Same loop as the oracle driver, timing only schedule() and update_from_output()."""
    sc, cc = cfg.configs()
    s = make_scheduler(sc, cc)
    pending = sorted(workload, key=lambda w: w["arrival_step"])
    pos, step, n_out = 0, 0, {}
    t_sched = t_upd = 0.0
    steps = 0
    while True:
        while pos < len(pending) and pending[pos]["arrival_step"] <= step:
            w = pending[pos]
            pos += 1
            s.add_request(Request(w["req_id"], w["prompt_token_ids"], SamplingParams(max_tokens=w["max_tokens"], ignore_eos=True),
                                  arrival_time=float(w["arrival_step"]), priority=w.get("priority", 0),
                                  block_hasher=s.block_hasher))
            n_out[w["req_id"]] = 0
        if not s.has_unfinished_requests():
            if pos >= len(pending):
                break
            step += 1
            continue
        t0 = time.perf_counter()
        out = s.schedule()
        t_sched += time.perf_counter() - t0
        ids = list(out.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            if s.requests[rid].is_prefill_chunk:
                sampled.append([])
            else:
                sampled.append([oracle_token(rid, n_out[rid])])
                n_out[rid] += 1
        mro = ModelRunnerOutput(ids, {r: i for i, r in enumerate(ids)}, sampled)
        t0 = time.perf_counter()
        s.update_from_output(out, mro)
        t_upd += time.perf_counter() - t0
        steps += 1
        step += 1
    return 1e3 * t_sched / steps, 1e3 * t_upd / steps, steps


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--num-requests", type=int, default=300)
    ap.add_argument("--num-blocks", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    venv = Path(os.environ.get("VLLM_ORACLE_VENV", "/tmp/vllm-oracle-venv"))
    oracle_dir = Path(os.environ.get("VLLM_ORACLE_DIR", ROOT.parent / "shared" / "tools" / "vllm_oracle"))
    cfg = StepTraceConfig(num_blocks=args.num_blocks)
    vllm = None
    if (venv / "bin" / "python").exists():
        work = Path(tempfile.mkdtemp(prefix="servesim-bench-"))
        shutil.copytree(oracle_dir, work / "oracle")
        res = subprocess.run(
            [str(venv / "bin" / "python"), str(work / "oracle" / "drive.py"), "--num-requests", str(args.num_requests),
             "--num-blocks", str(args.num_blocks), "--workload-out", str(work / "w.jsonl"), "--out", str(work / "t.jsonl")],
            check=True, capture_output=True, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1", PYTHONHASHSEED="0"))
        vllm = json.loads(res.stdout[res.stdout.index("{"):])
        workload = [json.loads(x) for x in (work / "w.jsonl").read_text().splitlines() if x]
        shutil.rmtree(work)
    else:
        print(f"(no oracle venv at {venv}: showing ours only, on the golden fcfs_default workload)")
        workload = [json.loads(x) for x in (ROOT / "tests/golden/fcfs_default/workload.jsonl").read_text().splitlines() if x]
    best = min((time_ours(workload, cfg) for _ in range(args.repeat)), key=lambda r: r[0])
    print(f"workload: {len(workload)} requests, {best[2]} steps, {args.num_blocks} blocks; scheduler: {scheduler_mode()}")
    print(f"servesim   schedule() mean {best[0]:.4f} ms   update_from_output() mean {best[1]:.4f} ms")
    if vllm is not None:
        print(f"vLLM 0.19.1 schedule() mean {vllm['schedule_mean_ms']:.4f} ms   "
              f"update_from_output() mean {vllm['update_from_output_mean_ms']:.4f} ms   ({vllm['steps']} steps)")
        print(f"speed-up   schedule() {vllm['schedule_mean_ms'] / best[0]:.2f}x   "
              f"update_from_output() {vllm['update_from_output_mean_ms'] / best[1]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
