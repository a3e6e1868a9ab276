"""What a report names beside its figures: the model, GPU, trace, engine, key settings and the
servesim build that produced the run (its config.yaml and run.json)."""

from __future__ import annotations

from pathlib import Path


def _read(folder: Path) -> tuple[dict, dict]:
    import json

    import yaml

    cfg, ident = {}, {}
    try:
        cfg = yaml.safe_load((folder / "config.yaml").read_text()) or {}
        ident = json.loads((folder / "run.json").read_text())
    except (OSError, ValueError, yaml.YAMLError):  # an older result: name what there is
        pass
    return (cfg if isinstance(cfg, dict) else {}), (ident if isinstance(ident, dict) else {})


def run_context(folder: str | Path) -> str:
    """One line, e.g. "llama-3.1-8b on h100 (TP 1, PP 1), vllm 0.19.1 engine; trace sharegpt-300
    (first 100); max_num_seqs 256, max_num_batched_tokens 2048, 27997 KV blocks; seed 0; servesim
    0.1.0 (commit 02d0a77, local changes)". Parts a result does not record are left out."""
    cfg, ident = _read(Path(folder))
    hw, sched, cache = cfg.get("hardware") or {}, cfg.get("scheduler") or {}, cfg.get("cache") or {}
    wl = cfg.get("workload") or {}
    parts = []
    if hw:
        parts.append(f"{hw.get('model')} on {hw.get('gpu')} (TP {hw.get('tp', 1)}, PP {hw.get('pp', 1)}), "
                     f"{cfg.get('engine', 'vllm')} {cfg.get('engine_version', '')} engine".replace(" engine", " engine")
                     .replace("  ", " "))
    if wl:
        source = wl.get("trace") or wl.get("generator") or "?"
        extra = [f"first {wl['max_requests']}"] if wl.get("max_requests") else []
        extra += [f"rate x{wl['rate_scale']:g}"] if wl.get("rate_scale") else []
        parts.append(f"trace {Path(str(source)).name}" + (f" ({', '.join(extra)})" if extra else ""))
    if sched:
        blocks = cache.get("num_gpu_blocks")
        parts.append(f"max_num_seqs {sched.get('max_num_seqs')}, max_num_batched_tokens "
                     f"{sched.get('max_num_batched_tokens')}" + (f", {blocks} KV blocks" if blocks else ""))
    if "seed" in cfg:
        parts.append(f"seed {cfg['seed']}")
    build = ident.get("servesim") or {}
    if build:
        commit = (build.get("commit") or "")[:7]
        parts.append(f"servesim {build.get('version')}" + (f" (commit {commit}"
                                                          + (", local changes" if build.get("local_changes") else "")
                                                          + ")" if commit else ""))
    return "; ".join(parts)
