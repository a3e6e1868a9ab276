"""Numeric formats of weights, activations and the KV cache: storage bytes and which tensor-core
rate a GEMM in that format runs at.

Storage bytes per element include the scales the format carries (docs/COST_MODELS.md "Precision"):
fp8 block-scaled keeps one fp32 scale per 128x128 block (DeepSeek-V3 ``weight_block_size``), int4
AWQ/GPTQ one fp16 scale (and zero point) per group of 128, NVFP4 one fp8 scale per 16 elements,
MXFP4 one 8-bit exponent per 32 (OCP Microscaling spec).
"""

from __future__ import annotations

from servesim.traces.errors import InputError

# format -> bytes per stored element, scales included
_BYTES = {
    "fp32": 4.0, "bf16": 2.0, "fp16": 2.0,
    "fp8": 1.0,  # per-tensor / per-channel scale: negligible
    "fp8_block": 1.0 + 4.0 / (128 * 128),
    "int8": 1.0,
    "int4": 0.5 + 4.0 / 128,  # fp16 scale + fp16 zero per group of 128
    "nvfp4": 0.5 + 1.0 / 16,
    "mxfp4": 0.5 + 1.0 / 32,
}
_ALIASES = {
    "float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16", "auto": "bf16",
    "fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "float8_e4m3fn": "fp8", "e4m3": "fp8", "fp8-dynamic": "fp8",
    "w8a8": "fp8", "fp8-block": "fp8_block", "block_fp8": "fp8_block", "awq": "int4", "gptq": "int4",
    "int4_wo": "int4", "w4a16": "int4", "fp4": "nvfp4", "w4a16_mxfp4": "mxfp4",
}
WEIGHT_FORMATS = tuple(_BYTES)
KV_FORMATS = ("bf16", "fp16", "fp8", "fp32")


def canonical_dtype(name: str, *, field: str = "dtype") -> str:
    """The canonical format id for a user or config spelling (``bfloat16`` -> ``bf16``)."""
    key = str(name).strip().lower().replace(" ", "")
    key = _ALIASES.get(key, key)
    if key not in _BYTES:
        raise InputError(f"unknown numeric format {name!r}", field=field,
                         allowed=", ".join(WEIGHT_FORMATS))
    return key


def bytes_per_element(fmt: str) -> float:
    return _BYTES[canonical_dtype(fmt)]


def kv_cache_dtype(kv_cache_dtype: str | None, model_dtype: str) -> str:
    """vLLM's ``--kv-cache-dtype``: ``auto`` = the model's activation dtype; fp8 variants = fp8."""
    if kv_cache_dtype is None or str(kv_cache_dtype).lower() == "auto":
        return canonical_dtype(model_dtype)
    fmt = canonical_dtype(kv_cache_dtype, field="kv_cache_dtype")
    if fmt not in KV_FORMATS:
        raise InputError(f"kv cache dtype {kv_cache_dtype!r} is not one vLLM offers",
                         field="kv_cache_dtype", allowed="auto, " + ", ".join(KV_FORMATS))
    return fmt


def gemm_peak_tflops(gpu, weight_fmt: str) -> float:
    """Tensor-core peak a GEMM with weights in ``weight_fmt`` runs at on ``gpu`` (1e12 FLOP/s).

    W8A8 fp8 runs on fp8 tensor cores where the GPU has them; weight-only int4 (AWQ/GPTQ, Marlin)
    dequantises to bf16; NVFP4 (W4A4) uses fp4 tensor cores where present, else vLLM falls back
    to a weight-only kernel at bf16 rate; MXFP4 (gpt-oss) runs W4A8 on Blackwell (fp8 rate) and
    weight-only elsewhere."""
    fmt = canonical_dtype(weight_fmt)
    if fmt in ("fp8", "fp8_block", "int8") and gpu.fp8_dense_tflops:
        return gpu.fp8_dense_tflops
    if fmt == "nvfp4" and gpu.fp4_dense_tflops:
        return gpu.fp4_dense_tflops
    if fmt == "mxfp4" and gpu.fp4_dense_tflops and gpu.fp8_dense_tflops:
        return gpu.fp8_dense_tflops
    if fmt == "fp32":
        return gpu.bf16_dense_tflops / 2
    return gpu.bf16_dense_tflops


def gemm_efficiency(gpu, weight_fmt: str, default: float) -> float:
    """Achievable fraction of :func:`gemm_peak_tflops`: the GPU's fitted fp8 efficiency for GEMMs on
    fp8 tensor cores (gpus.yaml), else ``default`` (the bf16-fitted compute efficiency)."""
    fp8_cores = canonical_dtype(weight_fmt) in ("fp8", "fp8_block", "int8") and gpu.fp8_dense_tflops
    if fp8_cores and gpu.fp8_compute_efficiency is not None:
        return gpu.fp8_compute_efficiency
    return default
