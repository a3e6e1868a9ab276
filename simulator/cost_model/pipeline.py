"""Pipeline parallelism: a step's GPU time split over its pipeline stages.

Each stage runs its share of the decoder layers (specs/pipeline_stages.py: vLLM's even split,
the remainder to the stages before the last) with tensor parallelism inside the stage. The first
stage also embeds the tokens; the last applies the final norm, the lm_head and the sampler. A
stage hands its activations to the next: vLLM sends the IntermediateTensors (hidden states and
the residual, tokens x hidden each, in the activation dtype) point to point, each TP rank
sending its 1/tp slice, and the receiving stage all-gathers the slices over its TP group
(`send_tensor_dict(..., all_gather_group=tp_group)`). The send is priced from the measured
send/recv table where one ships (Vidur's A100 / H100) or this host's (collectives_profile), else
the link model; the all-gather from the NCCL all_gather table or the ring model (collectives.py),
both from the cost model's own TP-group collectives.

The engine (simulator/engine.py with simulator/pipeline_clock.py) keeps one batch per stage in
flight: a batch enters a stage when the stage is free and the batch left the previous one.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from servesim.simulator.cost_model.base import CostModel, StepShape
from servesim.simulator.cost_model.collectives import Collectives
from servesim.simulator.specs import resolve_model
from servesim.simulator.specs.pipeline_stages import pp_layer_partition
from servesim.traces.errors import InputError

LAYER_PARTS = ("gemm", "attention", "elementwise", "allreduce")
FIRST_STAGE_PARTS = ("embedding",)
LAST_STAGE_PARTS = ("final_norm", "lm_head", "sampler")


@runtime_checkable
class StepBreakdown(Protocol):
    """A cost model that can say where a step's time goes (what pipeline parallelism needs)."""

    # its TP group's collectives: send_recv_s and allgather_s price a stage's hand-off (so a host
    # profile or an interconnect override given to the model applies to the hand-off too)
    collectives: Collectives

    def breakdown(self, shape: StepShape) -> dict[str, float]:
        """Seconds per part of the whole step, summing to step_time_s(shape): the decoder layers'
        parts summed over every layer (LAYER_PARTS) and the parts outside them (embedding,
        final_norm, lm_head, sampler); {} for a step with no tokens."""
        ...


class PipelineCost:
    """GPU seconds of each pipeline stage for one step."""

    __slots__ = ("cost_model", "pp", "tp", "_layer_share", "_act_bytes_per_token", "_send", "_gather")

    def __init__(self, cost_model: CostModel, model: object, tp: int, pp: int) -> None:
        if not isinstance(cost_model, StepBreakdown):
            raise InputError(f"the {cost_model.name!r} cost model cannot split a step over pipeline stages",
                             field="cost_model", allowed="roofline (prices each part of a step), or hardware.pp: 1")
        m = resolve_model(model)
        self.cost_model = cost_model
        self.pp, self.tp = pp, tp
        # fraction of the decoder layers' time each stage runs (the layers cost alike)
        self._layer_share = [n / m.num_layers for n in pp_layer_partition(m.num_layers, pp)]
        # hidden states + residual, one row per token (the whole tensor; each TP rank sends 1/tp)
        self._act_bytes_per_token = 2 * m.hidden_size * m.dtype_bytes
        self._send = cost_model.collectives.send_recv_s
        self._gather = cost_model.collectives.allgather_s if tp > 1 else None

    def stage_times_s(self, shape: StepShape, extra_last_s: float = 0.0) -> list[float]:
        """Seconds each stage is busy with this step, first to last, hand-offs included
        (``extra_last_s``: sampler time the executor adds beyond the cost model's)."""
        parts = self.cost_model.breakdown(shape)
        if not parts:
            return [0.0] * self.pp
        layers = sum(parts[k] for k in LAYER_PARTS)
        times = [layers * share for share in self._layer_share]
        times[0] += sum(parts[k] for k in FIRST_STAGE_PARTS)
        times[-1] += sum(parts[k] for k in LAST_STAGE_PARTS) + extra_last_s
        nbytes = sum(shape.num_new_tokens) * self._act_bytes_per_token
        send = self._send(nbytes / self.tp)  # each rank's slice, to its peer in the next stage
        gather = self._gather(nbytes) if self._gather is not None else 0.0  # the slices reassembled
        for s in range(self.pp - 1):
            times[s] += send
            times[s + 1] += gather
        return times
