"""nccl-tests output (``all_reduce_perf`` stdout saved to a file) as all-reduce profile rows.

Run on the serving machine, e.g. ``all_reduce_perf -b 1K -e 256M -f 2 -g 2 -d bfloat16 > ar.txt``
(github NVIDIA/nccl-tests), then ``servesim fit ar.txt <kernel profiles> ...``: the fitted model's
all-reduce curve is then this host's, P2P topology and all. Rows: message ``size`` in bytes, the
out-of-place ``time`` in µs and its ``algbw`` / ``busbw`` (GB/s); the group size is the number of
``#  Rank`` lines, the device the name on the first of them. The element type is not kept (an
all-reduce's time follows its bytes).
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from servesim.traces.errors import InputError

from ..profile_schema import make_profile
from . import gpu_label, register_importer

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
    if "all_reduce" not in text and "all_reduce" not in path.name:
        raise InputError("only all_reduce_perf output is read (the file names no all_reduce)",
                         path=str(path), field="source")
    devices = [m["device"] for m in map(_RANK.match, text.splitlines()) if m]
    rows = [m.groupdict() for m in map(_ROW.match, text.splitlines()) if m]
    if not devices or not rows:
        raise InputError("no '#  Rank' device lines or no result rows: not nccl-tests output",
                         path=str(path), field="source")
    device = devices[0]
    return make_profile([{
        "source": "nccl-tests", "gpu": gpu_label(device), "model": "", "tp": len(devices),
        "op": "allreduce", "bytes": int(r["size"]), "latency_s": float(r["time"]) * 1e-6,
        "algbw_gb_s": _float(r["algbw"]), "busbw_gb_s": _float(r["busbw"]),
        "kernel": "nccl-tests all_reduce_perf (out-of-place)", "device": device,
        "framework": "nccl-tests", "path": str(path)} for r in rows])


def _float(text: str | None) -> float | None:
    return None if text is None else float(text)


def host_allreduce_rows(path: str | Path, gpu: str) -> list[dict]:
    """The all-reduce rows of one nccl-tests output file as profile rows labelled ``gpu`` (what
    ``servesim calibrate --nccl-tests FILE`` appends to the profile it writes, so ``servesim fit``
    of that profile takes this host's all-reduce for the matching TP size)."""
    df = import_nccl_tests(Path(path))
    df = df.assign(gpu=gpu)
    return df.to_dict("records")
