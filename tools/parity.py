"""`make parity`: fresh random workloads and configs, our scheduler vs the live vLLM oracle.

Uses the oracle venv at $VLLM_ORACLE_VENV (default /tmp/vllm-oracle-venv; build it with
../shared/tools/vllm_oracle/setup.sh). Prints the share of matching steps per config and exits 1
on any mismatch. Skips (exit 0) with a message when the oracle venv is absent.

    python tools/parity.py [--seed S] [--configs N]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from scheduler.steptrace import StepTraceConfig, run_step_trace  # noqa: E402


def random_config(rng: random.Random) -> dict:
    cfg = {
        "num_blocks": rng.choice([120, 160, 250, 400, 1000]),
        "block_size": rng.choice([8, 16, 32]),
        "max_num_batched_tokens": rng.choice([512, 1024, 2048]),
        "max_num_seqs": rng.choice([8, 32, 256]),
        "policy": rng.choice(["fcfs", "priority"]),
        "no_prefix_caching": rng.random() < 0.25,
        "no_chunked_prefill": rng.random() < 0.2,
        "async_scheduling": rng.random() < 0.4,
        "long_prefill_token_threshold": rng.choice([0, 0, 64, 256]),
        "arrival_spread": rng.choice([0, 50, 200]),
        "num_requests": rng.choice([40, 80, 120]),
        "num_prefixes": rng.choice([2, 6, 10]),
    }
    if cfg["no_chunked_prefill"]:
        cfg["max_num_batched_tokens"] = 2048  # must cover max_model_len
    # Every request (<= 812 prompt + 160 output tokens) must fit in the pool.
    cfg["num_blocks"] = max(cfg["num_blocks"], 1000 // cfg["block_size"] + 2)
    return cfg


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=random.SystemRandom().randrange(1 << 30))
    ap.add_argument("--configs", type=int, default=8)
    args = ap.parse_args()
    venv = Path(os.environ.get("VLLM_ORACLE_VENV", "/tmp/vllm-oracle-venv"))
    oracle_dir = Path(os.environ.get("VLLM_ORACLE_DIR", ROOT.parent / "shared" / "tools" / "vllm_oracle"))
    if not (venv / "bin" / "python").exists():
        print(f"parity: skipped, no oracle venv at {venv} (run {oracle_dir}/setup.sh {venv})")
        return 0
    rng = random.Random(args.seed)
    configs = {f"cfg{i}": random_config(rng) for i in range(args.configs)}
    work = Path(tempfile.mkdtemp(prefix="servesim-parity-"))
    # The driver needs a writable copy (its platform plugin is read-only in ../shared).
    drv = work / "oracle"
    shutil.copytree(oracle_dir, drv)
    (work / "configs.json").write_text(json.dumps(configs))
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONHASHSEED="0")
    print(f"parity: seed {args.seed}, {len(configs)} configs, oracle {venv}")
    subprocess.run([str(venv / "bin" / "python"), str(ROOT / "tools" / "record_golden.py"), str(drv),
                    str(work / "out"), str(args.seed), str(work / "configs.json")],
                   check=True, env=env, stdout=subprocess.DEVNULL)
    total = matched = 0
    failed = []
    for name, cfg in configs.items():
        d = work / "out" / name
        workload = [json.loads(x) for x in (d / "workload.jsonl").read_text().splitlines() if x]
        with gzip.open(d / "trace.jsonl.gz", "rt") as f:
            expected = [json.loads(x) for x in f if x.strip()]
        flags = json.loads((d / "config.json").read_text())["trace_flags"]
        ours = list(run_step_trace(workload, StepTraceConfig(**flags)))
        ok = sum(1 for a, b in zip(ours, expected) if a == b and list(a["num_scheduled_tokens"]) == list(b["num_scheduled_tokens"]))
        n = max(len(ours), len(expected))
        total += n
        matched += ok
        print(f"  {name}: {ok}/{n} steps match  {cfg}")
        if ok != n:
            failed.append(name)
    print(f"parity: {matched}/{total} steps match ({100.0 * matched / max(total, 1):.2f} %)")
    if failed:
        print(f"parity: mismatches in {failed}; artefacts kept in {work}")
        return 1
    shutil.rmtree(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
