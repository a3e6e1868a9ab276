"""Triton kernels (run by the Triton interpreter on CPU) against the torch reference.

TRITON_INTERPRET=1 must be set before triton is first imported (see
gpu_runner/ops/triton_kernels.py): ``ops.use_triton_interpreter()`` at module
import does that, and fails loudly if another module imported triton first.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.gpu_runner import ops

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton not installed", allow_module_level=True)
ops.use_triton_interpreter()  # before anything imports triton

from servesim.gpu_runner.ops.testing import make_paged_batch  # noqa: E402
from inner_loop import share  # noqa: E402  (tests/inner_loop.py)

# Interpreter tolerances vs the fp32 reference: fp32 and bf16 run fp32 dots
# (bf16 is upcast under the interpreter), so the difference is the final
# rounding to the output dtype; fp16 runs the native path (p rounded to fp16).
TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}

# decode (context 17), decode of a 1-token context, decode (context 40),
# a 7-token chunk over a 20-token cached prefix, a fresh 12-token prefill.
QUERY_LENS = [1, 1, 1, 7, 12]
SEQ_LENS = [17, 1, 40, 27, 12]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_reshape_and_cache_matches_reference(dtype):
    b = make_paged_batch(QUERY_LENS, SEQ_LENS, num_heads=6, num_kv_heads=3, head_dim=24, block_size=16,
                         dtype=dtype, num_padding=3)
    want_k, want_v = b.key_cache.clone(), b.value_cache.clone()
    ops.reshape_and_cache(b.key, b.value, want_k, want_v, b.slot_mapping, backend="torch")
    ops.reshape_and_cache(b.key, b.value, b.key_cache, b.value_cache, b.slot_mapping, backend="triton")
    assert torch.equal(b.key_cache.isnan(), want_k.isnan())  # padding tokens (-1) wrote nothing
    assert torch.equal(b.key_cache.nan_to_num(), want_k.nan_to_num())
    assert torch.equal(b.value_cache.nan_to_num(), want_v.nan_to_num())


# (dtype, queries per kv head, kv heads, head_dim, block_size): GQA 1/3/4/32, head_dim
# padded to a power of two (24, 96), block sizes 1 .. 64 (tile of 32 keys spans or splits blocks).
CASES = [
    (torch.float32, 1, 2, 64, 16),
    (torch.float16, 3, 2, 96, 16),
    (torch.bfloat16, 4, 2, 32, 8),
    (torch.float32, 32, 1, 16, 1),
    (torch.bfloat16, 32, 1, 24, 64),
    (torch.float16, 4, 1, 128, 32),
]


@pytest.mark.parametrize("dtype,group,kv_heads,head_dim,block_size", share(CASES, [0, 2]))
def test_unified_attention_matches_reference(dtype, group, kv_heads, head_dim, block_size):
    b = make_paged_batch(QUERY_LENS, SEQ_LENS, num_heads=group * kv_heads, num_kv_heads=kv_heads,
                         head_dim=head_dim, block_size=block_size, dtype=dtype, num_padding=2, seed=group)
    # the new tokens' K/V go in first, as in the model (the triton writer is tested above)
    ops.reshape_and_cache(b.key, b.value, b.key_cache, b.value_cache, b.slot_mapping, backend="torch")
    scale = head_dim ** -0.5
    want = torch.full(b.q.shape, 5.0, dtype=dtype)
    got = torch.full(b.q.shape, 5.0, dtype=dtype)
    args = (b.query_start_loc, b.seq_lens, b.block_table, scale)
    ops.unified_attention(b.q, b.key_cache, b.value_cache, want, *args, backend="torch")
    ops.unified_attention(b.q, b.key_cache, b.value_cache, got, *args, backend="triton")
    n = b.num_real_tokens
    assert not got[:n].isnan().any(), "NaN leaked from an unmasked cache / block-table load"
    torch.testing.assert_close(got[:n].float(), want[:n].float(), atol=TOL[dtype], rtol=TOL[dtype])
    assert torch.all(got[n:] == 5.0), "rows of padding tokens must not be written"


@pytest.mark.slow
def test_triton_on_cpu_without_interpreter_is_rejected():
    code = ("import torch; from servesim.gpu_runner import ops\n"
            "z = torch.zeros(1, 1, 1, 16); c = torch.zeros(2, 4, 1, 16)\n"
            "try:\n    ops.reshape_and_cache(z, z, c, c, torch.zeros(1, dtype=torch.long), backend='triton')\n"
            "except RuntimeError as e:\n    print(e)\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert "TRITON_INTERPRET=1" in res.stdout, res.stderr[-2000:]


@settings(max_examples=6, deadline=None, derandomize=True)
@given(
    seqs=st.lists(st.tuples(st.integers(1, 20), st.integers(0, 40)), min_size=1, max_size=6),
    group=st.sampled_from([1, 3]),
    block_size=st.sampled_from([2, 16]),
)
@pytest.mark.slow
def test_unified_attention_random_batches(seqs, group, block_size):
    """Random query/context mixes: the query-block numbering and causal bounds hold for any layout."""
    b = make_paged_batch([q for q, _ in seqs], [q + c for q, c in seqs], num_heads=2 * group, num_kv_heads=2,
                         head_dim=16, block_size=block_size)
    ops.reshape_and_cache(b.key, b.value, b.key_cache, b.value_cache, b.slot_mapping, backend="torch")
    want, got = torch.zeros_like(b.q), torch.zeros_like(b.q)
    args = (b.query_start_loc, b.seq_lens, b.block_table, 0.25)
    ops.unified_attention(b.q, b.key_cache, b.value_cache, want, *args, backend="torch")
    ops.unified_attention(b.q, b.key_cache, b.value_cache, got, *args, backend="triton")
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
