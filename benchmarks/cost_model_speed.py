"""Microbenchmark: microseconds per ``step_time_s`` call for the cost models.

Run: .venv/bin/python benchmarks/cost_model_speed.py
Uses the shared LLMServingSim / aiconfigurator profiles for the ``profiled`` model when
/work/shared is present (it is located next to the repository), else only the roofline.
"""

from __future__ import annotations

import random
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from servesim.simulator.cost_model import StepShape, make_cost_model  # noqa: E402
from servesim.simulator.cost_model.fit import fit, load_profiles  # noqa: E402

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "gpu_profiles"


def shapes() -> dict[str, StepShape]:
    rng = random.Random(0)
    ctx = tuple(rng.randint(10, 4000) for _ in range(256))
    return {
        "decode x8": StepShape((1,) * 8, ctx[:8], 8),
        "decode x256": StepShape((1,) * 256, ctx, 256),
        "255 decodes + 1 chunk": StepShape((1,) * 255 + (512,), ctx, 255),
        "254 decodes + 2 chunks": StepShape((1,) * 254 + (512, 300), ctx, 254),
        "prefill 2048": StepShape((2048,), (0,), 1),
    }


def models() -> dict[str, object]:
    out = {"roofline llama-3.1-8b h100": make_cost_model("roofline", model="llama-3.1-8b",
                                                         gpu="h100"),
           "roofline mixtral-8x7b h100 tp2": make_cost_model("roofline", model="mixtral-8x7b",
                                                             gpu="h100", tp=2),
           # one dense, one MoE (measured FusedMoE table), one MLA + MoE model: lookup cost per step
           "dense qwen3-32b rtx-pro-6000 tp2 (collective table)": make_cost_model(
               "roofline", model="qwen3-32b", gpu="rtx-pro-6000", tp=2),
           "MoE llama-4-scout fp8 h100 tp2 (MoE table)": make_cost_model(
               "roofline", model="RedHatAI/Llama-4-Scout-17B-16E-Instruct-FP8-dynamic", gpu="h100",
               tp=2),
           "MLA deepseek-v3 h200 tp8 (fp8 block, MoE table)": make_cost_model(
               "roofline", model="deepseek-v3", gpu="h200", tp=8),
           "MLA deepseek-v3 h200 tp8 (+ MLA decode table)": make_cost_model(
               "roofline", model="deepseek-v3", gpu="h200", tp=8, mla_table=True),
           "sliding gemma-3-27b h100 tp2 (hybrid window)": make_cost_model(
               "roofline", model="gemma-3-27b", gpu="h100", tp=2)}
    if SHARED.is_dir():
        lss = SHARED / "llmservingsim/vllm_0.19_profiler/RTXPRO6000/meta-llama/Llama-3.1-8B/bf16/tp1"
        out["profiled mixed-attention (LLMServingSim)"] = fit(
            load_profiles([lss]), "llama-3.1-8b", "rtx-pro-6000", 1)
        out["profiled split-attention (aiconfigurator) tp4"] = fit(
            load_profiles([SHARED / "aiconfigurator/h100_sxm/vllm_0.14.0"]), "llama-3.1-70b",
            "h100", 4)
    return out


def main() -> None:
    cases = shapes()
    print(f"{'model':<52}" + "".join(f"{name:>24}" for name in cases))
    for label, cm in models().items():
        cells = []
        for shape in cases.values():
            number = 2000
            best = min(timeit.repeat(lambda: cm.step_time_s(shape), number=number, repeat=5))
            cells.append(f"{best / number * 1e6:>21.1f} us")
        print(f"{label:<52}" + "".join(cells))


if __name__ == "__main__":
    main()
