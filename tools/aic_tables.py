"""What the aiconfigurator table builders share (tools/build_moe_tables.py, tools/build_mla_tables.py):
the attribution every table file carries and the command line that writes one.
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AIC_ATTRIBUTION = ("ai-dynamo/aiconfigurator (Apache-2.0), Copyright (c) 2025-2026 NVIDIA CORPORATION & "
                   "AFFILIATES; snapshot 095f58a51c4ca8e61b66ec108d86f223f8d559ce")


def write_tables_main(description: str, build: Callable[[Path], dict], out: Path, unit: str) -> None:
    """Parse --profiles, build the table file from it and write it gzipped, reproducibly (mtime 0)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--profiles", type=Path, default=ROOT.parent / "shared" / "data" / "gpu_profiles")
    args = ap.parse_args()
    data = build(args.profiles)
    out.write_bytes(gzip.compress(json.dumps(data, separators=(",", ":")).encode(), compresslevel=9, mtime=0))
    print(f"wrote {out} ({out.stat().st_size} bytes, {len(data['tables'])} {unit})")


def engine_versions(sources: dict[str, str]) -> dict[str, str]:
    """GPU -> "<engine> <version>" the tables of that GPU were measured under, from the source folder's
    ``<framework>_<version>`` name (aiconfigurator's layout: ``h100_sxm/vllm_0.24.0``): written into
    every table file so a run on another engine version can be told (simulator/cost_model/table_versions.py)."""
    out = {}
    for gpu, folder in sources.items():
        framework, _, version = folder.rsplit("/", 1)[-1].partition("_")
        out[gpu] = f"{framework} {version}"
    return out
