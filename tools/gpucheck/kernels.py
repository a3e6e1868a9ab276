"""Part 2: the runner's Triton kernels against the torch reference, on the device.

The cases are those of tests/test_gpu_ops_triton.py and tests/test_gpu_model_triton.py (where
they ran on the CPU under the Triton interpreter), here on the device the check runs on: every
dtype (fp32, fp16, bf16), GQA group 1/3/4/32, head_dim 16-128 (24 and 96 padded), block sizes
1-64, over a decode batch, a fresh prefill, a chunk over a cached prefix and the varlen mixed
batch (with padding tokens whose rows must stay unwritten); then reshape_and_cache per dtype, and
tiny-llama's whole forward Triton vs torch over three mixed steps (the metadata builder's
`simple_metadata`; the persistent batch's builder runs every step of part 3 on the device).

Tolerances are the CPU tests': fp32 2e-5 (exact fp32 dots), fp16 2e-3, bf16 1.6e-2 (the output
rounding; on a GPU bf16 dots natively with fp32 accumulation, inside the same bound).
"""

from __future__ import annotations

import torch

from gpucheck.part import Part

TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# (queries per kv head, kv heads, head_dim, block_size): tests/test_gpu_ops_triton.py's CASES
SHAPES = ((1, 2, 64, 16), (3, 2, 96, 16), (4, 2, 32, 8), (32, 1, 16, 1), (32, 1, 24, 64), (4, 1, 128, 32))
# (query lens, seq lens) per batch kind: decodes over 17/1/40 cached, two fresh prefills, a
# 7-token chunk over a 20-token prefix, and the tests' mixed batch of all three
BATCHES = {
    "decode": ([1, 1, 1], [17, 1, 40]),
    "prefill": ([12, 33], [12, 33]),
    "chunk": ([7], [27]),
    "mixed": ([1, 1, 1, 7, 12], [17, 1, 40, 27, 12]),
}
# tests/test_gpu_model_triton.py's three steps: (context lens, query lens, block tables, padding)
MODEL_STEPS = (
    ([0, 0], [20, 9], [[3, 7], [2, 9]], 3),
    ([20, 9, 0], [1, 10, 5], [[3, 7], [2, 9], [5]], 0),
    ([21, 19, 5], [1, 1, 1], [[3, 7], [2, 9], [5]], 2),
)
DT_NAME = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def attention_case(dtype, group: int, kv_heads: int, head_dim: int, block_size: int, batch: str,
                   device) -> tuple[bool, float, str]:
    """(passed, max |triton - reference|, why it failed) for one case on `device`."""
    from servesim.gpu_runner import ops
    from servesim.gpu_runner.ops.testing import make_paged_batch

    qlens, slens = BATCHES[batch]
    b = make_paged_batch(qlens, slens, num_heads=group * kv_heads, num_kv_heads=kv_heads, head_dim=head_dim,
                         block_size=block_size, dtype=dtype, num_padding=2, seed=group)
    q, kc, vc = b.q.to(device), b.key_cache.to(device), b.value_cache.to(device)
    ops.reshape_and_cache(b.key.to(device), b.value.to(device), kc, vc, b.slot_mapping.to(device), backend="torch")
    args = (b.query_start_loc.to(device), b.seq_lens.to(device), b.block_table.to(device), head_dim ** -0.5)
    want = torch.full(q.shape, 5.0, dtype=dtype, device=device)
    got = torch.full(q.shape, 5.0, dtype=dtype, device=device)
    ops.unified_attention(q, kc, vc, want, *args, backend="torch")
    ops.unified_attention(q, kc, vc, got, *args, backend="triton")
    n = b.num_real_tokens
    if got[:n].isnan().any():
        return False, float("nan"), "NaN leaked from an unmasked cache or block-table load"
    if not torch.all(got[n:] == 5.0):
        return False, 0.0, "a padding token's row was written"
    err = float((got[:n].float() - want[:n].float()).abs().max())
    ok = torch.allclose(got[:n].float(), want[:n].float(), atol=TOL[dtype], rtol=TOL[dtype])
    return ok, err, "" if ok else f"max error {err:.3g} over tolerance {TOL[dtype]}"


def cache_write_case(dtype, device) -> tuple[bool, str]:
    """reshape_and_cache, Triton vs torch: the same slots written, padding (-1) writing nothing."""
    from servesim.gpu_runner import ops
    from servesim.gpu_runner.ops.testing import make_paged_batch

    b = make_paged_batch(*BATCHES["mixed"], num_heads=6, num_kv_heads=3, head_dim=24, block_size=16, dtype=dtype,
                         num_padding=3)
    key, value, slots = b.key.to(device), b.value.to(device), b.slot_mapping.to(device)
    kc, vc = b.key_cache.to(device), b.value_cache.to(device)
    want_k, want_v = kc.clone(), vc.clone()
    ops.reshape_and_cache(key, value, want_k, want_v, slots, backend="torch")
    ops.reshape_and_cache(key, value, kc, vc, slots, backend="triton")
    same = (torch.equal(kc.isnan(), want_k.isnan()) and torch.equal(kc.nan_to_num(), want_k.nan_to_num())
            and torch.equal(vc.nan_to_num(), want_v.nan_to_num()))
    return same, "" if same else "the Triton cache write differs from the reference"


def model_case(device) -> tuple[bool, float]:
    """tiny-llama fp32, Triton vs torch on `device`: hidden states and logits within 1e-4."""
    from servesim.gpu_runner.model import LlamaModel
    from servesim.gpu_runner.ops.testing import simple_metadata
    from servesim.gpu_runner.weights import preset

    cfg = preset("tiny-llama")
    models = {b: LlamaModel.random(cfg, seed=7, device=device, backend=b) for b in ("torch", "triton")}
    for m in models.values():
        for c in m.allocate_kv_cache(num_blocks=10, block_size=16):
            c.key.fill_(float("nan"))
            c.value.fill_(float("nan"))
    gen = torch.Generator().manual_seed(0)
    worst, ok = 0.0, True
    for ctx, qlens, tables, pad in MODEL_STEPS:
        pos, meta = simple_metadata(ctx, qlens, tables, 16, num_padding=pad, device=device)
        ids = torch.randint(0, cfg.vocab_size, (pos.shape[0],), generator=gen).to(device)
        out = {b: m.forward(ids, pos, meta) for b, m in models.items()}
        n, last = sum(qlens), (meta.query_start_loc[1:] - 1).long()
        logits = {b: models[b].compute_logits(out[b][last]) for b in out}
        for a, r in ((out["triton"][:n], out["torch"][:n]), (logits["triton"], logits["torch"])):
            ok &= bool(torch.isfinite(a).all()) and torch.allclose(a, r, atol=1e-4, rtol=1e-4)
            worst = max(worst, float((a - r).abs().max()))
    return ok, worst


def run_kernels(part: Part, device) -> None:
    """Every case on a GPU; on the CPU rehearsal (the interpreter: ~0.4 s a case) the mixed batch
    alone, which holds the other three kinds."""
    rows = []
    batches = list(BATCHES) if device.type == "cuda" else ["mixed"]
    for dtype in DTYPES:
        for group, kvh, hd, bs in SHAPES:
            for batch in batches:
                if part.expired():
                    return
                ok, err, why = attention_case(dtype, group, kvh, hd, bs, batch, device)
                part.check(ok, f"unified_attention {DT_NAME[dtype]} GQA {group} kv {kvh} d {hd} block {bs} "
                           f"{batch}: {why}")
                rows.append(f"| attention | {DT_NAME[dtype]} | {group}x{kvh} | {hd} | {bs} | {batch} | {err:.2e} | "
                            f"{'ok' if ok else 'FAIL'} |")
        ok, why = cache_write_case(dtype, device)
        part.check(ok, f"reshape_and_cache {DT_NAME[dtype]}: {why}")
        rows.append(f"| cache write | {DT_NAME[dtype]} | 2x3 | 24 | 16 | mixed | 0 | {'ok' if ok else 'FAIL'} |")
        part.log(f"kernels: {DT_NAME[dtype]} done ({len(rows)} cases)")
    if part.expired():
        return
    ok, worst = model_case(device)
    part.check(ok, f"tiny-llama forward, Triton vs torch: max difference {worst:.3g} over 1e-4")
    rows.append(f"| tiny-llama forward | fp32 | 2x2 | 16 | 16 | 3 mixed steps | {worst:.2e} | {'ok' if ok else 'FAIL'} |")
    part.lines += ["| what | dtype | GQA x kv heads | head dim | block | batch | max error | |",
                   "| --- | --- | --- | --- | --- | --- | --- | --- |", *rows]
    part.summary = f"{sum(r.endswith('ok |') for r in rows)} of {len(rows)} kernel cases pass"
