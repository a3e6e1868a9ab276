"""The torch reference of the paged-attention ops against a token-by-token loop oracle (CPU, fast)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.gpu_runner import ops
from servesim.gpu_runner.ops.testing import make_paged_batch, naive_attention


def _run_reference(batch, scale: float) -> torch.Tensor:
    ops.reshape_and_cache(batch.key, batch.value, batch.key_cache, batch.value_cache, batch.slot_mapping)
    out = torch.full(batch.q.shape, 7.0, dtype=batch.q.dtype)
    ops.unified_attention(batch.q, batch.key_cache, batch.value_cache, out, batch.query_start_loc,
                          batch.seq_lens, batch.block_table, scale)
    return out


def test_reshape_and_cache_writes_slots_and_skips_padding():
    b = make_paged_batch([2, 3], [5, 3], num_heads=2, num_kv_heads=2, head_dim=4, block_size=2, num_padding=2)
    before_k = b.key_cache.clone()
    ops.reshape_and_cache(b.key, b.value, b.key_cache, b.value_cache, b.slot_mapping)
    written = torch.zeros(b.key_cache.shape[:2], dtype=torch.bool)
    for t, slot in enumerate(b.slot_mapping.tolist()):
        if slot >= 0:
            blk, off = divmod(slot, 2)
            written[blk, off] = True
            assert torch.equal(b.key_cache[blk, off], b.key[t]) and torch.equal(b.value_cache[blk, off], b.value[t])
    # padding tokens (-1) wrote nothing: every other slot is as before (NaN-equal)
    assert torch.equal(b.key_cache[~written].isnan(), before_k[~written].isnan())
    assert int(written.sum()) == 5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_matches_loop_oracle_mixed_batch(dtype):
    # decodes (incl. a 1-token context), a chunk over a cached prefix, a fresh prefill, 2 padding tokens
    b = make_paged_batch([1, 1, 6, 9, 1], [17, 1, 20, 9, 33], num_heads=6, num_kv_heads=2, head_dim=8,
                         block_size=4, dtype=dtype, num_padding=2)
    out = _run_reference(b, 0.3)
    want = naive_attention(b.q, b.key_cache, b.value_cache, b.query_start_loc, b.seq_lens, b.block_table, 0.3)
    n = b.num_real_tokens
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out[:n].float(), want[:n], atol=tol, rtol=tol)
    assert torch.all(out[n:] == 7.0), "rows of padding tokens must not be written"


@settings(max_examples=25, deadline=None)
@given(
    seqs=st.lists(st.tuples(st.integers(1, 12), st.integers(0, 20)), min_size=1, max_size=5),
    group=st.sampled_from([1, 2, 3]),
    block_size=st.sampled_from([1, 2, 4, 16]),
    seed=st.integers(0, 2**16),
)
@pytest.mark.slow
def test_reference_matches_loop_oracle_random(seqs, group, block_size, seed):
    query_lens = [q for q, _ in seqs]
    seq_lens = [q + ctx for q, ctx in seqs]
    b = make_paged_batch(query_lens, seq_lens, num_heads=2 * group, num_kv_heads=2, head_dim=4,
                         block_size=block_size, seed=seed)
    out = _run_reference(b, 0.5)
    want = naive_attention(b.q, b.key_cache, b.value_cache, b.query_start_loc, b.seq_lens, b.block_table, 0.5)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)


def test_unknown_backend_rejected():
    with pytest.raises(ValueError, match="unknown attention backend"):
        ops.backend_module("cuda")
