"""Regenerate the shipped calibrated cost models from the shared GPU profiles.

    python -m servesim.simulator.cost_model.calibrated.build [--profiles /work/shared/data/gpu_profiles]

For every CATALOG entry: import the listed profile folders/files (``load_profiles``), ``fit`` them
for (model, gpu, tp) exactly as ``servesim fit`` does, compact the result (floats rounded to
5 significant digits, gzip) and write ``<model>__<gpu>__tp<N>.json.gz`` plus ``index.json``.
Only profiles are used: no end-to-end latency enters any file.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
from pathlib import Path

DEFAULT_PROFILES = Path("/work/shared/data/gpu_profiles")
OUT = Path(__file__).resolve().parent

_LSS = "llmservingsim/vllm_0.19_profiler"
_AIC_H100 = ["aiconfigurator/h100_sxm/vllm_0.14.0", "aiconfigurator/h100_sxm/nccl_2.29.2"]
_AIC_A100 = ["aiconfigurator/a100_sxm/vllm_0.14.0", "aiconfigurator/a100_sxm/nccl_2.27.3"]
# vLLM 0.24's fp8 activation-quantisation tables (scale_matrix_perf, read with its sibling
# computescale_perf): only these two files of that folder, whose GEMMs are another version's
_AIC_H100_QUANT = "aiconfigurator/h100_sxm/vllm_0.24.0/scale_matrix_perf.csv.gz"
_AIC_H200 = ["aiconfigurator/h200_sxm/vllm_0.24.0", "aiconfigurator/h200_sxm/nccl_2.29.2"]

# (model, gpu, tp, profile paths relative to the profiles root, why this source)
CATALOG: list[tuple[str, str, int, list[str], str]] = [
    ("llama-3.1-8b", "rtx-pro-6000", 1, [f"{_LSS}/RTXPRO6000/meta-llama/Llama-3.1-8B/bf16/tp1"],
     "vLLM 0.19 per-layer profile of this model (mixed prefill+decode attention grid)"),
    ("llama-3.1-8b", "rtx4090", 1, [f"{_LSS}/RTX4090/meta-llama/Llama-3.1-8B/bf16/tp1"],
     "vLLM 0.19 per-layer profile of this model (mixed prefill+decode attention grid)"),
    ("qwen3-32b", "rtx-pro-6000", 2, [f"{_LSS}/RTXPRO6000/Qwen/Qwen3-32B/bf16/tp2"],
     "vLLM 0.19 per-layer profile at TP2; all-reduce not measured there: filled from the "
     "aiconfigurator RTX PRO 6000 collective tables (vLLM custom all-reduce < 8 MiB, NCCL above)"),
    ("llama-3.1-8b", "h100", 1, _AIC_H100[:1], "aiconfigurator vLLM 0.14 kernels (GEMM, attention)"),
    ("llama-3.1-8b", "a100-80gb", 1, _AIC_A100[:1], "aiconfigurator vLLM 0.14 kernels"),
    ("llama-3.1-8b", "h200", 1, _AIC_H200[:1], "aiconfigurator vLLM 0.24 kernels"),
    ("llama-3.1-70b", "h100", 2, _AIC_H100, "aiconfigurator vLLM 0.14 kernels + custom all-reduce/NCCL"),
    ("llama-3.1-70b", "h100", 4, _AIC_H100, "aiconfigurator vLLM 0.14 kernels + custom all-reduce/NCCL"),
    ("llama-3.1-70b", "h100", 8, _AIC_H100, "aiconfigurator vLLM 0.14 kernels + custom all-reduce/NCCL"),
    ("llama-3.1-70b", "a100-80gb", 4, _AIC_A100, "aiconfigurator vLLM 0.14 kernels + custom all-reduce/NCCL"),
    ("qwen3-32b", "h100", 2, _AIC_H100, "aiconfigurator vLLM 0.14 kernels + custom all-reduce/NCCL"),
    ("qwen3-32b", "h100", 4, _AIC_H100, "aiconfigurator vLLM 0.14 kernels + custom all-reduce/NCCL"),
    ("qwen3-32b", "h100", 8, _AIC_H100, "aiconfigurator vLLM 0.14 kernels + custom all-reduce/NCCL"),
] + [(m, "h100", tp, _AIC_H100 if tp > 1 else _AIC_H100[:1],
       "aiconfigurator vLLM 0.14 kernels (GEMM, attention where the table has this head layout, "
       "else roofline attention)" + (" + custom all-reduce/NCCL" if tp > 1 else "")
       + "; the dense deployments of the BLIS H100 runs")
      for m, tp in (("llama-2-7b", 1), ("mistral-nemo-12b", 1), ("mistral-nemo-12b", 2), ("qwen2.5-7b", 1),
                    ("yi-34b", 2))
] + [(f"{m}@fp8-kvauto", "h100", tp, _AIC_H100 + [_AIC_H100_QUANT],
      "aiconfigurator vLLM 0.14 fp8 (per-tensor W8A8) GEMM kernels less the activation quantisation "
      "vLLM fuses into the norm / SiLU before qkv, gate_up and down (vLLM 0.24 quant tables), "
      "bf16-KV attention, all-reduce")
     for m, tp in (("llama-3.1-70b", 2), ("llama-3.1-70b", 4), ("llama-3.1-70b", 8), ("qwen3-32b", 1), ("qwen3-32b", 2),
                   ("qwen3-32b", 8))]

SIG_DIGITS = 5


def file_name(model: str, gpu: str, tp: int) -> str:
    return f"{model}__{gpu}__tp{tp}.json.gz"


def compact(obj, digits: int = SIG_DIGITS):
    """Round every float to ``digits`` significant digits (integers and strings untouched)."""
    if isinstance(obj, float):
        if obj == 0.0 or not math.isfinite(obj):
            return obj
        return float(f"{obj:.{digits - 1}e}")
    if isinstance(obj, list):
        return [compact(v, digits) for v in obj]
    if isinstance(obj, dict):
        return {k: compact(v, digits) for k, v in obj.items()}
    return obj


def _relative_paths(meta: dict, root: Path) -> None:
    meta["paths"] = sorted({str(Path(p).resolve().relative_to(root.resolve()))
                            if str(Path(p).resolve()).startswith(str(root.resolve())) else Path(p).name
                            for p in meta.get("paths", [])})


def _probe_shapes():
    from servesim.simulator.cost_model import StepShape

    shapes = []
    for n, k in ((1, 128), (8, 1024), (64, 2048), (256, 4096)):
        shapes.append(StepShape((1,) * n, (k,) * n, n))
    for c, p in ((16, 0), (512, 0), (2048, 0), (1024, 3000)):
        shapes.append(StepShape((c,), (p,), 1))
    shapes.append(StepShape((1,) * 63 + (512,), (900,) * 63 + (256,), 64))
    shapes.append(StepShape((1,) * 96, tuple(100 + 37 * i for i in range(96)), 96))  # skewed
    return shapes


def build_one(model: str, gpu: str, tp: int, rel_paths: list[str], why: str, root: Path,
              out: Path) -> dict:
    from servesim.simulator.cost_model.fit import fit, load_profiles
    from servesim.simulator.cost_model.fitted import FittedCostModel

    fitted = fit(load_profiles([str(root / p) for p in rel_paths]), model, gpu, tp)
    data = json.loads(json.dumps(fitted.data))
    _relative_paths(data["metadata"], root)
    small = compact(data)
    blob = json.dumps(small, separators=(",", ":"), sort_keys=False).encode()
    name = file_name(fitted.model, fitted.gpu, fitted.tp)
    (out / name).write_bytes(gzip.compress(blob, compresslevel=9, mtime=0))
    # The rounding must not move a step time by more than a rounding error.
    again = FittedCostModel(small)
    drift = max(abs(again.step_time_s(s) / fitted.step_time_s(s) - 1.0) for s in _probe_shapes())
    errs = {op: {"origin": e["origin"], "n_points": e["n_points"], "mape_holdout": e["mape_holdout"]}
            for op, e in fitted.fit_error.items()}
    return {
        "model": fitted.model, "gpu": fitted.gpu, "tp": fitted.tp, "file": name,
        "profiles": rel_paths, "why": why,
        "sources": data["metadata"]["sources"], "frameworks": data["metadata"]["frameworks"],
        "n_rows_used": data["metadata"]["n_rows_used"],
        "attention": data["attention"]["kind"] if data.get("attention") else "step_regression",
        "skew_alpha": (data.get("attention") or {}).get("skew_alpha"),
        "fit_error": errs, "compaction_max_rel_drift": drift, "size_bytes": (out / name).stat().st_size,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", type=Path, default=DEFAULT_PROFILES)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--only", action="append", default=[], metavar="MODEL:GPU:TP",
                    help="rebuild only these entries; the others keep their index rows")
    args = ap.parse_args(argv)
    if not args.profiles.exists():
        print(f"profiles folder {args.profiles} not found", file=sys.stderr)
        return 2
    only = {tuple(o.split(":")) for o in args.only}
    kept = {} if not only else {(e["model"], e["gpu"], str(e["tp"])): e
                                for e in json.loads((args.out / "index.json").read_text())["entries"]}
    entries = []
    for model, gpu, tp, paths, why in CATALOG:
        if only and (model, gpu, str(tp)) not in only:
            entries.append(kept[(model, gpu, str(tp))])
            continue
        e = build_one(model, gpu, tp, paths, why, args.profiles, args.out)
        print(f"{e['file']:<44} {e['size_bytes']:>8} B  attention={e['attention']:<6} "
              f"drift={e['compaction_max_rel_drift']:.1e}")
        entries.append(e)
    index = {"format": "servesim-calibrated-index", "version": 1,
             "profiles_root": "/work/shared/data/gpu_profiles",
             "rounding_significant_digits": SIG_DIGITS, "entries": entries}
    (args.out / "index.json").write_text(json.dumps(index, indent=1) + "\n")
    print(f"wrote {len(entries)} models and index.json to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
