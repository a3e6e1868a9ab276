"""tiny-llama with random weights on the torch backend: paged-cache invariants, presets, config details."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from servesim.gpu_runner.model import LlamaModel, rope_inv_freq
from servesim.gpu_runner.ops.testing import simple_metadata
from servesim.gpu_runner.weights import PRESETS, preset

BS = 4  # cache block size


def _model(**overrides) -> LlamaModel:
    m = LlamaModel.random(preset("tiny-llama", **overrides), seed=1)
    m.allocate_kv_cache(num_blocks=32, block_size=BS)
    for c in m.kv_caches:  # unwritten slots are NaN: any unmasked read would poison the output
        c.key.fill_(float("nan"))
        c.value.fill_(float("nan"))
    return m


def _ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(seed))


def _step(m, ids, ctx, n, blocks, num_padding=0):
    pos, meta = simple_metadata([ctx], [n], [blocks], BS, num_padding=num_padding)
    ids = torch.cat([ids, torch.zeros(num_padding, dtype=torch.long)])
    return m.forward(ids, pos, meta)


@pytest.mark.slow
def test_chunked_prefill_equals_full_prefill():
    ids = _ids(13)
    full = _step(_model(), ids, 0, 13, [5, 9, 2, 7])
    m = _model()
    first = _step(m, ids[:6], 0, 6, [5, 9, 2, 7])
    second = _step(m, ids[6:], 6, 7, [5, 9, 2, 7], num_padding=2)  # chunk 2 attends to the cached chunk 1
    torch.testing.assert_close(torch.cat([first, second[:7]]), full, atol=1e-5, rtol=1e-5)


def test_decode_after_prefill_equals_full_recompute():
    ids = _ids(10, seed=3)
    m = _model()
    _step(m, ids[:7], 0, 7, [3, 4, 8])
    decoded = [_step(m, ids[p:p + 1], p, 1, [3, 4, 8])[0] for p in range(7, 10)]
    recompute = _step(_model(), ids, 0, 10, [11, 12, 13])
    torch.testing.assert_close(torch.stack(decoded), recompute[7:], atol=1e-5, rtol=1e-5)
    logits = m.compute_logits(torch.stack(decoded))
    assert logits.shape == (3, 512) and logits.dtype == torch.float32


def test_batched_sequences_are_independent():
    a, b = _ids(9, seed=4), _ids(5, seed=5)
    alone_a = _step(_model(), a, 0, 9, [1, 2, 3])
    alone_b = _step(_model(), b, 0, 5, [4, 5])
    m = _model()
    pos, meta = simple_metadata([0, 0], [9, 5], [[6, 7, 8], [9, 10]], BS, num_padding=1)
    both = m.forward(torch.cat([a, b, torch.zeros(1, dtype=torch.long)]), pos, meta)
    torch.testing.assert_close(both[:14], torch.cat([alone_a, alone_b]), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_forward_is_finite(dtype):
    m = LlamaModel.random(preset("tiny-llama", qk_norm=True, tie_embeddings=True), seed=2, dtype=dtype)
    m.allocate_kv_cache(8, BS)
    pos, meta = simple_metadata([0], [6], [[1, 2]], BS)
    h = m.forward(_ids(6), pos, meta)
    assert h.dtype == dtype and torch.isfinite(m.compute_logits(h)).all()


def test_forward_requires_kv_cache():
    m = LlamaModel.random(preset("tiny-llama"))
    pos, meta = simple_metadata([0], [2], [[1]], BS)
    with pytest.raises(RuntimeError, match="allocate_kv_cache"):
        m.forward(_ids(2), pos, meta)


# Published parameter counts (HF model cards), billions.
PUBLISHED = {"llama-3.1-8b": 8.03, "llama-3.1-70b": 70.55, "llama-2-7b": 6.74, "llama-2-70b": 68.98,
             "qwen3-32b": 32.76, "mistral-7b": 7.25, "smollm2-135m": 0.1345}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_shapes_match_published_sizes(name):
    assert PRESETS[name].num_params() / 1e9 == pytest.approx(PUBLISHED[name], rel=0.01)


def test_llama3_rope_scaling():
    cfg = PRESETS["llama-3.1-8b"]
    plain = rope_inv_freq(preset("llama-3.1-8b", rope_scaling=None))
    scaled = rope_inv_freq(cfg)
    assert torch.equal(scaled[:10], plain[:10])  # short wavelengths kept
    torch.testing.assert_close(scaled[-10:], plain[-10:] / 8.0)  # long wavelengths slowed 8x
    assert torch.all(scaled <= plain)


@pytest.mark.slow
def test_torch_backend_does_not_import_triton():
    code = ("import sys, torch; from servesim.gpu_runner.model import LlamaModel; from servesim.gpu_runner.weights import preset; "
            "LlamaModel.random(preset('tiny-llama')); import servesim.gpu_runner.gguf_loader; "
            "sys.exit(1 if 'triton' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
