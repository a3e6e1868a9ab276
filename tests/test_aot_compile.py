"""Ahead-of-time compile of both Triton kernels for sm_90 (H100) on a CPU machine.

Runs the full pipeline down to a cubin with the ptxas shipped in the triton
wheel, so GPU-only compile errors fail CI. It runs in a subprocess because the
interpreter tests of the same session import triton with TRITON_INTERPRET=1.
"""

from __future__ import annotations

import importlib.util

import pytest

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton not installed", allow_module_level=True)

from servesim.gpu_runner import aot  # noqa: E402  (imports torch only; triton is imported in the subprocess)


@pytest.mark.slow
def test_kernels_compile_for_sm90():
    results = aot.compile_in_subprocess(arch=90)
    assert [r.variant for r in results] == [v.name for v in aot.VARIANTS]
    failed = [f"{r.variant}: {r.error}" for r in results if not r.ok]
    assert not failed, "\n".join(failed)
    for r in results:
        assert r.cubin_bytes > 0 and r.shared_bytes <= aot.H100_MAX_SHARED


def test_variants_cover_kernels_dtypes_and_64bit_strides():
    kinds = {(v.kernel, v.dtype) for v in aot.VARIANTS}
    for kernel in ("reshape_and_cache", "unified_attention"):
        assert {d for k, d in kinds if k == kernel} == {"fp16", "bf16", "fp32"}
        assert any(v.kernel == kernel and v.index_bits == 64 for v in aot.VARIANTS)
    groups = {v.num_heads // v.num_kv_heads for v in aot.VARIANTS if v.kernel == "unified_attention"}
    assert {1, 3, 4, 32} <= groups


def test_signature_types():
    v = aot.Variant("unified_attention", "bf16", 8, 2, 64, 16, index_bits=64)
    names = ["q_ptr", "slot_mapping_ptr", "block_table_ptr", "qk_scale", "num_seqs", "stride_q_tok", "TILE_N"]
    sig = aot.signature(v, names, {"TILE_N": 32})
    assert list(sig.values()) == ["*bf16", "*i64", "*i32", "fp32", "i32", "i64", "constexpr"]
