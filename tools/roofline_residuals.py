"""The roofline cost model's step-time error against measured kernel tables, per GPU generation and
step kind: writes simulator/cost_model/data/roofline_residuals.json (read by
simulator/cost_model/perturbation.py to perturb roofline replicates; docs/UNCERTAINTY.md).

    /work/main/.venv/bin/python tools/roofline_residuals.py          # ~10 s

The measured side is the shipped calibrated models (simulator/cost_model/calibrated/: `servesim fit`
on the kernel and per-op tables of /work/shared/data/gpu_profiles, within a few % of the tables on
held-out points). Only entries whose attention was measured (attention kind "split" or "mixed") are
used: a calibrated entry with roofline-filled attention would compare the roofline with itself.
No end-to-end run enters here.

For each entry, the same probe steps are priced by both models, and the natural log of
roofline / measured is taken. Per (GPU generation, step kind) the file records the number of
probes, the mean log error (the roofline's bias) and its standard deviation, and `rms_log_error`,
sqrt(mean^2 + sd^2): the width the perturbation uses (centred on the model's own answer).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "simulator" / "cost_model" / "data" / "roofline_residuals.json"

# Probe steps: decode batches x contexts, prefill chunks x cached prefixes, and mixed steps (one
# chunk beside decodes), the shapes vLLM's scheduler builds with its default budget (8192 tokens).
DECODE_BATCHES = (1, 4, 16, 64, 128, 256)
DECODE_CONTEXTS = (256, 1024, 4096)
PREFILL_CHUNKS = (128, 512, 2048, 8192)
PREFILL_CACHED = (0, 2048)
MIXED = ((8, 1024, 512), (32, 2048, 1024), (64, 1024, 2048), (128, 4096, 4096))  # (decodes, ctx, chunk)


def probe_shapes():
    from servesim.scheduler.step_shape import StepShape

    for n in DECODE_BATCHES:
        for c in DECODE_CONTEXTS:
            yield "decode", StepShape((1,) * n, (c,) * n, n)
    for chunk in PREFILL_CHUNKS:
        for cached in PREFILL_CACHED:
            yield "prefill", StepShape((chunk,), (cached,), 1)
    for n, c, chunk in MIXED:
        yield "mixed", StepShape((1,) * n + (chunk,), (c,) * n + (0,), n + 1)


def residuals() -> dict:
    from servesim.simulator.cost_model import make_cost_model
    from servesim.simulator.cost_model.calibrated import available_calibrated
    from servesim.simulator.specs import resolve_gpu
    from servesim.simulator.specs.gpu_generation import gpu_generation

    errors: dict[str, dict[str, list[float]]] = {}
    entries = []
    for e in available_calibrated():
        if e["attention"] not in ("split", "mixed"):
            continue
        kw = dict(model=e["model"], gpu=e["gpu"], tp=int(e["tp"]))
        measured, roofline = make_cost_model("calibrated", **kw), make_cost_model("roofline", **kw)
        gen = gpu_generation(resolve_gpu(e["gpu"]))
        for kind, shape in probe_shapes():
            m, r = measured.step_time_s(shape), roofline.step_time_s(shape)
            if m > 0 and r > 0:
                errors.setdefault(gen, {}).setdefault(kind, []).append(math.log(r / m))
        entries.append(f"{e['model']} {e['gpu']} tp{e['tp']}")
    by_gen = {gen: {kind: _stats(v) for kind, v in sorted(kinds.items())} for gen, kinds in sorted(errors.items())}
    pooled: dict[str, list[float]] = {}
    for kinds in errors.values():
        for kind, v in kinds.items():
            pooled.setdefault(kind, []).extend(v)
    return {"format": "servesim-roofline-residuals", "version": 1,
            "method": "ln(roofline / calibrated) on probe steps; tools/roofline_residuals.py",
            "entries": entries, "generations": by_gen,
            "pooled": {kind: _stats(v) for kind, v in sorted(pooled.items())}}


def _stats(values: list[float]) -> dict:
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in values) / (n - 1)) if n > 1 else 0.0
    return {"num_probes": n, "mean_log_error": round(mean, 5), "sd_log_error": round(sd, 5),
            "rms_log_error": round(math.sqrt(mean * mean + sd * sd), 5)}


def main() -> int:
    data = residuals()
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    for gen, kinds in data["generations"].items():
        print(gen, {k: v["rms_log_error"] for k, v in kinds.items()})
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
