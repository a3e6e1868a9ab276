"""Trace samples shipped inside the package (see traces/data/README.md for origin and licences)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from servesim.traces.errors import InputError
from servesim.traces.formats import load_workload
from servesim.traces.workload import Workload

DATA_DIR = Path(__file__).resolve().parent / "data"


@dataclass(frozen=True, slots=True)
class BundledTrace:
    name: str
    filename: str  # inside traces/data/
    fmt: str  # registered format name
    licence: str  # SPDX id; the text is in traces/data/LICENSES/
    attribution: str
    description: str


BUNDLED_TRACES: dict[str, BundledTrace] = {
    t.name: t
    for t in (
        BundledTrace(
            name="sharegpt-300",
            filename="sharegpt-llama-3.1-8b-300-sps10.jsonl.gz",
            fmt="llmservingsim",
            licence="MIT",
            attribution="LLMServingSim ShareGPT workload (casys-kaist/LLMServingSim), "
                        "MIT, Copyright (c) 2024, CASYS Lab at KAIST",
            description="300 ShareGPT requests at ~10 req/s with Llama-3.1 token ids; the "
                        "workload of the real vLLM 0.19 runs in LLMServingSim's bench/examples",
        ),
        BundledTrace(
            name="mooncake-conversation-5min",
            filename="mooncake_conversation_first5min.jsonl.gz",
            fmt="mooncake",
            licence="Apache-2.0",
            attribution="Mooncake FAST'25 conversation trace (kvcache-ai/Mooncake), Apache-2.0; "
                        "first 5 minutes",
            description="first 918 requests (arrivals 0-299.999 s) of the Kimi conversation "
                        "trace, with 512-token prefix hash ids",
        ),
    )
}

DEFAULT_TRACE = "sharegpt-300"  # what `servesim replay` uses with no arguments


def available_bundled_traces() -> list[str]:
    return sorted(BUNDLED_TRACES)


def _info(name: str) -> BundledTrace:
    try:
        return BUNDLED_TRACES[name]
    except KeyError:
        raise InputError(f"unknown bundled trace {name!r}", field="trace",
                         allowed=", ".join(available_bundled_traces())) from None


def bundled_trace_path(name: str = DEFAULT_TRACE) -> Path:
    """Path of a bundled trace file."""
    path = DATA_DIR / _info(name).filename
    if not path.is_file():
        raise InputError("bundled trace file is missing from the installation", path=str(path))
    return path


def load_bundled(name: str = DEFAULT_TRACE, **options: object) -> Workload:
    """Load a bundled trace, with its name and attribution filled in."""
    info = _info(name)
    workload = load_workload(bundled_trace_path(name), fmt=info.fmt, **options)
    return replace(workload, name=info.name, attribution=info.attribution)
