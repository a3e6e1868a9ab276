"""Drive the real vLLM 0.19.1 scheduler with KV cache groups of any kind (Mamba, chunked local, sink) as an oracle.

    HF_HUB_OFFLINE=1 PYTHONHASHSEED=0 /tmp/vllm-oracle-venv/bin/python tools/kv_groups_oracle.py \
        --groups full,mamba --mamba-cache-mode align -- \
        --num-blocks 300 --num-requests 120 --trace-block-tables --out trace.jsonl --workload-out workload.jsonl
    /tmp/vllm-oracle-venv/bin/python tools/kv_groups_oracle.py --record tests/golden [ORACLE_DIR]

Everything after `--` goes to the shared oracle driver (drive.py: workload, fake model runner, trace
schema), imported, not copied. This file changes what its scheduler is built with:

- `--groups`: the KVCacheConfig's groups, in order, comma-separated: `full`, `sliding_window:W`,
  `chunked_local:C` (attention_chunk_size C tokens), `sink_full:S` (sink_len S tokens), `mamba`.
  Attention groups get the drive's --block-size; a Mamba group gets it too with prefix caching on
  and max_model_len with it off (vLLM's MambaModelConfig: mamba_block_size = block_size, or
  max_model_len without prefix caching), and num_speculative_blocks = --num-spec-tokens (MambaBase:
  speculative_config.num_speculative_tokens).
- `--mamba-cache-mode`: CacheConfig.mamba_cache_mode before VllmConfig validates it (its align-mode
  checks run there); the OPT config the drive uses is no hybrid model, so the rules MambaModelConfig
  applies (mode 'none' iff prefix caching off, align needs chunked prefill) are checked here.

The fake model runner needs nothing more: the scheduler reads nothing of Mamba from the worker (the
align mode's state copies, GPUModelRunner's preprocess/postprocess_mamba, stay in the worker).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("PYTHONHASHSEED", "0")

KINDS = ("full", "sliding_window", "chunked_local", "sink_full", "mamba")


def parse_groups(text: str) -> list[tuple[str, int]]:
    """'full,chunked_local:64' -> [("full", 0), ("chunked_local", 64)] (the number: the kind's tokens)."""
    out = []
    for item in text.split(","):
        kind, _, num = item.strip().partition(":")
        if kind not in KINDS:
            raise ValueError(f"--groups: unknown kind {kind!r} (valid: {', '.join(KINDS)})")
        needs = kind in ("sliding_window", "chunked_local", "sink_full")
        if needs != bool(num):
            raise ValueError(f"--groups: {kind} {'needs' if needs else 'takes no'} ':TOKENS'")
        out.append((kind, int(num) if num else 0))
    return out


def make_specs(groups, block_size: int, mamba_block_size: int, mode: str, num_spec_blocks: int):
    import torch

    from vllm.v1.kv_cache_interface import (ChunkedLocalAttentionSpec, FullAttentionSpec, KVCacheGroupSpec,
                                            MambaSpec, SinkFullAttentionSpec, SlidingWindowSpec)

    attn = {"block_size": block_size, "num_kv_heads": 1, "head_size": 1, "dtype": torch.float32}
    out = []
    for i, (kind, num) in enumerate(groups):
        if kind == "full":
            spec = FullAttentionSpec(**attn)
        elif kind == "sliding_window":
            spec = SlidingWindowSpec(**attn, sliding_window=num)
        elif kind == "chunked_local":
            spec = ChunkedLocalAttentionSpec(**attn, attention_chunk_size=num)
        elif kind == "sink_full":
            spec = SinkFullAttentionSpec(**attn, sink_len=num)
        else:
            spec = MambaSpec(shapes=((1,),), dtypes=(torch.float32,), block_size=mamba_block_size,
                             mamba_cache_mode=mode, num_speculative_blocks=num_spec_blocks)
        out.append(KVCacheGroupSpec([f"layer_{i}_{kind}"], spec))
    return out


@contextlib.contextmanager
def group_configs(args, dargs):
    """VllmConfig gets the Mamba cache mode; KVCacheConfig the groups."""
    import vllm.config as vc
    import vllm.v1.kv_cache_interface as kci

    real_vllm, real_kvc = vc.VllmConfig, kci.KVCacheConfig
    caching = not dargs.no_prefix_caching
    mamba_bs = dargs.block_size if caching else dargs.max_model_len

    def vllm_config(**kw):
        kw["cache_config"].mamba_cache_mode = args.mamba_cache_mode
        if caching:
            kw["cache_config"].mamba_block_size = mamba_bs
        return real_vllm(**kw)

    def kv_cache_config(num_blocks, kv_cache_tensors, kv_cache_groups):
        groups = make_specs(args.groups, dargs.block_size, mamba_bs, args.mamba_cache_mode, dargs.num_spec_tokens)
        return real_kvc(num_blocks=num_blocks, kv_cache_tensors=kv_cache_tensors, kv_cache_groups=groups)

    vc.VllmConfig, kci.KVCacheConfig = vllm_config, kv_cache_config
    try:
        yield
    finally:
        vc.VllmConfig, kci.KVCacheConfig = real_vllm, real_kvc


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--oracle-dir", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared",
                                                        "tools", "vllm_oracle"))
    p.add_argument("--groups", required=True, help="e.g. full,mamba | full,chunked_local:64 | sink_full:32")
    p.add_argument("--mamba-cache-mode", choices=["none", "align", "all"], default="none")
    if "--" in argv:
        i = argv.index("--")
        own, rest = argv[:i], argv[i + 1:]
    else:
        own, rest = argv, []
    args = p.parse_args(own)
    try:
        args.groups = parse_groups(args.groups)
    except ValueError as e:
        p.error(str(e))
    return args, rest


def check(args, dargs) -> None:
    """MambaModelConfig's rules (the drive's OPT config never reaches them)."""
    if any(k == "mamba" for k, _ in args.groups):
        caching = not dargs.no_prefix_caching
        if caching == (args.mamba_cache_mode == "none"):
            raise SystemExit("mamba: mode 'none' exactly when prefix caching is off (vLLM's MambaModelConfig)")
        if args.mamba_cache_mode == "align" and dargs.no_chunked_prefill:
            raise SystemExit("Chunked prefill is required for mamba cache mode 'align'.")
    if dargs.sliding_window or dargs.hybrid:
        raise SystemExit("give sliding windows as --groups sliding_window:W, not drive.py's --sliding-window")


def run(args, drive_argv: list[str]) -> int:
    sys.path.insert(0, os.path.abspath(args.oracle_dir))
    import drive  # the shared oracle driver

    dargs = drive.parse_args(drive_argv)
    check(args, dargs)
    real_build = drive.build_scheduler

    def build(dargs_):
        with group_configs(args, dargs_):
            return real_build(dargs_)

    drive.build_scheduler = build
    try:
        return drive.main(drive_argv)
    finally:
        drive.build_scheduler = real_build


def groups_text(groups) -> str:
    return ",".join(k if not n else f"{k}:{n}" for k, n in groups)


# Golden configs (tests/golden/<name>/): ~120 requests each; small pools so preemption happens.
# Own flags (groups, mamba_cache_mode) + drive.py flags, by StepTraceConfig name.
_B = {"num_requests": 120, "num_prefixes": 6, "trace_block_tables": True}
GOLDEN = {
    "mamba_align": {"groups": "full,mamba", "mamba_cache_mode": "align", "num_blocks": 400, **_B},
    "mamba_align_async_small": {"groups": "full,mamba", "mamba_cache_mode": "align", "num_blocks": 160,
                                "async_scheduling": True, "arrival_spread": 60, **_B},
    "mamba_align_eagle": {"groups": "full,mamba", "mamba_cache_mode": "align", "num_blocks": 300,
                          "num_spec_tokens": 2, "spec_method": "eagle", **_B},
    "mamba_all": {"groups": "full,mamba", "mamba_cache_mode": "all", "num_blocks": 400, **_B},
    "mamba_all_async_small_priority": {"groups": "full,mamba,mamba", "mamba_cache_mode": "all", "num_blocks": 200,
                                       "async_scheduling": True, "policy": "priority", **_B},
    "mamba_none": {"groups": "full,mamba", "mamba_cache_mode": "none", "no_prefix_caching": True,
                   "num_blocks": 160, **_B},
    "mamba_none_async_eagle": {"groups": "full,mamba", "mamba_cache_mode": "none", "no_prefix_caching": True,
                               "num_blocks": 200, "async_scheduling": True, "num_spec_tokens": 2,
                               "spec_method": "eagle", **_B},
    "chunked_local": {"groups": "full,chunked_local:64", "num_blocks": 400, **_B},
    "chunked_local_async_small": {"groups": "full,chunked_local:128", "num_blocks": 200, "async_scheduling": True,
                                  "arrival_spread": 60, **_B},
    "sink_full": {"groups": "sink_full:32", "num_blocks": 200, **_B},
    "sink_full_async_sliding": {"groups": "sink_full:32,sliding_window:64", "num_blocks": 250,
                                "async_scheduling": True, **_B},
}


def record(out_dir: str, oracle_dir: str, only: tuple[str, ...] = ()) -> int:
    """Write OUT_DIR/<name>/{workload.jsonl, trace.jsonl.gz, config.json} for every GOLDEN config."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from oracle_record import record_goldens

    return record_goldens(out_dir, oracle_dir, GOLDEN, is_own=lambda k: k in ("groups", "mamba_cache_mode"),
                          parse_args=parse_args, run=run, only=only,
                          oracle="vllm 0.19.1 with KV cache groups (tools/kv_groups_oracle.py)")



def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--record":  # --record OUT_DIR [ORACLE_DIR]
        return record(argv[1], argv[2] if len(argv) > 2 else parse_args(["--groups", "full"])[0].oracle_dir)
    args, rest = parse_args(argv)
    return run(args, rest)


if __name__ == "__main__":
    sys.exit(main())
