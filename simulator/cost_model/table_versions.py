"""The engine versions behind a cost model's measured tables, and the warning when a run differs.

Every shipped kernel table records the engine it was measured under (``engine_versions`` in
data/moe_tables.json.gz, mla_tables.json.gz, deepep_tables.json.gz; the calibrated fits'
``frameworks`` in calibrated/index.json; the vLLM custom all-reduce folder named in
collectives.json's sources). Kernels change between engine releases (vLLM's fused-MoE
configurations, FP8 kernels), so pricing a vLLM 0.19 run with vLLM 0.24 tables is worth saying. The
prices are never changed because of a version: the warning only says it. Versions compare by
(major, minor): patch releases do not change kernels.
"""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

_DATA = Path(__file__).with_name("data")
DEFAULT_ENGINE_VERSION = "0.19.1"  # the vLLM release servesim's scheduler port follows (scheduler/config.py)


@dataclass(slots=True, frozen=True)
class MeasuredTable:
    """One measured table a cost model prices with: what it prices and the engine it was measured on."""

    what: str  # e.g. "MoE kernels (measured table rtx-pro-6000 ...)"
    engine_version: str  # "<engine> <version>", e.g. "vllm 0.24.0"


@cache
def _engine_versions(file_name: str) -> dict[str, str]:
    path = _DATA / file_name
    if not path.is_file():
        return {}
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).get("engine_versions", {})


def table_engine_version(file_name: str, gpu_name: str) -> str | None:
    """"<engine> <version>" of ``file_name``'s tables for this GPU (data/), or None."""
    return _engine_versions(file_name).get(gpu_name)


_ENGINE_FOLDER = re.compile(r"(?:^|/)(vllm|sglang|trtllm)_([0-9][0-9.]*[0-9])")


def path_engine_versions(paths: list[str]) -> list[str]:
    """The engine versions named by profile or source paths, in order and once each
    (``aiconfigurator/h100_sxm/vllm_0.14.0`` -> "vllm 0.14.0", ``llmservingsim/vllm_0.19_profiler/...``
    -> "vllm 0.19"); communication-library folders (``nccl_2.29.2``) name no engine."""
    out: list[str] = []
    for path in paths:
        m = _ENGINE_FOLDER.search(path)
        if m and f"{m[1]} {m[2]}" not in out:
            out.append(f"{m[1]} {m[2]}")
    return out


def sources_engine_version(sources: list[str]) -> str | None:
    """The engine version named by aiconfigurator source paths (``.../vllm_0.14.0/x.csv.gz``), or None."""
    found = path_engine_versions(sources)
    return found[0] if found else None


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version)[:2])


def version_warnings(tables: list[MeasuredTable], engine: str, engine_version: str | None) -> list[str]:
    """One line per measured table whose engine or (major, minor) version differs from the run's."""
    if not engine_version or not _version_key(engine_version):  # unrecorded, or no release ("servesim")
        return []
    out = []
    for t in tables:
        t_engine, _, t_version = t.engine_version.partition(" ")
        if t_engine.lower() != engine.lower() or _version_key(t_version) != _version_key(engine_version):
            out.append(f"{t.what} was measured on {t.engine_version}; this run is {engine} {engine_version} "
                       "(prices unchanged; kernels may differ between versions)")
    return out
