"""Read the vLLM oracle's workload JSONL (validated) and write step traces atomically."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from servesim.traces.errors import InputError

_FIELDS = {"req_id": str, "prompt_token_ids": list, "max_tokens": int, "arrival_step": int}
_PHASES = ("before_schedule", "before_update")


def _check_extensions(rec: dict, path: str, n: int) -> None:
    """The fields the oracle's opt-in extensions add (all optional)."""
    def bad(field: str, why: str) -> InputError:
        return InputError(f"{why}, got {rec[field]!r:.40}", path=path, line=n, field=field)

    def is_int(v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    for field in ("ignore_eos", "remote_prefill", "stream", "stream_close"):
        if field in rec and not isinstance(rec[field], bool):
            raise bad(field, "expected true or false")
    for field in ("min_tokens", "abort_step", "grammar_steps"):
        if field in rec and not (is_int(rec[field]) and rec[field] >= 0):
            raise bad(field, "expected an int >= 0")
    if "stop_token_ids" in rec and not (isinstance(rec["stop_token_ids"], list)
                                        and all(is_int(t) for t in rec["stop_token_ids"])):
        raise bad("stop_token_ids", "expected a list of ints")
    if rec.get("lora_id") is not None and not (is_int(rec["lora_id"]) and rec["lora_id"] >= 0):
        raise bad("lora_id", "expected an int >= 0 (0: the base model) or null")
    if rec.get("cache_salt") is not None and not isinstance(rec["cache_salt"], str):
        raise bad("cache_salt", "expected a string or null")
    for field in ("abort_phase", "abort_on_preempt"):
        if field in rec and rec[field] not in _PHASES:
            raise InputError(f"unknown phase {rec[field]!r:.40}", path=path, line=n, field=field,
                             allowed=", ".join(_PHASES))
    if ("abort_step" in rec) != ("abort_phase" in rec):
        raise InputError("abort_step and abort_phase go together", path=path, line=n, field="abort_step")
    if "mm_items" in rec:  # tools/encoder_oracle.py: items inside the prompt, sorted, disjoint
        from servesim.scheduler.multimodal import check_mm_features
        from servesim.traces.canonical import mm_items_from_json  # numpy: not at CLI start-up

        items = mm_items_from_json(rec["mm_items"], Path(path), n)
        problem = check_mm_features(str(rec["req_id"]), items, len(rec["prompt_token_ids"]))
        if problem is not None:
            raise InputError(problem, path=path, line=n, field="mm_items",
                             allowed="items sorted by offset, disjoint, inside the prompt; or one encoder input (in_prompt false) at offset 0")


def read_oracle_workload(path: str | Path) -> list[dict]:
    path = str(path)
    out, seen, sessions = [], set(), set()
    mm_sizes: dict[str, int] = {}
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise InputError(f"cannot read workload: {e.strerror}", path=path) from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"not valid JSON ({e.msg})", path=path, line=n) from None
        if not isinstance(rec, dict):
            raise InputError("expected a JSON object", path=path, line=n)
        for field, typ in _FIELDS.items():
            if field not in rec:
                raise InputError("missing field", path=path, line=n, field=field,
                                 allowed=", ".join(_FIELDS) + " (+ priority, prefix_group)")
            if not isinstance(rec[field], typ) or isinstance(rec[field], bool):
                raise InputError(f"expected {typ.__name__}, got {rec[field]!r:.40}", path=path, line=n, field=field)
        if rec["max_tokens"] < 1:
            raise InputError(f"must be >= 1, got {rec['max_tokens']}", path=path, line=n, field="max_tokens")
        if rec["arrival_step"] < 0:
            raise InputError(f"must be >= 0, got {rec['arrival_step']}", path=path, line=n, field="arrival_step")
        toks = rec["prompt_token_ids"]
        if not toks or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in toks):
            raise InputError("must be a non-empty list of non-negative integers", path=path, line=n,
                             field="prompt_token_ids")
        if not isinstance(rec.get("priority", 0), int):
            raise InputError("expected int", path=path, line=n, field="priority")
        _check_extensions(rec, path, n)
        for item in rec.get("mm_items") or ():  # one content (mm hash), one size
            if mm_sizes.setdefault(item["mm_hash"], item["length"]) != item["length"]:
                raise InputError(f"{item['mm_hash']!r} has length {item['length']} here and "
                                 f"{mm_sizes[item['mm_hash']]} in an earlier request", path=path, line=n,
                                 field="mm_items", allowed="equal mm_hash, equal length")
        if rec.get("stream_chunk") or rec.get("stream_close"):  # a later line of a streaming session
            if rec["req_id"] not in sessions:
                raise InputError(f"session line for {rec['req_id']!r} before its first line (stream: true)",
                                 path=path, line=n, field="req_id")
        elif rec["req_id"] in seen:
            raise InputError(f"duplicate req_id {rec['req_id']!r}", path=path, line=n, field="req_id")
        seen.add(rec["req_id"])
        if rec.get("stream"):
            sessions.add(rec["req_id"])
        out.append(rec)
    if not out:
        raise InputError("workload is empty", path=path)
    return out


def write_jsonl_atomic(path: str | Path, records: Iterable[dict]) -> int:
    """Write JSON lines to a temporary file beside `path`, then rename: never half-written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    n = 0
    try:
        with os.fdopen(fd, "w") as f:
            for rec in records:
                f.write(json.dumps(rec) + "\n")
                n += 1
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return n
