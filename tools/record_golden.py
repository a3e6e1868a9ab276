"""Record golden traces with the live vLLM oracle (run with the oracle venv's python).

    /tmp/vllm-oracle-venv/bin/python tools/record_golden.py ORACLE_DIR OUT_DIR [seed [CONFIGS.json]]

For each config in golden_configs.py: OUT_DIR/<name>/{workload.jsonl, trace.jsonl.gz, config.json}.
One process imports vLLM once and calls the oracle driver's main() per config.

Pipeline parallelism: the driver has no flag for it (it builds ParallelConfig(pipeline_parallel_size=1)
and a batch queue of 2 with async scheduling, else 1). A config with `pipeline_parallel_size` N runs
the driver's own source with exactly those two lines changed: the real vLLM scheduler built with
ParallelConfig(pipeline_parallel_size=N) and a batch queue of N, vLLM 0.19's max_concurrent_batches
for PP with the V1 model runner (EngineCore.step_with_batch_queue). Nothing else of the driver changes.
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


# tools/blocked_oracle.py's own flags (the rest go to the shared driver).
BLOCKED_FLAGS = ("grammar_rate", "grammar_max_steps", "streaming_rate", "stream_gap")

_PP_LINES = ("ParallelConfig(pipeline_parallel_size=1)", "queue_depth = 2 if args.async_scheduling else 1")


def pp_driver(oracle_dir: str, pp: int):
    """The oracle driver's main() with N pipeline stages (see the module docstring)."""
    path = os.path.join(oracle_dir, "drive.py")
    with open(path) as f:
        src = f.read()
    for line in _PP_LINES:
        if src.count(line) != 1:
            raise SystemExit(f"{path}: expected exactly one {line!r}; the driver changed, update record_golden.py")
    src = src.replace(_PP_LINES[0], f"ParallelConfig(pipeline_parallel_size={pp})")
    src = src.replace(_PP_LINES[1], f"queue_depth = {pp}")
    module = {"__name__": f"drive_pp{pp}", "__file__": path}
    exec(compile(src, path, "exec"), module)  # noqa: S102 -- the oracle's own driver, two lines changed
    return module["main"]


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
        pp = flags.get("pipeline_parallel_size", 1)
        run = drive.main if pp == 1 else pp_driver(oracle_dir, pp)
        own_keys = ("pipeline_parallel_size", "groups", "mamba_cache_mode")
        own_prefixes = ("offload_", "encoder_", "mm_", "disable_chunked_mm_input")
        drive_flags = {k: v for k, v in flags.items() if k not in own_keys and not k.startswith(own_prefixes)
                       and k not in BLOCKED_FLAGS}
        argv = argv_for(drive_flags) + ["--workload-out", os.path.join(d, "workload.jsonl"), "--out", tmp_trace]
        offload = {k: v for k, v in flags.items() if k.startswith("offload_")}
        blocked = {k: v for k, v in flags.items() if k in BLOCKED_FLAGS}
        encoder = {k: v for k, v in flags.items() if k.startswith(("encoder_", "mm_", "disable_chunked_mm_input"))}
        if blocked:  # grammar / streaming-input waits around the same driver (tools/blocked_oracle.py)
            import blocked_oracle

            blocked_oracle.run(*blocked_oracle.parse_args(["--oracle-dir", oracle_dir, *argv_for(blocked), "--", *argv]))
        elif encoder:  # multimodal requests around the same driver (tools/encoder_oracle.py)
            import encoder_oracle

            own, _ = encoder_oracle.parse_args(["--oracle-dir", oracle_dir, *argv_for(encoder)])
            encoder_oracle.run(own, argv)
        elif offload:  # the OffloadingConnector around the same driver (tools/offload_oracle.py)
            import offload_oracle

            own, _ = offload_oracle.parse_args(["--oracle-dir", oracle_dir, *argv_for(offload)])
            offload_oracle.run(own, argv)
        elif flags.get("groups"):  # KV cache groups of any kinds (tools/kv_groups_oracle.py)
            import kv_groups_oracle

            own, _ = kv_groups_oracle.parse_args(["--oracle-dir", oracle_dir, *argv_for(
                {k: flags[k] for k in ("groups", "mamba_cache_mode") if k in flags})])
            kv_groups_oracle.run(own, argv)
        else:
            run(argv)
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
