"""Read the vLLM oracle's workload JSONL (validated) and write step traces atomically."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from traces.errors import InputError

_FIELDS = {"req_id": str, "prompt_token_ids": list, "max_tokens": int, "arrival_step": int}


def read_oracle_workload(path: str | Path) -> list[dict]:
    path = str(path)
    out, seen = [], set()
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
        if rec["req_id"] in seen:
            raise InputError(f"duplicate req_id {rec['req_id']!r}", path=path, line=n, field="req_id")
        seen.add(rec["req_id"])
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
