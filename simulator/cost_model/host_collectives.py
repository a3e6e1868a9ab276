"""This host's collectives, measured: `servesim calibrate --collectives` profiles or nccl-tests output.

`collectives_profile` (roofline parameter) names such a file; every op it holds replaces the shipped
table or the link model for the group (collectives.py): ``allreduce`` (with vLLM's custom
all-reduce below its buffer size kept from the shipped tables, as `allreduce_profile` does),
``allgather``, ``reducescatter`` and ``alltoall`` at the group's size, and ``sendrecv`` (a pipeline
hand-off between two GPUs: the pair's rows, else the smallest group measured). Sizes are
nccl-tests' (importers/nccl_tests.py; gpu_runner/collectives.py writes the same).
"""

from __future__ import annotations

from pathlib import Path

from servesim.traces.errors import InputError

GROUP_OPS = ("allreduce", "allgather", "reducescatter", "alltoall")


def host_tables(path: str | Path, num_gpus: int) -> dict[str, list[list[float]]]:
    """op -> (bytes, seconds) points of this host for a ``num_gpus`` group (ops the file lacks
    are absent); repeated sizes keep their fastest time. Raises when the file holds no
    collective at all, or rows of other group sizes only."""
    from .importers import import_profile

    rows = import_profile("auto", Path(path))
    comm = rows[rows["op"].isin(GROUP_OPS + ("sendrecv",))]
    if comm.empty:
        raise InputError("no collective rows (allreduce, allgather, reducescatter, alltoall, sendrecv)",
                         path=str(path), field="collectives_profile",
                         allowed="servesim calibrate --collectives output, or nccl-tests all_reduce_perf output")
    out: dict[str, list[list[float]]] = {}
    for op in GROUP_OPS:
        mine = comm[(comm["op"] == op) & (comm["tp"] == num_gpus)]
        if not mine.empty:
            out[op] = _points(mine)
    send = comm[comm["op"] == "sendrecv"]
    if not send.empty:
        sizes = sorted(int(t) for t in send["tp"].dropna().unique())
        out["sendrecv"] = _points(send[send["tp"] == (2 if 2 in sizes else sizes[0])])
    if num_gpus > 1 and not (out.keys() & set(GROUP_OPS)):
        measured = sorted(int(t) for t in comm["tp"].dropna().unique())
        raise InputError(f"no collective rows for a group of {num_gpus} GPUs", path=str(path),
                         field="collectives_profile", allowed=", ".join(map(str, measured)) + " GPUs")
    return out


def measured_group_sizes(path: str | Path) -> set[int]:
    """The group sizes the file has group-collective rows for."""
    from .importers import import_profile

    rows = import_profile("auto", Path(path))
    return {int(t) for t in rows[rows["op"].isin(GROUP_OPS)]["tp"].dropna().unique()}


def _points(df) -> list[list[float]]:
    best = df.groupby("bytes")["latency_s"].min()
    return [[float(b), float(t)] for b, t in best.items() if b > 0]
