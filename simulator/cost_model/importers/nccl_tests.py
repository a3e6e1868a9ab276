"""nccl-tests output (stdout saved to a file) as collective profile rows.

Run on the serving machine, e.g. ``all_reduce_perf -b 1K -e 256M -f 2 -g 2 -d bfloat16 > ar.txt``
(github NVIDIA/nccl-tests), then ``servesim fit ar.txt <kernel profiles> ...``: the fitted model's
all-reduce curve is then this host's, P2P topology and all. ``all_gather_perf``,
``reduce_scatter_perf``, ``alltoall_perf`` and ``sendrecv_perf`` output is read too (ops
``allgather`` / ``reducescatter`` / ``alltoall`` / ``sendrecv``: the roofline's
``collectives_profile``); one file may hold several tests one after another. Which test a row
belongs to: the ``# Collective test starting: <name>_perf`` line above it, else the file's name.
Rows: message ``size`` in bytes (nccl-tests' convention per test, kept as is), the out-of-place
``time`` in µs and its ``algbw`` / ``busbw`` (GB/s); the group size is the number of ``#  Rank``
lines, the device the name on the first of them. The element type is not kept (a collective's time
follows its bytes).
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from servesim.traces.errors import InputError

from ..profile_schema import make_profile
from . import gpu_label, register_importer

# nccl-tests binary name stem -> profile op
TESTS = {"all_reduce": "allreduce", "all_gather": "allgather", "reduce_scatter": "reducescatter",
         "alltoall": "alltoall", "sendrecv": "sendrecv"}
_START = re.compile(r"^#\s*Collective test starting:\s*(?P<name>\w+?)_perf")
_RANK = re.compile(r"^#\s+Rank\s+\d+.*?\]\s+(?P<device>.+?)\s*$")
_ROW = re.compile(r"^\s*(?P<size>\d+)\s+(?P<count>\d+)\s+(?P<type>\w+)\s+(?P<redop>\w+)\s+(?P<root>-?\d+)\s+"
                  r"(?P<time>[\d.]+)(?:\s+(?P<algbw>[\d.]+)\s+(?P<busbw>[\d.]+))?\s")


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError as exc:
        raise InputError(f"cannot read: {exc}", path=str(path)) from None


def _detect(path: Path) -> bool:
    if not path.is_file() or path.suffix.lower() not in (".txt", ".log", ".out"):
        return False
    head = path.read_text(errors="replace")[:4000]
    return "# nThread" in head and "busbw" in head


@register_importer("nccl-tests", _detect)
def import_nccl_tests(path: Path) -> pd.DataFrame:
    text = _text(path)
    lines = text.splitlines()
    devices = [m["device"] for m in map(_RANK.match, lines) if m]
    op = _test_of_name(path.name)  # until a "Collective test starting" line says otherwise
    rows = []
    for line in lines:
        if start := _START.match(line):
            op = TESTS.get(start["name"])
            if op is None:
                raise InputError(f"nccl-tests {start['name']}_perf output is not read", path=str(path),
                                 field="source", allowed=", ".join(f"{t}_perf" for t in TESTS))
        elif row := _ROW.match(line):
            if op is None:
                raise InputError("cannot tell which nccl-tests test made these rows: no '# Collective test "
                                 "starting' line, and the file name names none", path=str(path), field="source",
                                 allowed="a file name containing " + " / ".join(TESTS))
            rows.append({**row.groupdict(), "op": op})
    if not devices or not rows:
        raise InputError("no '#  Rank' device lines or no result rows: not nccl-tests output",
                         path=str(path), field="source")
    device = devices[0]
    return make_profile([{
        "source": "nccl-tests", "gpu": gpu_label(device), "model": "", "tp": len(devices),
        "op": r["op"], "bytes": int(r["size"]), "latency_s": float(r["time"]) * 1e-6,
        "algbw_gb_s": _float(r["algbw"]), "busbw_gb_s": _float(r["busbw"]),
        "kernel": f"nccl-tests {_TEST_OF_OP[r['op']]}_perf (out-of-place)", "device": device,
        "framework": "nccl-tests", "path": str(path)} for r in rows])


_TEST_OF_OP = {op: test for test, op in TESTS.items()}


def _test_of_name(name: str) -> str | None:
    found = [op for test, op in TESTS.items() if test in name]
    return found[0] if len(found) == 1 else None


def _float(text: str | None) -> float | None:
    return None if text is None else float(text)


def host_collective_rows(path: str | Path, gpu: str) -> list[dict]:
    """The rows of one nccl-tests output file as profile rows labelled ``gpu`` (what ``servesim
    calibrate --nccl-tests FILE`` appends to the profile it writes, so ``servesim fit`` of that
    profile takes this host's all-reduce for the matching TP size, and ``collectives_profile`` every
    collective it holds)."""
    df = import_nccl_tests(Path(path))
    df = df.assign(gpu=gpu)
    return df.to_dict("records")
