"""Ahead-of-time compilation of the paged-attention kernels for a CUDA target, no GPU needed.

``triton.compile(ASTSource(fn, signature, constexprs=..., attrs=...),
target=GPUTarget("cuda", 90, 32))`` runs the whole pipeline (TTIR -> TTGIR ->
LLVM IR -> PTX -> cubin, the last step by the ``ptxas`` that the triton wheel
ships under ``triton/backends/nvidia/bin``), so errors that only a GPU build
would hit (layout conversions, dot shapes, shared-memory budget, ptxas)
fail CI on a CPU machine.

Version notes: triton 3.6.0 and 3.7.1 (both checked) share this API:
``ASTSource(fn, signature, constexprs=None, attrs=None)`` with signature a
dict name -> type string in which constexpr parameters are typed
``"constexpr"``, attrs ``{(arg_index,): [["tt.divisibility", 16]]}``, and
``triton.compile(src, target=None, options=None)``. Triton <= 3.2 took
``constants=`` and an ``AttrsDescriptor`` instead; ``_ast_source`` refuses it
with a clear error (pyproject requires triton >= 3.6).

The compile needs the compiler-mode ``@triton.jit`` wrappers, so a process in
which triton was imported with ``TRITON_INTERPRET=1`` must use
``compile_in_subprocess`` (what the test does). CLI:
``python -m servesim.gpu_runner.aot [--arch 90] [--json]``.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

import torch

_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
_INT_POINTERS = {"slot_mapping_ptr": "*i64", "query_start_loc_ptr": "*i32", "seq_lens_ptr": "*i32",
                 "block_table_ptr": "*i32"}
H100_MAX_SHARED = 232448  # bytes of shared memory one block may use on sm_90


@dataclass(frozen=True, slots=True)
class Variant:
    kernel: str  # "reshape_and_cache" | "unified_attention"
    dtype: str  # "fp16" | "bf16" | "fp32"
    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    index_bits: int = 32  # strides as i32, or i64 (what Triton specialises strides >= 2**31 to)

    @property
    def name(self) -> str:
        return (f"{self.kernel}-{self.dtype}-h{self.num_heads}kv{self.num_kv_heads}-d{self.head_dim}"
                f"-bs{self.block_size}-i{self.index_bits}")


VARIANTS: tuple[Variant, ...] = (
    Variant("reshape_and_cache", "bf16", 32, 8, 128, 16),  # llama-3.1-8b
    Variant("reshape_and_cache", "fp16", 9, 3, 64, 16, index_bits=64),  # smollm2, 64-bit strides
    Variant("reshape_and_cache", "fp32", 8, 1, 96, 1),  # one kv head (70B at TP 8), head_dim 96, block 1
    Variant("unified_attention", "bf16", 32, 8, 128, 16),  # GQA 4
    Variant("unified_attention", "fp16", 9, 3, 64, 16, index_bits=64),  # GQA 3, 64-bit strides
    Variant("unified_attention", "bf16", 32, 1, 128, 32),  # GQA 32
    Variant("unified_attention", "fp32", 4, 4, 96, 8),  # MHA, fp32 ieee dots, head_dim padded 96 -> 128
)


@dataclass(frozen=True, slots=True)
class CompileResult:
    variant: str
    ok: bool
    seconds: float
    cubin_bytes: int = 0
    shared_bytes: int = 0
    num_warps: int = 0
    num_stages: int = 0
    error: str = ""  # "" when ok


def _kernel_and_constexprs(v: Variant):
    from servesim.gpu_runner.ops import triton_kernels as tk

    if v.kernel == "reshape_and_cache":
        return tk.reshape_and_cache_kernel, tk.reshape_and_cache_constexprs(v.num_kv_heads, v.head_dim,
                                                                             v.block_size)
    if v.kernel == "unified_attention":
        return tk.unified_attention_kernel, tk.unified_attention_constexprs(
            v.num_heads, v.num_kv_heads, v.head_dim, v.block_size, _DTYPES[v.dtype], interpret=False)
    raise ValueError(f"unknown kernel {v.kernel!r}")


def signature(v: Variant, arg_names: list[str], constexprs: dict) -> dict[str, str]:
    """Triton type string of every kernel argument, in order."""
    def one(name: str) -> str:
        if name in constexprs:
            return "constexpr"
        if name.endswith("_ptr"):
            return _INT_POINTERS.get(name, f"*{v.dtype}")
        if name == "qk_scale":
            return "fp32"
        return f"i{v.index_bits}" if name.startswith("stride_") else "i32"

    return {name: one(name) for name in arg_names}


def _ast_source(kernel, sig: dict[str, str], constexprs: dict):
    from triton.compiler import ASTSource

    if "constexprs" not in inspect.signature(ASTSource.__init__).parameters:
        import triton

        raise RuntimeError(f"triton {triton.__version__}: ASTSource without constexprs= (triton <= 3.2) "
                           "is not supported; gpu_runner needs triton >= 3.6")
    # pointers 16-byte aligned, as the JIT launcher specialises torch allocations
    attrs = {(i,): [["tt.divisibility", 16]] for i, t in enumerate(sig.values()) if t.startswith("*")}
    return ASTSource(kernel, sig, constexprs=constexprs, attrs=attrs)


def compile_variant(v: Variant, arch: int = 90) -> CompileResult:
    import triton
    from triton.backends.compiler import GPUTarget

    from servesim.gpu_runner.ops import triton_kernels as tk

    if tk.interpreting():
        raise RuntimeError("triton was imported with TRITON_INTERPRET=1; use compile_in_subprocess()")
    kernel, constexprs = _kernel_and_constexprs(v)
    start = time.perf_counter()
    try:
        src = _ast_source(kernel, signature(v, kernel.arg_names, constexprs), constexprs)
        compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32))
    except Exception as e:  # noqa: BLE001 - any compiler failure is the result
        return CompileResult(v.name, False, time.perf_counter() - start, error=f"{type(e).__name__}: {e}")
    md = compiled.metadata
    shared = int(getattr(md, "shared", 0))
    ok = bool(compiled.asm.get("cubin")) and shared <= H100_MAX_SHARED
    return CompileResult(v.name, ok, time.perf_counter() - start, cubin_bytes=len(compiled.asm.get("cubin", b"")),
                         shared_bytes=shared, num_warps=int(md.num_warps), num_stages=int(md.num_stages),
                         error="" if ok else f"no cubin or shared memory {shared} > {H100_MAX_SHARED}")


def compile_all(arch: int = 90, variants: tuple[Variant, ...] = VARIANTS) -> list[CompileResult]:
    return [compile_variant(v, arch) for v in variants]


def compile_in_subprocess(arch: int = 90, timeout_s: float = 600.0) -> list[CompileResult]:
    """``compile_all`` in a fresh interpreter: TRITON_INTERPRET cleared, empty triton cache (a real compile)."""
    with tempfile.TemporaryDirectory(prefix="servesim-aot-") as cache:
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env["TRITON_CACHE_DIR"] = cache
        res = subprocess.run([sys.executable, "-m", "gpu_runner.aot", "--arch", str(arch), "--json"],
                             env=env, capture_output=True, text=True, timeout=timeout_s)
    if not res.stdout.strip():
        raise RuntimeError(f"AOT subprocess failed (rc {res.returncode}):\n{res.stderr[-4000:]}")
    return [CompileResult(**r) for r in json.loads(res.stdout.strip().splitlines()[-1])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability, e.g. 90 for H100")
    parser.add_argument("--json", action="store_true", help="print the results as one JSON line")
    args = parser.parse_args(argv)
    results = compile_all(args.arch)
    if args.json:
        print(json.dumps([asdict(r) for r in results]))
    else:
        for r in results:
            status = "ok " if r.ok else "FAIL"
            print(f"{status} {r.variant:60s} {r.seconds:5.1f}s cubin={r.cubin_bytes}B "
                  f"smem={r.shared_bytes}B warps={r.num_warps} stages={r.num_stages} {r.error}")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
