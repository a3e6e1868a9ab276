"""The differential harness: every shipped input runs with and without the fast path, outputs compared byte for byte.

The fast path (simulator/fastpath/: a planner beside the engine) promises results identical to the
reference engine stepping one step at a time. `macro_steps: false` builds every engine without a
planner (simulator/build.py), so the two runs below are "no planner" and "planner" by construction.
This harness runs each shipped scenario (scenarios/*.yaml with their smoke settings,
scenarios/cluster/*.yaml), each bundled trace sample (traces/data/, async and sync loops) and each
golden workload (tests/golden/*/workload.jsonl, with the scheduler flags the engine understands)
twice, `macro_steps: true` and `false`, and compares requests.parquet and steps.parquet (and the
step trace, for the golden workloads) byte for byte. `tools/macro_diff.py` runs it from the
command line; tests/test_macro_steps.py runs a few cases in the fast layer and all of them slow.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMPARED = ("requests.parquet", "steps.parquet", "steps.jsonl")

# Golden-workload flags (the vLLM oracle's) the engine's config can express; the others (stop
# tokens, aborts, connectors, LoRA counts...) concern the oracle driver and are left out.
_GOLDEN_FLAGS: dict[str, Callable[[object], dict]] = {
    "async_scheduling": lambda v: {"scheduler.async_scheduling": bool(v)},
    "block_size": lambda v: {"cache.block_size": int(v)},
    "num_blocks": lambda v: {"cache.num_gpu_blocks": int(v)},
    "max_num_seqs": lambda v: {"scheduler.max_num_seqs": int(v)},
    "max_num_batched_tokens": lambda v: {"scheduler.max_num_batched_tokens": int(v)},
    "max_model_len": lambda v: {"scheduler.max_model_len": int(v)},
    "no_prefix_caching": lambda v: {"cache.enable_prefix_caching": not v},
    "no_chunked_prefill": lambda v: {"scheduler.enable_chunked_prefill": not v},
    "long_prefill_token_threshold": lambda v: {"scheduler.long_prefill_token_threshold": int(v)},
    "policy": lambda v: {"scheduler.policy": str(v)},
    # Multimodal goldens (tools/encoder_oracle.py): the oracle's budget and cache; its images all fit
    # both, so the largest item the engine is told to accept is the smaller of the two.
    "encoder_budget": lambda v: {"scheduler.max_num_encoder_input_tokens": int(v)},
    "encoder_cache_size": lambda v: {"scheduler.encoder_cache_size": int(v)},
    "disable_chunked_mm_input": lambda v: {"scheduler.disable_chunked_mm_input": bool(v)},
    # Encoder-decoder goldens: the oracle's layout (decoder self-attention + cross-attention groups).
    # Its prompts fit the drive's max_model_len (2048), which chunked prefill off needs within the budget.
    "encoder_decoder": lambda v: {"cache.attention": "groups", "scheduler.max_model_len": 2048,
                                  "cache.kv_cache_groups": [{"kind": "full", "block_size": 16},
                                                            {"kind": "cross_attention", "block_size": 16}]},
}
# Goldens whose workload only the oracle's replay reads: a streaming session is several lines of
# one req_id there, trace fields (input_chunk_offsets_s) in the simulator's formats.
_ORACLE_ONLY_FLAGS = ("streaming_rate",)
# What a multimodal golden needs whatever else the engine refuses (its images must be accepted).
_ENCODER_SETS = ("scheduler.max_num_encoder_input_tokens", "scheduler.encoder_cache_size",
                 "scheduler.disable_chunked_mm_input", "scheduler.mm_max_tokens_per_item")
# And what an encoder-decoder golden needs (its model's layout, and what vLLM forces for it).
_ENCODER_DECODER_SETS = ("cache.attention", "cache.kv_cache_groups", "scheduler.max_model_len",
                         "scheduler.enable_chunked_prefill", "cache.enable_prefix_caching")


@dataclass(slots=True)
class Case:
    name: str  # kind:identifier, e.g. "trace:sharegpt-llama-3.1-8b-300-sps10/sync"
    run: Callable[[Path, bool], None]  # (output folder, macro_steps) -> writes the result files there


@dataclass(slots=True)
class Outcome:
    name: str
    files: list[str]  # relative paths compared
    mismatches: list[str]  # relative paths whose bytes differ (or exist on one side only)

    @property
    def ok(self) -> bool:
        return bool(self.files) and not self.mismatches


def _replay(cfg_sets: dict, trace: Path | None, step_trace: bool = False, max_requests: int | None = None):
    """A replay; with step_trace also a second, traced run (a step trace records every step, so
    that run steps plainly either way: its comparison checks the fallback)."""
    def run(out: Path, macro: bool) -> None:
        from servesim.overrides import apply_overrides
        from servesim.running import load_trace, run as run_replay
        from servesim.simulator.config import SimConfig

        cfg = dataclasses.replace(apply_overrides(SimConfig(), cfg_sets), macro_steps=macro)
        wl = load_trace(trace, max_requests=max_requests)
        run_replay(cfg, wl, out_dir=out / "run")
        if step_trace:
            run_replay(cfg, wl, out_dir=out / "traced", step_trace=out / "steps.jsonl")
    return run


def _scenario(path: Path):
    def run(out: Path, macro: bool) -> None:
        from servesim.scenario import run_scenario

        run_scenario(path, out_dir=out / "sweep", smoke=True, sets={"macro_steps": macro})
    return run


def _cluster(path: Path, max_requests: int | None):
    def run(out: Path, macro: bool) -> None:
        from servesim.commands.cluster import load_cluster_workload, load_cluster_yaml
        from servesim.simulator.cluster import cluster_config_from_dict, run_cluster, write_cluster_results

        data, wl_spec = load_cluster_yaml(path)
        data.setdefault("base", {})["macro_steps"] = macro
        if max_requests is not None:
            wl_spec["max_requests"] = max_requests
        cfg = cluster_config_from_dict(data, str(path))
        wl = load_cluster_workload(wl_spec, None, base_dir=path.parent)
        write_cluster_results(out / "cluster", run_cluster(cfg, wl), {"name": wl.name})
    return run


def golden_sets(config_json: Path) -> dict:
    flags = json.loads(config_json.read_text()).get("trace_flags", {})
    sets: dict = {}
    for key, value in flags.items():
        if key in _GOLDEN_FLAGS and value is not None and value is not False:
            sets.update(_GOLDEN_FLAGS[key](value))
    if "cache.num_gpu_blocks" in sets:
        sets["derive_num_gpu_blocks"] = False
    if "scheduler.max_num_encoder_input_tokens" in sets:
        sets["scheduler.mm_max_tokens_per_item"] = min(sets["scheduler.max_num_encoder_input_tokens"],
                                                       sets.get("scheduler.encoder_cache_size", 1 << 62))
    return sets


def _simulator_reads(config_json: Path) -> bool:
    flags = json.loads(config_json.read_text()).get("trace_flags", {})
    return not any(flags.get(k) for k in _ORACLE_ONLY_FLAGS)


def cases(cluster_max_requests: int | None = 60) -> list[Case]:
    """Every shipped input, in a stable order."""
    out: list[Case] = []
    for path in sorted((ROOT / "scenarios").glob("*.yaml")):
        if not path.name.startswith("_"):
            out.append(Case(f"scenario:{path.stem}", _scenario(path)))
    for path in sorted((ROOT / "scenarios" / "cluster").glob("*.yaml")):
        out.append(Case(f"cluster:{path.stem}", _cluster(path, cluster_max_requests)))
    for path in sorted((ROOT / "traces" / "data").glob("*.jsonl.gz")):
        name = path.name.removesuffix(".jsonl.gz")
        out.append(Case(f"trace:{name}/async", _replay({}, path)))
        out.append(Case(f"trace:{name}/sync", _replay({"scheduler.async_scheduling": False}, path)))
        out.append(Case(f"trace:{name}/sglang", _replay({"engine": "sglang"}, path)))
        out.append(Case(f"trace:{name}/sglang-sync", _replay({"engine": "sglang",
                                                              "scheduler.async_scheduling": False}, path)))
    for folder in sorted((ROOT / "tests" / "golden").iterdir()):
        if (folder / "workload.jsonl").exists() and _simulator_reads(folder / "config.json"):
            out.append(Case(f"golden:{folder.name}", _golden(folder)))
    return out


def _golden(folder: Path):
    def run(out: Path, macro: bool) -> None:
        from servesim.traces.errors import InputError

        sets = golden_sets(folder / "config.json")
        try:
            _replay(sets, folder / "workload.jsonl", step_trace=True)(out, macro)
        except InputError:  # flags this engine refuses (e.g. a pool too small for max_model_len)
            needed = _ENCODER_SETS + (_ENCODER_DECODER_SETS if "cache.kv_cache_groups" in sets else ())
            kept = {k: v for k, v in sets.items() if k == "scheduler.async_scheduling" or k in needed}
            _replay({"scheduler.async_scheduling": True, **kept}, folder / "workload.jsonl", step_trace=True)(out, macro)
    return run


def compare(case: Case, work: Path) -> Outcome:
    """Run the case both ways under `work` and compare the result files byte for byte."""
    on, off = work / "macro", work / "plain"
    case.run(on, True)
    case.run(off, False)
    a, b = _result_files(on), _result_files(off)
    files = sorted(set(a) | set(b))
    bad = [f for f in files if not (f in a and f in b and a[f].read_bytes() == b[f].read_bytes())]
    return Outcome(case.name, files, bad)


def _result_files(folder: Path) -> dict[str, Path]:
    """Compared files by relative path, sweep variants' config hash dropped (the hash covers
    macro_steps, the one setting that differs)."""
    return {re.sub(r"-[0-9a-f]{12}(?=/)", "", str(p.relative_to(folder))): p
            for p in folder.rglob("*") if p.name in COMPARED}
