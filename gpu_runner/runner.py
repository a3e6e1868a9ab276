"""GpuExecutor: runs the same SchedulerOutputs as the simulator on a real model (CUDA or CPU).

execute(scheduler_output) -> (model_runner_output, step_time_s), like simulator.executor.SimExecutor.
Sampled tokens come from the shared token source (scheduler.worker) so the scheduler sees the same
outputs in both modes; `sampling="greedy"` samples real argmax tokens instead (free-running output).
The clock: "model" returns the cost model's prediction (the SimPy clock then matches --executor sim
exactly), "measured" the measured GPU time. Every step's predicted and measured times are kept.

The requests' sampling parameters (SimConfig.sampling) reach the runner as `top_p`: below 1 the
measured step runs vLLM's top-p sort path on the real logits (sort the whole [rows, vocab] fp32
logits, softmax, cumulative sum, mask, scatter back), so a measured clock and a calibration run
include what that path costs; `sampler_s` is the cost model's price of it, added to the
prediction exactly as SimExecutor adds it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from servesim.gpu_runner.inputs import PersistentBatch
from servesim.gpu_runner.model import LlamaModel
from servesim.scheduler.output import ModelRunnerOutput, SchedulerOutput
from servesim.scheduler.step_shape import StepShape
from servesim.scheduler.worker import BatchTracker, TokenSource


@dataclass(slots=True)
class StepTiming:
    num_tokens: int
    num_requests: int
    prepare_s: float  # host-side input preparation
    measured_s: float  # forward + logits (CUDA events on a GPU, perf_counter on CPU)
    predicted_s: float | None  # the cost model's prediction, when one is attached
    shape: StepShape  # the batch, as the cost models price it (any model can price it again)


def require_device(device: str) -> torch.device:
    """The device to run on, or a clear refusal naming what is missing."""
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            reason = "torch has no CUDA support (a CPU build is installed)" if torch.version.cuda is None \
                else "no CUDA device is visible"
            raise RuntimeError(f"--device {device} needs a CUDA GPU, but {reason}; use --device cpu for a "
                               f"functional run (times are then CPU times)")
        try:
            import triton  # noqa: F401
        except ImportError:
            raise RuntimeError("--device cuda needs triton (pip install 'servesim[gpu]')") from None
    elif device != "cpu":
        raise RuntimeError(f"unknown device {device!r} (allowed: cpu, cuda, cuda:N)")
    return torch.device(device)


class GpuExecutor:
    def __init__(self, model: LlamaModel, num_blocks: int, block_size: int, tokens: TokenSource,
                 num_spec_tokens: int = 0, cost_model=None, clock: str = "model", sampling: str = "source",
                 top_p: float = 1.0, sampler_s: Callable[[int], float] | None = None):
        if clock not in ("model", "measured"):
            raise ValueError(f"clock must be 'model' or 'measured', got {clock!r}")
        if clock == "model" and cost_model is None:
            raise ValueError("clock='model' needs a cost model")
        if sampling not in ("source", "greedy"):
            raise ValueError(f"sampling must be 'source' or 'greedy', got {sampling!r}")
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
        self.model = model
        self.device = model.device
        model.allocate_kv_cache(num_blocks, block_size)
        self.batch = PersistentBatch(block_size, model.config.vocab_size, self.device)
        self.tracker = BatchTracker(tokens, num_spec_tokens)
        self.cost_model = cost_model
        self.clock = clock
        self.sampling = sampling
        self.top_p = top_p  # < 1: every measured step runs the top-p sort path on its logits
        self.sampler_s = sampler_s  # sampled rows -> seconds the prediction adds (SamplerCost.seconds)
        self.timings: list[StepTiming] = []
        if self.device.type == "cuda":
            self.warmup()  # compile every kernel specialisation before anything is timed

    def warmup(self) -> int:
        """Run synthetic steps covering the kernel specialisations a replay meets (decode-only,
        prefill-only, mixed; odd and power-of-two token counts), so Triton compiles them now and
        not inside a measured step. Writes only blocks that real steps overwrite before reading.
        Returns the number of warm-up forwards."""
        from servesim.gpu_runner.calibrate import _paged_metadata

        bs = self.batch.block_size
        shapes = [([1], [0]), ([1] * 3, [5] * 3), ([1] * 16, [bs] * 16), ([17], [0]), ([64], [bs]),
                  ([1, 1, 33], [7, 9, 0])]
        n = 0
        for chunks, prefixes in shapes:
            meta = _paged_metadata(chunks, prefixes, bs, self.device)
            if int(meta.block_table.max()) >= len(self.model.kv_caches[0].key):
                continue  # a pool too small for this shape: skip it
            ids = torch.zeros(meta.num_tokens, dtype=torch.int64, device=self.device)
            pos = torch.cat([torch.arange(p, p + q, device=self.device) for q, p in zip(chunks, prefixes)])
            last = (meta.query_start_loc[1:] - 1).long()
            self.model.compute_logits(self.model.forward(ids, pos, meta)[last])  # [S, vocab]
            n += 1
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return n

    def output_token_source(self, request_id: str) -> bytes | None:
        """Sampling from the token source: its stream; greedy: the model's choice, not known ahead."""
        return self.tracker.tokens.output_source(request_id) if self.sampling == "source" else None

    def execute(self, so: SchedulerOutput) -> tuple[ModelRunnerOutput, float]:
        t0 = time.perf_counter()
        req_ids, new, ctx, sample = self.tracker.prepare(so)
        self.batch.update(so)
        if not req_ids:
            return self.tracker.sample(so, req_ids, sample), 0.0
        inputs = self.batch.build(so, ctx)
        prepare_s = time.perf_counter() - t0
        logits, measured_s = self._forward(inputs)
        chosen = None
        if self.sampling == "greedy":
            top = logits.argmax(dim=-1).tolist()  # [S]
            chosen = {rid: int(top[i]) for i, rid in enumerate(req_ids) if sample[i]}
        out = self.tracker.sample(so, req_ids, sample, chosen)
        for rid, toks in zip(out.req_ids, out.sampled_token_ids):
            if toks:
                self.batch.append_tokens(rid, toks)
        predicted = None
        shape = StepShape(tuple(new), tuple(ctx), sum(sample))
        if self.cost_model is not None:
            predicted = self.cost_model.step_time_s(shape)
            if self.sampler_s is not None and shape.num_sampled:  # SimExecutor.execute's sum, in its order
                predicted += self.sampler_s(shape.num_sampled)
        self.timings.append(StepTiming(sum(new), len(new), prepare_s, measured_s, predicted, shape))
        return out, predicted if self.clock == "model" else measured_s

    def _forward(self, inputs) -> tuple[torch.Tensor, float]:
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            hidden = self.model.forward(inputs.input_ids, inputs.positions, inputs.attn)  # [T, hidden]
            logits = self.model.compute_logits(hidden[inputs.logits_indices])  # [S, vocab]
            if self.top_p < 1.0:
                top_p_sort_path(logits, self.top_p)
            end.record()
            torch.cuda.synchronize()
            return logits, start.elapsed_time(end) / 1e3
        t0 = time.perf_counter()
        hidden = self.model.forward(inputs.input_ids, inputs.positions, inputs.attn)
        logits = self.model.compute_logits(hidden[inputs.logits_indices])
        if self.top_p < 1.0:
            top_p_sort_path(logits, self.top_p)
        return logits, time.perf_counter() - t0


def top_p_sort_path(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """vLLM's top-p filter as its default sampler runs it (0.15-0.19, no FlashInfer): an ascending
    sort of every row over the whole vocabulary, a softmax and cumulative sum of the sorted row,
    the tokens whose cumulative mass stays within 1 - top_p masked to -inf (never the most
    probable), and the result scattered back to vocabulary order. Returns the filtered logits
    [S, vocab] (a new tensor; `logits` is left as it is: the token choice reads the original)."""
    sorted_logits, order = logits.sort(dim=-1, descending=False)  # [S, vocab] each
    cum_probs = sorted_logits.softmax(dim=-1).cumsum(dim=-1)  # [S, vocab]
    drop = cum_probs <= 1.0 - top_p  # [S, vocab] bool
    drop[:, -1] = False  # the most probable token always stays
    sorted_logits.masked_fill_(drop, -float("inf"))
    return sorted_logits.scatter(dim=-1, index=order, src=sorted_logits)
