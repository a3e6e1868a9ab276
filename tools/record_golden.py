"""Record golden traces with the live vLLM oracle (run with the oracle venv's python).

    /tmp/vllm-oracle-venv/bin/python tools/record_golden.py ORACLE_DIR OUT_DIR [seed [CONFIGS.json]]

For each config in golden_configs.py: OUT_DIR/<name>/{workload.jsonl, trace.jsonl.gz, config.json}.
One process imports vLLM once and calls the oracle driver's main() per config.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from golden_configs import GOLDEN_CONFIGS, TRACE_FLAGS, WORKLOAD_FLAGS  # noqa: E402


def argv_for(flags: dict) -> list[str]:
    out = []
    for k, v in flags.items():
        opt = "--" + k.replace("_", "-")
        if v is True:
            out.append(opt)
        elif isinstance(v, (list, tuple)):  # e.g. stop_token_ids
            out += [opt, ",".join(map(str, v))]
        elif v is not False:
            out += [opt, str(v)]
    return out


def main() -> int:
    oracle_dir, out_dir = sys.argv[1], sys.argv[2]
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    configs = GOLDEN_CONFIGS
    if len(sys.argv) > 4:  # a JSON file {name: flags} (used by tools/parity.py)
        with open(sys.argv[4]) as f:
            configs = json.load(f)
    sys.path.insert(0, oracle_dir)
    import drive  # the oracle driver

    for name, extra in configs.items():
        flags = dict(WORKLOAD_FLAGS, seed=seed, **extra)
        d = os.path.join(out_dir, name)
        os.makedirs(d, exist_ok=True)
        tmp_trace = os.path.join(d, "trace.jsonl")
        drive.main(argv_for(flags) + ["--workload-out", os.path.join(d, "workload.jsonl"), "--out", tmp_trace])
        with open(tmp_trace, "rb") as src, open(tmp_trace + ".gz", "wb") as raw:
            with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as dst:  # mtime 0: reproducible bytes
                shutil.copyfileobj(src, dst)
        os.remove(tmp_trace)
        cfg = {k: v for k, v in flags.items() if k in TRACE_FLAGS}
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump({"trace_flags": cfg, "workload_flags": flags, "oracle": "vllm 0.19.1"}, f, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
