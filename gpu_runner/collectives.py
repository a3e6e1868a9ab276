"""Collective microbenchmark: this machine's GPUs' collectives, as profile rows.

What a deployment communicates: TP all-reduce; all-gather (vocab-parallel logits, a pipeline
stage's hand-off, MoE dispatch under data parallelism); reduce-scatter (MoE combine); all-to-all
(DeepEP-style expert parallelism); send/recv (a pipeline stage's hand-off).

One process per GPU (torch.distributed; NCCL on CUDA, gloo on the CPU, which is for tests only: its
times say nothing about a GPU). For each group size the first ``n`` ranks form a group and time each
op over a doubling sweep of message sizes in the model's dtype. Like nccl-tests, one sample times
``calls`` back-to-back calls between CUDA events and divides (a single small collective is shorter
than the timer's noise); the median of ``samples`` samples is kept per rank, and the ranks' medians
are averaged (nccl-tests' default ``-a 1``). Sizes and bandwidths follow nccl-tests (its
PERFORMANCE.md): algbw = bytes / time; busbw = algbw * 2(n-1)/n for all-reduce, * (n-1)/n for
all-gather (bytes: the gathered output, as ``all_gather_perf``), reduce-scatter (bytes: the whole
input) and all-to-all (bytes: each rank's send buffer), and * 1 for send/recv, where each rank
sends ``bytes`` to the next rank of the group and receives as much from the previous one
(``sendrecv_perf``).

Rows follow the profile schema (docs/PROFILE_SCHEMA.md): op ``allreduce`` / ``allgather`` /
``reducescatter`` / ``alltoall`` / ``sendrecv``, ``tp`` =
group size, ``bytes``, ``latency_s``, ``algbw_gb_s``, ``busbw_gb_s``; the same rows the nccl-tests
importer makes, so ``allreduce_profile=`` and ``servesim fit`` read them alike.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
OPS = ("allreduce", "allgather", "reducescatter", "alltoall", "sendrecv")
# nccl-tests' bus-bandwidth factor per op: the bytes each GPU's link carries per byte of message.
_BUS_FACTOR: dict[str, Callable[[int], float]] = {"allreduce": lambda n: 2.0 * (n - 1) / n,
                                                  "allgather": lambda n: (n - 1) / n,
                                                  "reducescatter": lambda n: (n - 1) / n,
                                                  "alltoall": lambda n: (n - 1) / n,
                                                  "sendrecv": lambda n: 1.0}
_KERNELS = {"allreduce": "all_reduce", "allgather": "all_gather_into_tensor",
            "reducescatter": "reduce_scatter_tensor", "alltoall": "all_to_all_single",
            "sendrecv": "isend + irecv (ring)"}


@dataclass(slots=True, frozen=True)
class CollectiveGrid:
    """Message sizes (powers of two, bytes) and how many calls are timed per size."""

    min_bytes: int = 4 * 1024
    max_bytes: int = 256 * 2**20
    warmup: int = 5  # untimed calls per size (the first one also builds NCCL's communicator)
    samples: int = 10  # timed samples per size; the median is kept
    calls: int = 10  # back-to-back calls per sample
    ops: tuple[str, ...] = OPS

    @classmethod
    def quick(cls) -> CollectiveGrid:
        """A few small sizes: for tests and CPU smoke runs."""
        return cls(min_bytes=1024, max_bytes=8 * 1024, warmup=1, samples=3, calls=2)

    def sizes_bytes(self) -> list[int]:
        sizes, b = [], self.min_bytes
        while b <= self.max_bytes:
            sizes.append(b)
            b *= 2
        return sizes


def group_sizes(device: str, tp_sizes: list[int] | None) -> list[int]:
    """The group sizes to measure, or a ValueError naming what is missing. CUDA: all of 2..visible
    GPUs by default; CPU (gloo, testing only): 2 unless given."""
    if device == "cuda":
        visible = torch.cuda.device_count()
        if visible < 2:
            why = "torch has no CUDA support (a CPU build is installed)" if torch.version.cuda is None \
                else f"{visible} CUDA GPU{'' if visible == 1 else 's'} visible (CUDA_VISIBLE_DEVICES=" \
                     f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})"
            raise ValueError(f"measuring collectives needs at least 2 CUDA GPUs, but {why}; pass "
                             "all_reduce_perf output measured on the serving machine with --nccl-tests "
                             "instead, or --device cpu for a gloo test run")
        sizes = tp_sizes or list(range(2, visible + 1))
        if max(sizes) > visible:
            raise ValueError(f"group size {max(sizes)} needs {max(sizes)} GPUs, {visible} visible")
    elif device == "cpu":
        sizes = tp_sizes or [2]
    else:
        raise ValueError(f"unknown device {device!r} (allowed: cuda, cpu)")
    if min(sizes) < 2:
        raise ValueError(f"a collective needs a group of 2 or more, got {min(sizes)}")
    return sorted(set(sizes))


def measure_collectives(sizes: list[int], device: str = "cuda", dtype: str = "bf16",
                        grid: CollectiveGrid | None = None, gpu_label: str = "",
                        verbose: bool = False) -> list[dict]:
    """Time ``grid.ops`` for each group size in ``sizes`` (from :func:`group_sizes`); profile rows.

    Spawns max(sizes) processes (spawn, not fork: the caller may hold a CUDA context) that meet in a
    file store under a temporary folder; rank 0 writes the rows there. A failing rank raises
    RuntimeError with its last error line."""
    import torch.multiprocessing as mp

    grid = grid or CollectiveGrid()
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r} (allowed: {', '.join(DTYPES)})")
    if unknown := sorted(set(grid.ops) - set(OPS)):
        raise ValueError(f"unknown collective(s) {unknown} (allowed: {', '.join(OPS)})")
    with tempfile.TemporaryDirectory(prefix="servesim-collectives-") as tmp:
        job = _Job(str(Path(tmp) / "store"), str(Path(tmp) / "rows.json"), max(sizes), sorted(sizes),
                   device, dtype, asdict(grid), gpu_label, verbose)
        try:
            mp.spawn(_worker, args=(job,), nprocs=job.world_size, join=True)
        except mp.ProcessRaisedException as exc:
            last = str(exc).strip().splitlines()[-1]
            raise RuntimeError(f"collective benchmark failed: {last}") from None
        except mp.ProcessExitedException as exc:
            raise RuntimeError(f"collective benchmark failed: {exc}") from None
        return json.loads(Path(job.result_path).read_text())


@dataclass(slots=True, frozen=True)
class _Job:
    store_path: str
    result_path: str
    world_size: int
    sizes: list[int]
    device: str
    dtype: str
    grid: dict
    gpu_label: str
    verbose: bool


def _worker(rank: int, job: _Job) -> None:
    import torch.distributed as dist

    grid = CollectiveGrid(**{**job.grid, "ops": tuple(job.grid["ops"])})
    if job.device == "cuda":
        torch.cuda.set_device(rank)
        dev = torch.device("cuda", rank)
        dist.init_process_group("nccl", init_method=f"file://{job.store_path}", rank=rank,
                                world_size=job.world_size, device_id=dev)
    else:
        dev = torch.device("cpu")
        dist.init_process_group("gloo", init_method=f"file://{job.store_path}", rank=rank,
                                world_size=job.world_size)
    try:
        rows = []
        for n in job.sizes:
            # new_group is collective over the whole world: every rank creates every group.
            group = dist.group.WORLD if n == job.world_size else dist.new_group(list(range(n)))
            if rank < n:
                rows += _measure_group(rank, n, group, dev, job, grid)
            dist.barrier()
        if rank == 0:
            tmp = Path(job.result_path + ".tmp")
            tmp.write_text(json.dumps(rows))
            tmp.replace(job.result_path)
    finally:
        dist.destroy_process_group()


def _measure_group(rank: int, n: int, group, dev: torch.device, job: _Job, grid: CollectiveGrid) -> list[dict]:
    import torch.distributed as dist

    dt = DTYPES[job.dtype]
    elem = torch.empty((), dtype=dt).element_size()
    label = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    backend = dist.get_backend(group)
    version = ".".join(map(str, torch.cuda.nccl.version())) if backend == "nccl" else ""
    base = {"source": "servesim", "gpu": job.gpu_label, "model": "", "tp": n, "dtype": job.dtype,
            "device": label, "framework": f"torch {torch.__version__} {backend} {version}".strip()}
    rows = []
    for op in grid.ops:
        points = []
        for size in grid.sizes_bytes():
            # all-gather: each rank sends size/n; reduce-scatter and all-to-all split a buffer of
            # size in n; nccl-tests rounds the count down to a multiple of n in all three.
            per_rank = op in ("allgather", "reducescatter", "alltoall")
            count = max(1, size // elem // n) if per_rank else max(1, size // elem)
            nbytes = count * elem * (n if per_rank else 1)
            points.append((nbytes, _time_op(op, count, n, group, dev, dt, grid)))
        kernel = "torch.distributed " + _KERNELS[op]
        # The group's time per size: the ranks' medians averaged (nccl-tests' default, -a 1).
        times = torch.tensor([t for _, t in points], dtype=torch.float64, device=dev)
        dist.all_reduce(times, group=group)
        for (nbytes, _), total in zip(points, times.tolist()):
            t = total / n
            algbw = nbytes / t / 1e9
            rows.append({**base, "op": op, "bytes": nbytes, "latency_s": t, "kernel": kernel,
                         "algbw_gb_s": algbw, "busbw_gb_s": algbw * _BUS_FACTOR[op](n)})
        if rank == 0 and job.verbose:
            print(f"  {op} over {n} ranks: {len(points)} sizes", file=sys.stderr, flush=True)
    return rows


def _op_call(op: str, count: int, n: int, group, dev: torch.device, dt: torch.dtype) -> Callable[[], None]:
    """One call of op; ``count`` elements: the message (all-reduce, send/recv) or one rank's share."""
    import torch.distributed as dist

    if op == "allreduce":
        x = torch.zeros(count, dtype=dt, device=dev)  # zeros: repeated sums never overflow to inf
        return lambda: dist.all_reduce(x, group=group)
    if op == "sendrecv":  # a ring: each rank to the next, from the previous (sendrecv_perf)
        rank = dist.get_rank(group)
        nxt, prev = dist.get_global_rank(group, (rank + 1) % n), dist.get_global_rank(group, (rank - 1) % n)
        x, y = torch.zeros(count, dtype=dt, device=dev), torch.empty(count, dtype=dt, device=dev)

        def ring() -> None:
            for req in (dist.isend(x, nxt, group=group), dist.irecv(y, prev, group=group)):
                req.wait()
        return ring
    small, big = torch.zeros(count, dtype=dt, device=dev), torch.zeros(count * n, dtype=dt, device=dev)
    if op == "alltoall":
        out = torch.empty_like(big)
        return lambda: dist.all_to_all_single(out, big, group=group)
    if op == "reducescatter":
        return lambda: dist.reduce_scatter_tensor(small, big, group=group)

    def gather() -> None:
        with warnings.catch_warnings():  # deprecated in torch 2.13 for all_gather_single, absent in 2.11
            warnings.simplefilter("ignore", FutureWarning)
            dist.all_gather_into_tensor(big, small, group=group)
    return gather


def _time_op(op: str, count: int, n: int, group, dev: torch.device, dt: torch.dtype, grid: CollectiveGrid) -> float:
    """Median seconds per call on this rank."""
    import torch.distributed as dist

    call = _op_call(op, count, n, group, dev, dt)
    for _ in range(grid.warmup):
        call()
    samples = []
    for _ in range(grid.samples):
        dist.barrier(group=group)  # start together: a late rank would be timed as collective time
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(grid.calls):
                call()
            b.record()
            b.synchronize()
            samples.append(a.elapsed_time(b) / 1e3 / grid.calls)
        else:  # gloo collectives return when done
            t0 = time.perf_counter()
            for _ in range(grid.calls):
                call()
            samples.append((time.perf_counter() - t0) / grid.calls)
    samples.sort()
    return samples[len(samples) // 2]
