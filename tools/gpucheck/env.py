"""Part 1: the environment the check found, and the APIs the GPU path calls.

The API list is what the runner, its kernels, the calibration sweep and this check call on torch
and triton; each was checked against torch 2.11 and triton 3.6 (the GPU machine's versions, see
docs/GPU_RUNNER.md "gpu-check"), and is checked again here, on the machine itself, by name.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys

from gpucheck.part import Part

# (what, how it is found): attributes and parameters the GPU path uses
TORCH_APIS = ("cuda.Event", "cuda.synchronize", "cuda.get_device_name", "cuda.get_device_properties",
              "cuda.is_available", "Generator", "nn.functional.linear", "nn.functional.silu",
              "nn.functional.embedding", "testing.assert_close", "version.cuda")
# every tl.* the kernels (gpu_runner/ops/triton_kernels.py) call, and the AOT compiler's entry points
TRITON_APIS = ("jit", "next_power_of_2", "compile", "compiler.ASTSource", "backends.compiler.GPUTarget",
               *(f"language.{n}" for n in ("arange", "cdiv", "constexpr", "dot", "exp2", "float32", "full", "int32",
                                            "int64", "load", "max", "maximum", "minimum", "program_id", "store",
                                            "sum", "where", "zeros")))


def _has(module, dotted: str) -> bool:
    obj = module
    for name in dotted.split("."):
        try:
            obj = getattr(obj, name)
        except AttributeError:
            import importlib

            try:
                obj = importlib.import_module(f"{obj.__name__}.{name}")
            except (ImportError, AttributeError):
                return False
    return True


def _dot_takes_input_precision() -> bool:
    """tl.dot(..., input_precision="ieee") (triton >= 3.0): the fp32 kernels' exact dots."""
    import inspect

    import triton.language as tl

    fn = getattr(tl.dot, "fn", tl.dot)  # under the interpreter, tl.dot is wrapped
    try:
        return "input_precision" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def run_env(part: Part, device) -> dict:
    import torch

    import servesim
    from servesim import _native

    info = {"python": sys.version.split()[0], "platform": platform.platform(), "torch": torch.__version__,
            "torch_cuda": torch.version.cuda or "none", "device": str(device)}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = "not installed"
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(gpu=props.name, gpu_memory_gib=f"{props.total_memory / 2**30:.1f}",
                    capability=f"{props.major}.{props.minor}", multiprocessors=props.multi_processor_count)
    if shutil.which("nvidia-smi"):
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        info["nvidia_smi"] = q.stdout.strip() or q.stderr.strip()
    import servesim.scheduler  # noqa: F401  (decides the build: compiled or pure Python)

    info["servesim"] = str(servesim.__file__)
    info["servesim_build"] = "pure Python: " + str(_native.pure_reason) if _native.pure_reason else "compiled"
    for k, v in info.items():
        part.log(f"{k}: {v}")
    missing = [f"torch.{a}" for a in TORCH_APIS if not _has(torch, a)]
    if info["triton"] != "not installed":
        import triton

        missing += [f"triton.{a}" for a in TRITON_APIS if not _has(triton, a)]
        if not _dot_takes_input_precision():
            missing.append("triton.language.dot(input_precision=)")
    part.check(not missing, f"APIs missing: {', '.join(missing)}")
    part.lines += ["| what | found |", "| --- | --- |", *(f"| {k} | {v} |" for k, v in info.items()),
                   f"| APIs the GPU path calls ({len(TORCH_APIS) + len(TRITON_APIS) + 1}) | "
                   f"{'all present' if not missing else 'missing: ' + ', '.join(missing)} |"]
    part.summary = f"{info.get('gpu', 'CPU')}, torch {info['torch']}, triton {info['triton']}, Python {info['python']}"
    return info
