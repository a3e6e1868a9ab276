"""Calibration sweep: time operations and whole steps of a real model, as profile rows.

Rows follow the simulator's profile schema (docs/PROFILE_SCHEMA.md; source "servesim"): dense ops by
token count, attention by chunk x prefix (prefill) and batch x context (decode), and whole steps
(model_prefill / model_decode) that the calibration report uses to check a fitted model.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from servesim.gpu_runner import ops
from servesim.gpu_runner.model import LlamaModel, rms_norm
from servesim.gpu_runner.ops.metadata import AttentionMetadata


@dataclass(slots=True, frozen=True)
class CalibrationGrid:
    token_counts: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
    prefill_chunks: tuple[int, ...] = (16, 64, 256, 1024, 2048)
    prefill_prefixes: tuple[int, ...] = (0, 512, 2048, 8192)
    decode_batches: tuple[int, ...] = (1, 4, 16, 64, 128, 256)
    decode_contexts: tuple[int, ...] = (128, 512, 2048, 8192)
    repeats: int = 10  # timed runs per point (median kept)
    warmup: int = 3

    @classmethod
    def quick(cls) -> CalibrationGrid:
        """A few points: for tests and CPU smoke runs."""
        return cls((1, 8, 64), (16, 64), (0, 64), (1, 4), (32, 128), repeats=2, warmup=1)


class Timer:
    """Median seconds per call of a point's function.

    On a GPU with ``graphs`` (the default) the function is captured once as a CUDA graph and the
    replays are timed between CUDA events: the GPU's own time, as vLLM's graph-replayed steps run.
    Timing one eager call instead records the host's dispatch wherever Python issues kernels slower
    than the GPU runs them: on an H200 an 8B decode step took 18-39 ms eagerly at every batch size and
    7-12 ms replayed (docs/GPU_RUNNER.md, "Results on a GPU"). ``graphs=False`` times eager calls
    (the CPU always does, with perf_counter)."""

    def __init__(self, device: torch.device, repeats: int, warmup: int, graphs: bool = True) -> None:
        self.device, self.repeats, self.warmup = device, repeats, warmup
        self.graphs = graphs and device.type == "cuda"

    @property
    def how(self) -> str:
        return "CUDA graph replay" if self.graphs else "eager"

    def __call__(self, fn: Callable[[], object]) -> float:
        if self.graphs:
            return self._replayed(fn)
        for _ in range(self.warmup):
            fn()
        times = []
        for _ in range(self.repeats):
            if self.device.type == "cuda":
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                torch.cuda.synchronize()
                times.append(a.elapsed_time(b) / 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        return _median(times)

    def _replayed(self, fn: Callable[[], object]) -> float:
        # Warm on a side stream first (torch's rule for capture: Triton compiles and cuBLAS picks
        # its kernels there, never inside the capture).
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(max(1, self.warmup)):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                fn()
        except RuntimeError as e:
            raise RuntimeError(f"this point could not be captured as a CUDA graph ({e}); "
                               "`servesim calibrate --eager-timing` times eager calls instead") from e
        graph.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(self.repeats):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            graph.replay()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        del graph  # its memory pool goes back before the next point's capture
        return _median(times)


def _median(times: list[float]) -> float:
    times.sort()
    return times[len(times) // 2]


def _paged_metadata(chunks: list[int], prefixes: list[int], block_size: int, device) -> AttentionMetadata:
    """Sequences laid out on consecutive blocks from block 1 (block 0 is the null block)."""
    slots, qsl, seq_lens, tables = [], [0], [], []
    next_block = 1
    for n, p in zip(chunks, prefixes):
        total = p + n
        nb = -(-total // block_size)
        blocks = list(range(next_block, next_block + nb))
        next_block += nb
        tables.append(blocks)
        slots.extend(blocks[q // block_size] * block_size + q % block_size for q in range(p, total))
        qsl.append(qsl[-1] + n)
        seq_lens.append(total)
    width = max(len(t) for t in tables)
    table = torch.zeros((len(tables), width), dtype=torch.int32)
    for i, t in enumerate(tables):
        table[i, : len(t)] = torch.tensor(t, dtype=torch.int32)
    return AttentionMetadata(torch.tensor(slots, dtype=torch.int64, device=device),
                             torch.tensor(qsl, dtype=torch.int32, device=device),
                             torch.tensor(seq_lens, dtype=torch.int32, device=device), table.to(device),
                             max(chunks), max(seq_lens))


def calibrate(model: LlamaModel, model_name: str, gpu_name: str, grid: CalibrationGrid, block_size: int = 16,
              progress: Callable[[str], None] | None = None, graphs: bool = True) -> list[dict]:
    """Profile rows for every grid point; on a GPU each point timed by CUDA graph replay unless
    ``graphs`` is False (Timer). The rows' ``framework`` says which."""
    c, dev, dt = model.config, model.device, model.dtype
    timer = Timer(dev, grid.repeats, grid.warmup, graphs)
    dtype_name = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[dt]
    base = {"source": "servesim", "gpu": gpu_name, "model": model_name, "tp": 1, "dtype": dtype_name,
            "framework": f"servesim {model.backend}" + (f" ({timer.how})" if dev.type == "cuda" else ""), "device": str(torch.cuda.get_device_name(dev)) if dev.type == "cuda" else "cpu"}
    rows: list[dict] = []
    lw = model.weights.layers[0]
    for n in grid.token_counts:
        x = torch.randn(n, c.hidden_size, dtype=dt, device=dev)  # [n, hidden]
        h = torch.randn(n, c.intermediate_size, dtype=dt, device=dev)  # [n, I]
        o = torch.randn(n, c.q_size, dtype=dt, device=dev)  # [n, q_size]
        gu = torch.randn(n, 2 * c.intermediate_size, dtype=dt, device=dev)  # [n, 2I]
        ids = torch.randint(0, c.vocab_size, (n,), device=dev)
        head = model.weights.embed if model.weights.lm_head is None else model.weights.lm_head
        for op, fn in (("qkv_proj", lambda: F.linear(x, lw.qkv_proj)), ("o_proj", lambda: F.linear(o, lw.o_proj)),
                       ("gate_up_proj", lambda: F.linear(x, lw.gate_up_proj)), ("down_proj", lambda: F.linear(h, lw.down_proj)),
                       ("norm", lambda: rms_norm(x, lw.attn_norm, c.rms_eps)),
                       ("act", lambda: F.silu(gu[:, : c.intermediate_size]) * gu[:, c.intermediate_size:]),
                       ("embedding", lambda: F.embedding(ids, model.weights.embed)),
                       ("final_norm", lambda: rms_norm(x, model.weights.final_norm, c.rms_eps)),
                       ("lm_head", lambda: F.linear(x, head))):
            rows.append({**base, "op": op, "num_tokens": n, "latency_s": timer(fn)})
        if progress:
            progress(f"dense ops at {n} tokens")
    rows += _attention_rows(model, grid, block_size, timer, base, progress)
    rows += _step_rows(model, grid, block_size, timer, base, progress)
    return rows


def _attention_rows(model, grid, block_size, timer, base, progress) -> list[dict]:
    c, dev, dt = model.config, model.device, model.dtype
    nb = 1 + max(-(-(p + n) // block_size) for p in grid.prefill_prefixes for n in grid.prefill_chunks)
    nb = max(nb, 1 + max(b * -(-(L + 1) // block_size) for b in grid.decode_batches for L in grid.decode_contexts))
    shape = (nb, block_size, c.num_kv_heads, c.head_dim)
    kc, vc = torch.randn(shape, dtype=dt, device=dev), torch.randn(shape, dtype=dt, device=dev)
    rows = []

    def attn(chunks, prefixes):
        meta = _paged_metadata(chunks, prefixes, block_size, dev)
        q = torch.randn(meta.num_tokens, c.num_heads, c.head_dim, dtype=dt, device=dev)  # [T, H, D]
        out = torch.empty_like(q)
        return lambda: ops.unified_attention(q, kc, vc, out, meta.query_start_loc, meta.seq_lens, meta.block_table,
                                             c.head_dim ** -0.5, backend=model.backend)

    heads = {"num_heads": c.num_heads, "num_kv_heads": c.num_kv_heads, "head_dim": c.head_dim}
    for n in grid.prefill_chunks:
        for p in grid.prefill_prefixes:
            rows.append({**base, **heads, "op": "attn_prefill", "batch_size": 1, "chunk_len": n, "prefix_len": p,
                         "latency_s": timer(attn([n], [p]))})
    for b in grid.decode_batches:
        for L in grid.decode_contexts:
            rows.append({**base, **heads, "op": "attn_decode", "batch_size": b, "context_len": L,
                         "latency_s": timer(attn([1] * b, [L] * b))})
        if progress:
            progress(f"decode attention at batch {b}")
    return rows


def whole_step(model: LlamaModel, chunks: list[int], prefixes: list[int], block_size: int) -> Callable[[], object]:
    """One step's forward + logits over the model's allocated caches, as a call to time: request i
    computes chunks[i] tokens over prefixes[i] cached ones (random ids; _paged_metadata's layout),
    its last token's logits sampled."""
    dev = model.device
    meta = _paged_metadata(chunks, prefixes, block_size, dev)
    ids = torch.randint(0, model.config.vocab_size, (meta.num_tokens,), device=dev)  # [T]
    pos = torch.cat([torch.arange(p, p + n, device=dev) for n, p in zip(chunks, prefixes)])  # [T]
    last = (meta.query_start_loc[1:] - 1).long()  # [S]
    return lambda: model.compute_logits(model.forward(ids, pos, meta)[last])  # [S, vocab]


def _step_rows(model, grid, block_size, timer, base, progress) -> list[dict]:
    """Whole forward passes: the ground truth the calibration report checks predictions against."""
    rows = []
    needed = 1 + max(max(b * -(-(L + 1) // block_size) for b in grid.decode_batches for L in grid.decode_contexts),
                     max(-(-n // block_size) for n in grid.prefill_chunks))
    model.allocate_kv_cache(needed, block_size)

    def step(chunks, prefixes):
        return whole_step(model, chunks, prefixes, block_size)

    for n in grid.prefill_chunks:
        rows.append({**base, "op": "model_prefill", "batch_size": 1, "chunk_len": n, "prefix_len": 0,
                     "latency_s": timer(step([n], [0]))})
    for b in grid.decode_batches:
        for L in grid.decode_contexts:
            rows.append({**base, "op": "model_decode", "batch_size": b, "context_len": L,
                         "latency_s": timer(step([1] * b, [L] * b))})
    if progress:
        progress("whole steps")
    return rows
