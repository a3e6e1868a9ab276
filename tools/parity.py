"""`make parity`: fresh random workloads and configs, our scheduler vs the live vLLM oracle.

Every config draws a base (pool, budget, policy, caching, chunking, async, arrivals) and one entry
of the feature matrix (FEATURES: speculative decoding by method, stop rules, aborts of every kind,
sliding window, hybrid groups, LoRA, cache salt, the KV connector, the OffloadingConnector's CPU
tier (tools/offload_oracle.py), Mamba / chunked-local / sink groups (tools/kv_groups_oracle.py),
grammar and streaming-input waits (tools/blocked_oracle.py), multimodal requests with the encoder
budget and cache (tools/encoder_oracle.py), and combinations) with random
parameters; configs cycle through the matrix, so `--configs 2 * len(FEATURES)` covers each
feature twice. The oracle runs with PYTHONHASHSEED=0, the seed our set-order replay assumes
(scheduler/pyset.py).

Uses the oracle venv at $VLLM_ORACLE_VENV (default /tmp/vllm-oracle-venv; build it with
../shared/tools/vllm_oracle/setup.sh). Prints the share of matching steps per config and per
feature and exits 1 on any mismatch. Skips (exit 0) with a message when the oracle venv is absent.

    python tools/parity.py [--seed S] [--configs N] [--features spec_eagle,aborts,...]
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
from servesim.scheduler.oracle_trace import StepTraceConfig, run_step_trace  # noqa: E402


def _spec(method: str):
    def draw(rng: random.Random) -> dict:
        return {"num_spec_tokens": rng.choice([1, 2, 3, 5]), "spec_method": method}
    return draw


def _stop(rng: random.Random) -> dict:
    return {"eos_rate": rng.choice([0.0, 0.01, 0.05]), "stop_token_ids": rng.sample([5, 6, 7, 8, 9], rng.randint(1, 3)),
            "stop_rate": rng.choice([0.01, 0.04]), "min_tokens": rng.choice([0, 4, 20])}


def _aborts(rng: random.Random) -> dict:
    return {"abort_rate": rng.choice([0.2, 0.5]), "abort_window": rng.choice([1, 5, 50, 200]),
            "abort_after": rng.choice([0, 3, 25])}


def _sliding(rng: random.Random) -> dict:
    return {"sliding_window": rng.choice([16, 48, 64, 128, 300]), "trace_block_tables": rng.random() < 0.5}


def _kv(rng: random.Random) -> dict:
    return {"kv_connector_rate": rng.choice([0.3, 0.7, 1.0]), "kv_load_steps": rng.choice([1, 3, 8])}


def _offload(rng: random.Random) -> dict:
    # offload_block_size is set from the drawn GPU block size in random_config
    return {"offload_cpu_blocks": rng.choice([4, 16, 48, 200]), "offload_eviction_policy": rng.choice(["lru", "arc"]),
            "offload_load_steps": rng.choice([0, 1, 3, 6]), "offload_store_steps": rng.choice([1, 2, 5]),
            "offload_store_threshold": rng.choice([0, 0, 2, 3])}  # vLLM filters stores from 2


def _mamba(rng: random.Random) -> dict:
    # the mode decides prefix caching (vLLM: 'none' exactly when it is off); random_config fixes
    # what align mode refuses (chunked prefill off, a threshold below the block size)
    mode = rng.choice(["none", "align", "all"])
    groups = rng.choice(["full,mamba", "mamba,full", "full,mamba,mamba", "mamba", "full,sliding_window:64,mamba"])
    return {"groups": groups, "mamba_cache_mode": mode, "no_prefix_caching": mode == "none"}


def _chunked_local(rng: random.Random) -> dict:
    return {"groups": rng.choice(["full,chunked_local:64", "chunked_local:128,full", "chunked_local:32",
                                  "full,chunked_local:64,sliding_window:48"])}


def _sink(rng: random.Random) -> dict:
    return {"groups": rng.choice(["sink_full:32", "sink_full:64,sliding_window:64", "full,sink_full:32"])}


def _encoder(rng: random.Random) -> dict:
    """Multimodal requests (tools/encoder_oracle.py): images of the drawn lengths, a budget and cache
    from one item to many (random_config keeps every item within both)."""
    lengths = sorted(rng.sample([8, 16, 33, 64, 100, 144, 200, 256], rng.randint(1, 4)))
    return {"encoder_budget": rng.choice([64, 256, 512, 2048]), "encoder_cache_size": rng.choice([64, 300, 700, 4096]),
            "mm_lengths": ",".join(map(str, lengths)), "mm_max_items": rng.choice([1, 2, 3, 4]),
            "mm_num_images": rng.choice([3, 12, 40]), "disable_chunked_mm_input": rng.random() < 0.25}


def _encoder_decoder(rng: random.Random) -> dict:
    """An encoder-decoder model (tools/encoder_oracle.py --encoder-decoder): one encoder input per
    request, with what vLLM forces for such a model (no chunked prefill, no prefix caching)."""
    lengths = sorted(rng.sample([16, 48, 100, 200, 320, 500], rng.randint(1, 4)))
    return {"encoder_decoder": True, "encoder_budget": rng.choice([320, 512, 1024, 2048]),
            "encoder_cache_size": rng.choice([320, 700, 1500, 4096]), "mm_lengths": ",".join(map(str, lengths)),
            "disable_chunked_mm_input": True, "no_chunked_prefill": True, "no_prefix_caching": True,
            "long_prefill_token_threshold": 0}


# feature name -> parameters drawn for it (merged over the base config)
FEATURES = {
    "base": lambda rng: {},
    "spec_ngram": _spec("ngram"),
    "spec_eagle": _spec("eagle"),
    "spec_draft_model": _spec("draft_model"),
    "stop_rules": _stop,
    "stop_rules_spec": lambda rng: dict(_stop(rng), **_spec(rng.choice(["ngram", "eagle"]))(rng)),
    "aborts": _aborts,
    "aborts_many_running": lambda rng: {"abort_rate": rng.choice([0.3, 0.6]), "abort_after": rng.choice([5, 25]),
                                        "abort_window": 1},
    "aborts_preempted": lambda rng: {"abort_preempted_rate": rng.choice([0.3, 1.0]),
                                     "abort_rate": rng.choice([0.0, 0.2])},
    "sliding_window": _sliding,
    "sliding_window_spec": lambda rng: dict(_sliding(rng), **_spec(rng.choice(["eagle", "draft_model"]))(rng)),
    "hybrid": lambda rng: dict(_sliding(rng), hybrid=True),
    "lora": lambda rng: {"num_loras": rng.choice([1, 3, 6]), "max_loras": rng.choice([1, 2, 4])},
    "cache_salt": lambda rng: {"cache_salt": rng.choice([1, 2, 5])},
    "kv_connector": _kv,
    "kv_connector_aborts": lambda rng: dict(_kv(rng), abort_rate=rng.choice([0.3, 0.6]), abort_after=rng.choice([0, 1, 4]),
                                            abort_window=rng.choice([1, 4, 20])),
    "kv_connector_sliding": lambda rng: dict(_kv(rng), sliding_window=rng.choice([32, 128])),
    "offload": _offload,
    "offload_aborts": lambda rng: dict(_offload(rng), abort_rate=rng.choice([0.2, 0.5]), abort_window=rng.choice([5, 50]),
                                       abort_preempted_rate=rng.choice([0.0, 0.5])),
    "mamba": _mamba,
    "mamba_spec": lambda rng: dict(_mamba(rng), **_spec(rng.choice(["eagle", "draft_model"]))(rng)),
    "chunked_local": _chunked_local,
    "sink_full": _sink,
    "grammar": lambda rng: {"grammar_rate": rng.choice([0.2, 0.5, 1.0]), "grammar_max_steps": rng.choice([0, 3, 10, 40])},
    "grammar_aborts": lambda rng: dict(_aborts(rng), grammar_rate=rng.choice([0.3, 0.7]),
                                       grammar_max_steps=rng.choice([2, 10])),
    "streaming_input": lambda rng: {"streaming_rate": rng.choice([0.2, 0.5, 1.0]), "stream_gap": rng.choice([1, 10, 60])},
    "streaming_input_aborts": lambda rng: dict(_aborts(rng), streaming_rate=rng.choice([0.3, 0.6]),
                                               stream_gap=rng.choice([5, 30]), grammar_rate=rng.choice([0.0, 0.4])),
    "encoder": _encoder,
    "encoder_eagle": lambda rng: dict(_encoder(rng), **_spec("eagle")(rng)),
    "encoder_aborts": lambda rng: dict(_encoder(rng), **_aborts(rng), abort_preempted_rate=rng.choice([0.0, 0.5])),
    "encoder_decoder": _encoder_decoder,
    "encoder_decoder_aborts": lambda rng: dict(_encoder_decoder(rng), **_aborts(rng),
                                               abort_preempted_rate=rng.choice([0.0, 0.5])),
    "everything": lambda rng: dict(_stop(rng), **_aborts(rng), **_spec("eagle")(rng), num_loras=3, max_loras=2,
                                   cache_salt=2, abort_preempted_rate=0.3),
}


MAX_STEPS = 20_000


def random_config(rng: random.Random, feature: str = "base") -> dict:
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
    cfg.update(FEATURES[feature](rng))
    # Both sides stop here: some draws livelock in vLLM itself (e.g. a small pool filled by requests
    # parked for remote KV, with no prefix caching), and we match that step for step.
    cfg["max_steps"] = MAX_STEPS
    if cfg.get("spec_method") == "ngram" and cfg.get("num_spec_tokens"):
        cfg["async_scheduling"] = False  # vLLM refuses async scheduling with ngram
    if cfg.get("kv_connector_rate"):
        cfg.pop("hybrid", None)  # the connector supports one KV cache group
    if cfg.get("offload_cpu_blocks"):  # needs prefix caching (config.py); offload blocks of 1-3 GPU blocks
        cfg["no_prefix_caching"] = False
        cfg["offload_block_size"] = cfg["block_size"] * rng.choice([1, 2, 3])
    if cfg.get("spec_method") == "draft_model" and cfg.get("num_spec_tokens"):
        cfg["no_chunked_prefill"] = False  # the budget loses max_num_seqs: prompts must chunk
        cfg["max_num_batched_tokens"] = max(cfg["max_num_batched_tokens"], cfg["max_num_seqs"] + 256)
    if cfg.get("mamba_cache_mode") == "align":  # vLLM's align-mode refusals
        cfg["no_chunked_prefill"] = False
        if 0 < cfg["long_prefill_token_threshold"] < cfg["block_size"]:
            cfg["long_prefill_token_threshold"] = 0
    if cfg.get("groups") and "chunked_local" in cfg["groups"] and cfg.get("spec_method") == "eagle":
        cfg["no_prefix_caching"] = True  # vLLM asserts on eagle with chunked local attention's lookups
    if cfg["no_chunked_prefill"]:
        cfg["max_num_batched_tokens"] = 2048  # must cover max_model_len
    longest_request = 1010
    if cfg.get("encoder_budget"):  # every image fits the budget, the cache and (unsplittable) one step
        longest_item = max(int(x) for x in cfg["mm_lengths"].split(","))
        cfg["encoder_budget"] = max(cfg["encoder_budget"], longest_item)
        cfg["encoder_cache_size"] = max(cfg["encoder_cache_size"], longest_item)
        longest_request += cfg.get("mm_max_items", 1) * longest_item  # encoder-decoder: one input
        if cfg["disable_chunked_mm_input"]:  # a cap below an item would stall it on both sides
            cfg["long_prefill_token_threshold"] = 0
    # Every request (<= 812 prompt + images + 160 output tokens + drafts) must fit in the pool, per group.
    groups = 2 if cfg.get("hybrid") else 1
    if cfg.get("groups"):
        groups = cfg["groups"].count(",") + 1 + 1  # (+1: sink blocks)
    if cfg.get("encoder_decoder"):
        groups = 2  # the decoder's and the cross-attention's
    cfg["num_blocks"] = max(cfg["num_blocks"], groups * (longest_request // cfg["block_size"] + 2))
    return cfg


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=random.SystemRandom().randrange(1 << 30))
    ap.add_argument("--configs", type=int, default=2 * len(FEATURES), help="default: each feature twice")
    ap.add_argument("--features", default=",".join(FEATURES), help="comma-separated subset of FEATURES")
    args = ap.parse_args()
    features = [f for f in args.features.split(",") if f]
    unknown = [f for f in features if f not in FEATURES]
    if unknown:
        ap.error(f"unknown features {unknown} (valid: {', '.join(FEATURES)})")
    venv = Path(os.environ.get("VLLM_ORACLE_VENV", "/tmp/vllm-oracle-venv"))
    oracle_dir = Path(os.environ.get("VLLM_ORACLE_DIR", ROOT.parent / "shared" / "tools" / "vllm_oracle"))
    if not (venv / "bin" / "python").exists():
        print(f"parity: skipped, no oracle venv at {venv} (run {oracle_dir}/setup.sh {venv})")
        return 0
    rng = random.Random(args.seed)
    configs = {}
    for i in range(args.configs):
        feature = features[i % len(features)]
        configs[f"cfg{i}_{feature}"] = random_config(rng, feature)
    work = Path(tempfile.mkdtemp(prefix="servesim-parity-"))
    # The driver needs a writable copy (its platform plugin is read-only in ../shared).
    drv = work / "oracle"
    shutil.copytree(oracle_dir, drv)
    (work / "configs.json").write_text(json.dumps(configs))
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONHASHSEED="0")
    print(f"parity: seed {args.seed}, {len(configs)} configs over {len(set(features))} features, "
          f"oracle {venv} (PYTHONHASHSEED=0)")
    subprocess.run([str(venv / "bin" / "python"), str(ROOT / "tools" / "record_golden.py"), str(drv),
                    str(work / "out"), str(args.seed), str(work / "configs.json")],
                   check=True, env=env, stdout=subprocess.DEVNULL)
    total = matched = 0
    failed = []
    per_feature: dict[str, list[int]] = {}
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
        agg = per_feature.setdefault(name.split("_", 1)[1], [0, 0])
        agg[0] += ok
        agg[1] += n
        capped = " (hit max_steps on both sides: vLLM livelocks too)" if len(expected) >= MAX_STEPS else ""
        print(f"  {name}: {ok}/{n} steps match{capped}  {cfg}")
        if ok != n:
            failed.append(name)
    for feature, (ok, n) in per_feature.items():
        print(f"  feature {feature}: {ok}/{n} steps")
    print(f"parity: {matched}/{total} steps match ({100.0 * matched / max(total, 1):.2f} %)")
    if failed:
        print(f"parity: mismatches in {failed}; artefacts kept in {work}")
        return 1
    shutil.rmtree(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
