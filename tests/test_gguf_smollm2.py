"""Real weights: SmolLM2-135M-Instruct (the Q4_1 GGUF tools/fetch_test_weights.py puts in the venv)."""

from __future__ import annotations

import importlib.util
from dataclasses import replace

import pytest
import torch

pytest.importorskip("gguf")
pytestmark = pytest.mark.slow  # loads real SmolLM2 weights

from servesim.gpu_runner import gguf_loader, ops  # noqa: E402
from servesim.gpu_runner.model import LlamaModel  # noqa: E402
from servesim.gpu_runner.ops.testing import simple_metadata  # noqa: E402
from servesim.gpu_runner.weights import PRESETS  # noqa: E402

HAS_TRITON = importlib.util.find_spec("triton") is not None
if HAS_TRITON:
    ops.use_triton_interpreter()  # before anything imports triton: one check below runs the Triton kernels

PROMPT = "The capital of France is"
BS = 16


@pytest.fixture(scope="module")
def ckpt():
    try:
        path = gguf_loader.smollm2_gguf_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    return gguf_loader.load_gguf(path)


def _greedy(model: LlamaModel, ids: list[int], steps: int) -> list[int]:
    """Prefill the prompt, then decode `steps - 1` tokens through the paged cache."""
    model.allocate_kv_cache(num_blocks=4, block_size=BS)
    blocks = [2, 1, 3]
    pos, meta = simple_metadata([0], [len(ids)], [blocks], BS)
    hidden = model.forward(torch.tensor(ids), pos, meta)
    out = [int(model.compute_logits(hidden[-1:]).argmax())]
    for _ in range(steps - 1):
        ctx = len(ids) + len(out) - 1
        pos, meta = simple_metadata([ctx], [1], [blocks], BS)
        hidden = model.forward(torch.tensor(out[-1:]), pos, meta)
        out.append(int(model.compute_logits(hidden).argmax()))
    return out


def test_config_matches_preset(ckpt):
    assert replace(ckpt.config, rms_eps=1e-5) == PRESETS["smollm2-135m"]
    assert ckpt.weights.lm_head is None and not ckpt.weights.extra  # tied; every tensor used
    assert ckpt.weights.layers[0].qkv_proj.shape == (576 + 2 * 192, 576)


def test_tokenizer_roundtrip(ckpt):
    tok = ckpt.tokenizer
    ids = tok.encode(PROMPT)
    assert [tok.tokens[i] for i in ids] == ["The", "Ġcapital", "Ġof", "ĠFrance", "Ġis"]
    text = "Héllo wörld!  It's 2024_x\n\tdone"
    assert tok.decode(tok.encode(text)) == text
    assert len(tok.encode("2024")) == 4  # SmolLM's pre-tokenizer splits digits one by one


def test_unpermute_inverts_llama_cpp_permute():
    heads, head_dim, cols = 3, 8, 5
    hf = torch.randn(heads * head_dim, cols)
    # llama.cpp convert_hf_to_gguf: rows of each head reshaped (2, D/2) and transposed to (D/2, 2)
    gguf_rows = hf.reshape(heads, 2, head_dim // 2, cols).transpose(1, 2).reshape(heads * head_dim, cols)
    assert torch.equal(gguf_loader._unpermute_rows(gguf_rows, heads), hf)


def test_greedy_paris(ckpt):
    model = LlamaModel(ckpt.config, ckpt.weights)
    ids = ckpt.tokenizer.encode(PROMPT)
    out = _greedy(model, ids, 3)
    assert ckpt.tokenizer.decode(out[:1]) == " Paris"
    # decode through the cache agrees with recomputing the whole sequence
    full = _greedy(model, ids + out[:2], 1)
    assert full == out[2:]


@pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")
def test_greedy_paris_triton_interpreter(ckpt):
    """The prompt's prefill through the Triton kernels (interpreter), same logits as torch."""
    ids = ckpt.tokenizer.encode(PROMPT)
    pos, meta = simple_metadata([0], [len(ids)], [[1]], BS)
    logits = {}
    for backend in ("torch", "triton"):
        model = LlamaModel(ckpt.config, ckpt.weights, backend=backend)
        model.allocate_kv_cache(num_blocks=2, block_size=BS)
        logits[backend] = model.compute_logits(model.forward(torch.tensor(ids), pos, meta)[-1:])
    torch.testing.assert_close(logits["triton"], logits["torch"], atol=1e-3, rtol=1e-3)
    assert ckpt.tokenizer.decode([int(logits["triton"].argmax())]) == " Paris"
