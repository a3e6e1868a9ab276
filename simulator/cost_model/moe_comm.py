"""MoE dispatch and combine under data parallelism: vLLM's ``--all2all-backend``.

With ``--data-parallel-size N > 1`` the tokens of all DP ranks meet in every MoE layer: a dispatch
before the experts and a combine after them (vLLM 0.19.1, ``model_executor/layers/fused_moe/``).
Which collectives run is ``ParallelConfig.all2all_backend`` (``vllm/config/parallel.py``; default
``allgather_reducescatter``; docs "Expert Parallel Deployment", backend table). Priced here, per MoE
layer and step, for one rank:

* ``allgather_reducescatter`` (``AgRsAll2AllManager``; prepare/finalize ``naive_dp_ep.py``):
  dispatch = ``all_gatherv`` of every rank's hidden states plus top-k weights (fp32) and ids (int32),
  so every rank's experts see the whole wave's tokens; combine = ``reduce_scatterv`` of the
  expert output. Both are sized by the wave's tokens W (nccl-tests' convention: the gathered
  buffer, the reduce-scatter's whole input), from the measured NCCL ``all_gather`` /
  ``reduce_scatter`` tables of the GPU and group size (collectives.py), else the ring link model.
* ``naive`` and ``pplx``: vLLM 0.19.1 removed both (``ParallelConfig`` warns "has been removed.
  Falling back to 'allgather_reducescatter'"), so they are priced as that backend.
* ``deepep_low_latency`` / ``deepep_high_throughput``: DeepEP's dispatch + combine of this rank's
  tokens, from aiconfigurator's SGLang 0.5.12 DeepEP tables (``data/deepep_tables.json.gz``, built
  by ``tools/build_deepep_tables.py``: µs in the source, seconds here; HT at vLLM's 20 SMs) where
  the GPU (H100, H200, B200), the EP group (8 GPUs, the one node measured) and the MoE shape
  (hidden, top-k, experts) match; piecewise-linear in tokens per rank between the measured points
  (1, 2, 4, ... 1,024 for LL; up to 131,072 for HT), clamped below the first and extended with the
  slope of the upper half of the range above the last (``interp.Curve``). LL runs in chunks of
  ``VLLM_MOE_DP_CHUNK_SIZE`` = 256 tokens per rank (``default_moe_runner.use_dp_chunking``), each a
  dispatch + combine. Elsewhere: two all-to-alls (NCCL ``alltoall`` table, else the link model) of
  each token's hidden state once per destination rank (DeepEP sends a token to a rank once,
  whatever number of its experts live there): ``ep · (1 − (1 − 1/ep)^k)`` ranks on average under
  uniform routing.

Without ``--enable-expert-parallel`` vLLM falls back to all-gather + reduce-scatter over the DP
group whatever the backend (``all2all_utils.maybe_make_prepare_finalize``). With EP and TP > 1 the
MoE input is sequence-parallel (``ParallelConfig.use_sequence_parallel_moe``, for the backends
above): each of the ``ep = dp x tp`` ranks holds 1/tp of its DP rank's tokens.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from servesim.scheduler.errors import field_error
from servesim.scheduler.registry import Registry

from ..specs import GpuSpec, HostSpec, ModelSpec
from .collectives import Collectives
from .host_collectives import measured_group_sizes
from .interp import Curve

DEFAULT_ALL2ALL_BACKEND = "allgather_reducescatter"  # vLLM 0.19.1 ParallelConfig.all2all_backend
_DEEPEP_FILE = Path(__file__).with_name("data") / "deepep_tables.json.gz"
_LL_CHUNK_TOKENS = 256  # vLLM envs.VLLM_MOE_DP_CHUNK_SIZE: DeepEP LL dispatches at most this per rank
_TOPK_BYTES = 4 + 4  # per routed expert of a token: fp32 top-k weight + int32 expert id


@dataclass(slots=True, frozen=True)
class MoeDeployment:
    """What the dispatch/combine price depends on: the model, the GPU, the parallel sizes and how
    the interconnect is modelled (as for the TP collectives: explicit efficiency or latency, or
    ``use_tables=False``, ask for the link model; a host profile replaces what it measured)."""

    model: ModelSpec
    gpu: GpuSpec
    tp: int
    ep: int
    dp: int
    host: HostSpec | None = None  # the machine (specs/hosts.py); None: the GPU's default host
    interconnect_efficiency: float | None = None
    latency_s: float | None = None
    use_tables: bool = True
    collectives_profile: str | None = None  # this host's measured collectives (host_collectives.py)

    def collectives(self, num_gpus: int) -> Collectives:
        """The group's collectives; a host profile applies where it measured this group size (a
        DP group often spans more GPUs than one host measured: the shipped tables then)."""
        host = self.collectives_profile
        if host is not None and num_gpus not in measured_group_sizes(host):
            host = None
        return Collectives(self.gpu, num_gpus, host=self.host, interconnect_efficiency=self.interconnect_efficiency,
                           latency_s=self.latency_s, use_tables=self.use_tables, collectives_profile=host)

    @property
    def sequence_parallel(self) -> int:
        """Ranks one DP rank's tokens are split over before the dispatch (tp under EP, else 1)."""
        return self.tp if self.ep > 1 else 1

    @property
    def group(self) -> int:
        """Ranks of the dispatch group: the EP group, or the DP group without EP."""
        return self.ep if self.ep > 1 else self.dp


@dataclass(slots=True, frozen=True)
class MoeComm:
    """Seconds of one MoE layer's dispatch + combine on one rank.

    ``per_wave``: the curve's x is the wave's tokens (every DP rank's, all-gather style); otherwise
    this rank's tokens per EP rank (``ceil(tokens / sequence_parallel)``), in chunks of
    ``chunk_tokens`` when that is set."""

    curve: Curve
    per_wave: bool
    sequence_parallel: int
    chunk_tokens: int | None
    source: str

    def seconds(self, num_tokens: int, wave_tokens: int) -> float:
        if self.per_wave:
            return self.curve(wave_tokens)
        x = -(-num_tokens // self.sequence_parallel)
        if self.chunk_tokens is not None and x > self.chunk_tokens:
            full, rest = divmod(x, self.chunk_tokens)
            return full * self.curve(self.chunk_tokens) + (self.curve(rest) if rest else 0.0)
        return self.curve(x)


MoeCommBuilder = Callable[[MoeDeployment], MoeComm]
ALL2ALL_BACKENDS: Registry[MoeCommBuilder] = Registry("all2all backend", error=field_error("all2all_backend"))


def check_all2all_backend(name: str) -> None:
    """InputError (valid names, did-you-mean) unless ``name`` is a registered backend."""
    ALL2ALL_BACKENDS.get(name)


def moe_comm(backend: str, deployment: MoeDeployment) -> MoeComm | None:
    """The dispatch/combine of this deployment, or None when there is none (one DP rank: tokens
    never leave their rank; EP inside a TP group is combined by the TP all-reduce)."""
    if deployment.dp == 1:
        return None
    # vLLM: DP without EP always gathers and reduce-scatters, whatever --all2all-backend says
    return ALL2ALL_BACKENDS.get(backend if deployment.ep > 1 else DEFAULT_ALL2ALL_BACKEND)(deployment)


def _per_token(c: Curve, bytes_per_token: float) -> Curve:
    """A curve over message bytes as a curve over tokens (``bytes_per_token`` bytes each)."""
    return Curve([x / bytes_per_token for x in c.xs], c.ys, tail_slope=c.tail_slope * bytes_per_token)


@ALL2ALL_BACKENDS.register("allgather_reducescatter")
def _allgather_reducescatter(d: MoeDeployment) -> MoeComm:
    m, b = d.model, d.model.dtype_bytes
    group = d.collectives(d.group)
    dispatch = _per_token(group.allgather_curve, m.hidden_size * b + m.experts_per_token * _TOPK_BYTES)
    combine = _per_token(group.reducescatter_curve, m.hidden_size * b)
    src = group.source
    return MoeComm(Curve.combine([dispatch, combine], [1.0, 1.0]), True, d.sequence_parallel, None,
                   f"allgather_reducescatter over {d.group} GPUs: all_gather {src.allgather}, "
                   f"reduce_scatter {src.reducescatter}")


# vLLM 0.19.1 accepts these names and runs allgather_reducescatter instead (ParallelConfig).
ALL2ALL_BACKENDS.add("naive", _allgather_reducescatter)
ALL2ALL_BACKENDS.add("pplx", _allgather_reducescatter)


@cache
def _deepep_tables() -> dict[str, list]:
    if not _DEEPEP_FILE.is_file():
        return {}
    return json.loads(gzip.decompress(_DEEPEP_FILE.read_bytes()))["tables"]


def deepep_curve(mode: str, d: MoeDeployment) -> Curve | None:
    """The measured dispatch + combine of one layer (``mode`` ll or ht) over tokens per EP rank,
    or None when no table covers this GPU, EP size and MoE shape."""
    m = d.model
    key = "|".join(map(str, (d.gpu.name, mode, m.hidden_size, m.experts_per_token, m.num_experts, d.ep)))
    pts = _deepep_tables().get(key)
    return None if pts is None else Curve(pts[0], pts[1])


def _deepep(mode: str, d: MoeDeployment) -> MoeComm:
    chunk = _LL_CHUNK_TOKENS if mode == "ll" else None
    name = {"ll": "deepep_low_latency", "ht": "deepep_high_throughput"}[mode]
    curve = deepep_curve(mode, d)
    if curve is not None:
        return MoeComm(curve, False, d.sequence_parallel, chunk,
                       f"{name}: measured (aiconfigurator SGLang 0.5.12 DeepEP, EP {d.ep})")
    m, ep = d.model, d.ep
    # each token's hidden state goes once to every rank holding one of its k experts
    ranks_per_token = ep * (1.0 - (1.0 - 1.0 / ep) ** m.experts_per_token)
    group = d.collectives(ep)
    a2a = _per_token(group.alltoall_curve, ranks_per_token * m.hidden_size * m.dtype_bytes)
    return MoeComm(Curve.combine([a2a], [2.0]), False, d.sequence_parallel, chunk,
                   f"{name}: no DeepEP table for {d.gpu.name}, EP {ep}, this shape; "
                   f"2 all-to-alls, {group.source.alltoall}")


ALL2ALL_BACKENDS.add("deepep_low_latency", lambda d: _deepep("ll", d))
ALL2ALL_BACKENDS.add("deepep_high_throughput", lambda d: _deepep("ht", d))
