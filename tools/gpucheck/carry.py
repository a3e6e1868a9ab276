"""The carry folder: what `make gpu-carry` puts beside the checkout for the GPU machine.

The GPU machine has its own Python (3.12, torch 2.11, triton 3.6, numpy, pandas, pyarrow, pyyaml,
rich, matplotlib, requests, tqdm: /work/.library/device/KINDS.md) and no package index; a device
call sends the working tree and at most 64 MiB in all. A replay imports simpy, and the real-weights
check imports gguf, neither of which is there; both are pure Python, so they travel as zips of the
packages installed here (zipimport: nothing is installed there, and it is the version tested here).

SmolLM2-135M's GGUF (98 MB) does not fit. What travels is a cut of it, `smollm2-cut.npz`, ~14 MB:
the first CUT_LAYERS layers and the first CUT_VOCAB embedding rows, as the file's own quantised
bytes (Q4_1 layers, Q8_0 embedding, F32 norms; dequantised there by the loader's own code), its
config, a prompt's token ids and this machine's fp32 torch logits for that prompt: the GPU's
logits are checked against those.
"""

from __future__ import annotations

import dataclasses
import io
import json
import zipfile
from pathlib import Path

import numpy as np

PURE_PACKAGES = ("simpy", "gguf")  # what a GPU-machine replay and the real-weights check miss there
CUT_NAME = "smollm2-cut.npz"
CUT_LAYERS = 4  # 4 x 2.2 MB of Q4_1 layers
CUT_VOCAB = 8192  # rows of the Q8_0 embedding (612 B each): 5 MB instead of 30 MB
CUT_PROMPT = "The capital of France is"  # token ids < CUT_VOCAB (checked when the cut is made)


def zip_package(name: str, dest: Path) -> Path:
    """A zip of the installed pure-Python package `name` (its folder, bytecode left out), importable
    with the zip on sys.path."""
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {name} is not installed here (it is in servesim's dependencies)")
    folder = Path(next(iter(spec.submodule_search_locations)))
    if any(p.suffix in (".so", ".pyd") for p in folder.rglob("*")):
        raise ValueError(f"package {name} has compiled modules: it cannot travel as a zip")
    out = dest / f"{name}.zip"
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for p in sorted(folder.rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts:
                z.write(p, Path(name) / p.relative_to(folder))
    return out


def make_cut(gguf_path: Path | None, out: Path) -> Path:
    """Write the SmolLM2 cut (see the module docstring) from the GGUF file (default: gguf_loader.smollm2_gguf_path())."""
    import torch
    from gguf import GGUFReader

    from servesim.gpu_runner.gguf_loader import config_from_gguf, smollm2_gguf_path, tokenizer_from_gguf

    reader = GGUFReader(gguf_path or smollm2_gguf_path())
    full = config_from_gguf(reader, "smollm2-135m")
    config = dataclasses.replace(full, name=f"smollm2-135m-cut{CUT_LAYERS}", num_layers=CUT_LAYERS,
                                 vocab_size=CUT_VOCAB)
    ids = tokenizer_from_gguf(reader).encode(CUT_PROMPT)
    if max(ids) >= CUT_VOCAB:
        raise ValueError(f"the prompt's token ids {ids} reach past the cut's vocabulary ({CUT_VOCAB})")
    arrays: dict[str, np.ndarray] = {}
    kinds: dict[str, list[int]] = {}
    for t in reader.tensors:
        layer = int(t.name.split(".")[1]) if t.name.startswith("blk.") else None
        if layer is not None and layer >= CUT_LAYERS or t.name == "output.weight":
            continue
        data = np.asarray(t.data)
        shape = [int(n) for n in reversed(t.shape.tolist())]  # GGUF lists dims fastest-first
        if t.name == "token_embd.weight":  # rows are whole quantisation blocks: a byte slice
            data, shape = data[:CUT_VOCAB], [CUT_VOCAB, *shape[1:]]
        arrays[t.name] = np.ascontiguousarray(data)
        kinds[t.name] = [int(t.tensor_type), *shape]
    model = _model_from(config, arrays, kinds, torch.float32, "cpu")
    logits = prefill_logits(model, ids)
    meta = {"config": dataclasses.asdict(config), "kinds": kinds, "prompt": CUT_PROMPT, "prompt_ids": ids}
    buf = io.BytesIO()
    np.savez(buf, __meta__=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8),
             __logits__=logits.numpy(), **arrays)
    out.write_bytes(buf.getvalue())
    return out


@dataclasses.dataclass(slots=True)
class Cut:
    model: object  # gpu_runner.model.LlamaModel
    prompt_ids: list[int]
    reference_logits: np.ndarray  # [vocab] fp32: the last prompt row's logits, torch fp32 on the CPU


def load_cut(path: Path, dtype, device, backend: str) -> Cut:
    """The cut as a LlamaModel on `device` (dequantised by the GGUF loader's code path)."""
    with np.load(path) as z:
        meta = json.loads(bytes(z["__meta__"]).decode())
        arrays = {k: z[k] for k in z.files if not k.startswith("__")}
        logits = z["__logits__"]
    from servesim.gpu_runner.weights import Llama3RopeScaling, ModelConfig

    cfg = dict(meta["config"])
    if cfg.get("rope_scaling") is not None:
        cfg["rope_scaling"] = Llama3RopeScaling(**cfg["rope_scaling"])
    model = _model_from(ModelConfig(**cfg), arrays, meta["kinds"], dtype, device, backend)
    return Cut(model, list(meta["prompt_ids"]), logits)


def _model_from(config, arrays: dict, kinds: dict, dtype, device, backend: str = "torch"):
    import torch
    from gguf.quants import dequantize

    from servesim.gpu_runner.gguf_loader import weights_from_tensors
    from servesim.gpu_runner.model import LlamaModel

    tensors = {}
    for name, data in arrays.items():
        kind, *shape = kinds[name]
        arr = np.array(dequantize(data, kind), dtype=np.float32)
        tensors[name] = torch.from_numpy(arr.reshape(shape))
    weights = weights_from_tensors(config, tensors)
    if dtype != torch.float32 or torch.device(device).type != "cpu":
        weights = weights.to(dtype, device)
    return LlamaModel(config, weights, backend=backend)


def prefill_logits(model, ids: list[int]):
    """The last prompt token's logits [vocab] fp32 of a one-step prefill on a fresh cache."""
    import torch

    from servesim.gpu_runner.ops.testing import simple_metadata

    bs = 16
    model.allocate_kv_cache(2 + len(ids) // bs, bs)
    blocks = list(range(1, 2 + len(ids) // bs))
    pos, meta = simple_metadata([0], [len(ids)], [blocks], bs, device=model.device)
    hidden = model.forward(torch.tensor(ids, dtype=torch.int64, device=model.device), pos, meta)  # [T, hidden]
    return model.compute_logits(hidden[-1:])[0].float().cpu()  # [vocab]


def make_carry(dest: Path, gguf_path: Path | None = None) -> list[Path]:
    """Fill the carry folder `dest`: the package zips and the SmolLM2 cut. Returns the files."""
    dest.mkdir(parents=True, exist_ok=True)
    files = [zip_package(name, dest) for name in PURE_PACKAGES]
    files.append(make_cut(gguf_path, dest / CUT_NAME))
    return files
