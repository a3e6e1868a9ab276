"""Our own trace format (JSONL, CSV or Parquet) with a lossless writer, and the vLLM-oracle JSONL.

Canonical columns are the `RequestSpec` fields. Required: request_id, arrival_time_s, output_len,
and prompt_token_ids or prompt_len. In CSV, an empty cell means "not set" and id lists are
space-separated integers ("12 7 99"); booleans are true/false. `mm_items` (multimodal items) is a
list of {"offset", "length", "mm_hash"[, "modality"]} objects (in CSV: that list as JSON text).
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
from pathlib import Path
from typing import Any

from servesim.scheduler.multimodal import MultiModalFeatureSpec
from servesim.traces.errors import InputError
from servesim.traces.external import trace_name
from servesim.traces.registry import encoding_of, register_format
from servesim.traces.rows import as_float, as_int, as_int_tuple, iter_json_rows, open_text, require_rows
from servesim.traces.tokens import TOKEN_ID_LIMIT
from servesim.traces.workload import RequestSpec, Workload

# Column name -> kind. Order is the column order the writer uses.
COLUMNS: dict[str, str] = {
    "request_id": "text", "arrival_time_s": "time", "prompt_len": "length",
    "output_len": "length", "prompt_token_ids": "ids", "prefix_hash_ids": "hashes",
    "prefix_block_len": "length", "prefix_group": "count", "prefix_len": "count",
    "priority": "int", "session_id": "text", "is_last_turn": "bool", "lora_id": "int",
    "arrival_step": "count", "grammar_compile_ms": "time", "input_chunk_offsets_s": "times",
    "input_chunk_lens": "hashes", "mm_items": "mm", "parent_request_id": "text", "think_time_s": "time",
    "tenant": "text", "slo_class": "text",
}
REQUIRED = ("request_id", "arrival_time_s", "output_len")
_MIN = {"length": 1, "count": 0, "int": None}


# --- reading -----------------------------------------------------------------------------------


def _value(values: dict[str, Any], key: str, path: Path, line: int) -> Any:
    """Typed value of optional column `key` (None when absent or empty)."""
    raw = values.get(key)
    if raw is None:
        return None
    kind = COLUMNS[key]
    if kind == "text":
        if isinstance(raw, int) and not isinstance(raw, bool):
            raw = str(raw)
        if not isinstance(raw, str) or not raw:
            raise InputError(f"bad value {raw!r}", path=str(path), line=line, field=key,
                             allowed="a non-empty string")
        return raw
    if kind == "time":
        return as_float(raw, path=path, line=line, field=key)
    if kind in ("ids", "hashes"):  # token ids must fit the id range; hash ids only int64
        upper = TOKEN_ID_LIMIT if kind == "ids" else 2**63
        return as_int_tuple(raw, path=path, line=line, field=key, upper=upper)
    if kind == "times":
        if not isinstance(raw, (list, tuple)):
            raise InputError(f"expected a list, got {raw!r:.60}", path=str(path), line=line, field=key,
                             allowed="a list of seconds")
        return tuple(as_float(t, path=path, line=line, field=key) for t in raw)
    if kind == "bool":
        if not isinstance(raw, bool):
            raise InputError(f"bad value {raw!r}", path=str(path), line=line, field=key,
                             allowed="true or false")
        return raw
    if kind == "mm":
        return mm_items_from_json(raw, path, line)
    return as_int(raw, path=path, line=line, field=key, min_value=_MIN[kind])


_MM_ALLOWED = ('a list of {"offset": int >= 0, "length": int >= 1, "mm_hash": non-empty string, "modality": string, '
               '"in_prompt": bool (false: an encoder-decoder model\'s encoder input)}')


def mm_items_from_json(raw: Any, path: Path, line: int) -> tuple[MultiModalFeatureSpec, ...]:
    """The multimodal items of a row; anything malformed is an InputError naming the field."""
    if not isinstance(raw, list):
        raise InputError(f"bad value {raw!r}", path=str(path), line=line, field="mm_items", allowed=_MM_ALLOWED)
    items = []
    for i, obj in enumerate(raw):
        ok = (isinstance(obj, dict) and set(obj) <= {"offset", "length", "mm_hash", "modality", "in_prompt"}
              and all(isinstance(obj.get(k), int) and not isinstance(obj.get(k), bool) for k in ("offset", "length"))
              and isinstance(obj.get("mm_hash"), str) and isinstance(obj.get("modality", "image"), str)
              and isinstance(obj.get("in_prompt", True), bool))
        try:
            if not ok:
                raise ValueError(f"item {i}: {obj!r}")
            items.append(MultiModalFeatureSpec(obj["offset"], obj["length"], obj["mm_hash"],
                                               obj.get("modality", "image"), obj.get("in_prompt", True)))
        except ValueError as exc:
            raise InputError(f"bad multimodal item {i}: {exc}", path=str(path), line=line, field="mm_items",
                             allowed=_MM_ALLOWED) from None
    return tuple(items)


def mm_items_json(items: tuple[MultiModalFeatureSpec, ...]) -> list[dict]:
    """The canonical (JSON) form of a request's multimodal items: what mm_items_from_json reads back."""
    out = []
    for it in items:
        row: dict[str, Any] = {"offset": it.offset, "length": it.length, "mm_hash": it.mm_hash}
        if it.modality != "image":
            row["modality"] = it.modality
        if not it.in_prompt:
            row["in_prompt"] = False
        out.append(row)
    return out


def spec_from_row(values: dict[str, Any], path: Path, line: int) -> RequestSpec:
    """Validate one canonical row (typed values) and build its RequestSpec."""
    unknown = [k for k in values if k not in COLUMNS]
    if unknown:
        raise InputError(f"unknown column {unknown[0]!r}", path=str(path), line=line,
                         field=unknown[0], allowed=", ".join(COLUMNS))
    for key in REQUIRED:
        if values.get(key) is None:
            raise InputError("missing value", path=str(path), line=line, field=key,
                             allowed=f"required columns {', '.join(REQUIRED)}")
    typed = {key: _value(values, key, path, line) for key in COLUMNS}
    ids, prompt_len = typed["prompt_token_ids"], typed["prompt_len"]
    if ids is not None and not ids:
        raise InputError("empty token list", path=str(path), line=line, field="prompt_token_ids",
                         allowed="at least one token id")
    if ids is None and prompt_len is None:
        raise InputError("neither prompt_token_ids nor prompt_len is set", path=str(path),
                         line=line, field="prompt_len", allowed="one of them (or both, equal)")
    if ids is not None and prompt_len is not None and len(ids) != prompt_len:
        raise InputError(f"{len(ids)} token ids but prompt_len is {prompt_len}", path=str(path),
                         line=line, field="prompt_token_ids",
                         allowed="len(prompt_token_ids) == prompt_len")
    kwargs = {k: v for k, v in typed.items() if v is not None}
    kwargs["prompt_len"] = prompt_len if prompt_len is not None else len(ids)
    try:
        return RequestSpec(**kwargs)
    except InputError as exc:
        raise InputError(exc.detail, path=str(path), line=line, field=exc.field,
                         allowed=exc.allowed) from None


def _decode_cell(key: str, text: str, path: Path, line: int) -> Any:
    """CSV cell text -> Python value of the column's kind ("" -> None)."""
    if text == "" or key not in COLUMNS:
        return None if text == "" else text
    kind = COLUMNS[key]
    try:
        if kind == "text":
            return text
        if kind == "time":
            return float(text)
        if kind in ("ids", "hashes"):
            return [int(t) for t in text.split()]
        if kind == "times":
            return [float(t) for t in text.split()]
        if kind == "mm":
            return json.loads(text)
        if kind == "bool":
            lowered = text.strip().lower()
            if lowered in ("true", "1"):
                return True
            if lowered in ("false", "0"):
                return False
            raise ValueError(text)
        return int(text)
    except ValueError:
        allowed = {"time": "a number", "ids": "space-separated integers", "mm": "a JSON list",
                   "hashes": "space-separated integers", "times": "space-separated numbers",
                   "bool": "true or false"}
        raise InputError(f"bad value {text!r}", path=str(path), line=line, field=key,
                         allowed=allowed.get(kind, "an integer")) from None


def _iter_rows(path: Path, encoding: str):
    """Yield (line, values) with Python-typed values for the three encodings."""
    if encoding == "jsonl":
        yield from iter_json_rows(path)
    elif encoding == "parquet":
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except Exception as exc:  # pyarrow raises several types for corrupt files
            raise InputError(f"cannot read Parquet: {exc}", path=str(path)) from None
        yield from enumerate(table.to_pylist(), start=1)
    else:
        with open_text(path) as fh:
            reader = csv.reader(fh)
            header = next(reader, None)
            if header is None:
                raise InputError("file is empty", path=str(path), allowed="a CSV header and rows")
            missing = [c for c in REQUIRED if c not in header]
            if missing:
                raise InputError(f"missing column(s) {', '.join(missing)}", path=str(path), line=1,
                                 field=missing[0], allowed=f"columns {', '.join(REQUIRED)}")
            for cells in reader:
                line = reader.line_num
                if len(cells) != len(header):
                    raise InputError(f"{len(cells)} cells for {len(header)} columns",
                                     path=str(path), line=line,
                                     allowed="one cell per header column")
                yield line, {k: _decode_cell(k, c, path, line) for k, c in zip(header, cells)}


@register_format(
    "canonical",
    signatures=(("request_id", "arrival_time_s", "output_len"),),
    encodings=("jsonl", "csv", "parquet"),
)
def load_canonical(path: Path) -> Workload:
    """servesim canonical trace (JSONL, CSV or Parquet), see traces/canonical.py."""
    encoding = encoding_of(path) or "jsonl"
    requests: list[RequestSpec] = []
    seen: set[str] = set()
    for line, values in _iter_rows(path, encoding):
        spec = spec_from_row(values, path, line)
        if spec.request_id in seen:
            raise InputError(f"duplicate request_id {spec.request_id!r}", path=str(path),
                             line=line, field="request_id", allowed="unique ids")
        seen.add(spec.request_id)
        requests.append(spec)
    require_rows(len(requests), path)
    return Workload.from_unsorted(requests, name=trace_name(path), source=str(path))


@register_format(
    "oracle",
    signatures=(("req_id", "prompt_token_ids", "max_tokens"),),
    encodings=("jsonl",),
)
def load_oracle(path: Path, *, seconds_per_step: float = 0.0) -> Workload:
    """vLLM-oracle JSONL: req_id, prompt_token_ids, max_tokens, arrival_step, priority,
    prefix_group, mm_items (tools/encoder_oracle.py). arrival_time_s = arrival_step * seconds_per_step; rows are ordered by step."""
    if not seconds_per_step >= 0.0:
        raise InputError(f"seconds_per_step {seconds_per_step}", field="seconds_per_step",
                         allowed="a number >= 0")
    rows: list[tuple[int, RequestSpec]] = []
    seen: set[str] = set()
    for line, obj in iter_json_rows(path):
        values = {
            "request_id": obj.get("req_id"), "prompt_token_ids": obj.get("prompt_token_ids"),
            "output_len": obj.get("max_tokens"), "arrival_step": obj.get("arrival_step"),
            "priority": obj.get("priority"), "prefix_group": obj.get("prefix_group"),
            "mm_items": obj.get("mm_items"),
        }
        for ours, theirs in (("request_id", "req_id"), ("prompt_token_ids", "prompt_token_ids"),
                             ("output_len", "max_tokens"), ("arrival_step", "arrival_step")):
            if values[ours] is None:
                raise InputError("missing value", path=str(path), line=line, field=theirs,
                                 allowed="req_id, prompt_token_ids, max_tokens, arrival_step")
        step = as_int(values["arrival_step"], path=path, line=line, field="arrival_step",
                      min_value=0)
        values["arrival_time_s"] = step * seconds_per_step
        try:
            spec = spec_from_row(values, path, line)
        except InputError as exc:  # report the oracle's own field names
            names = {"request_id": "req_id", "output_len": "max_tokens"}
            raise InputError(exc.detail, path=exc.path, line=exc.line,
                             field=names.get(exc.field, exc.field), allowed=exc.allowed) from None
        if spec.request_id in seen:
            raise InputError(f"duplicate req_id {spec.request_id!r}", path=str(path), line=line,
                             field="req_id", allowed="unique ids")
        seen.add(spec.request_id)
        rows.append((step, spec))
    require_rows(len(rows), path)
    rows.sort(key=lambda item: item[0])  # stable: ties keep file order
    return Workload([spec for _, spec in rows], name=trace_name(path), source=str(path))


# --- writing -----------------------------------------------------------------------------------


def _row_of(spec: RequestSpec) -> dict[str, Any]:
    return {name: getattr(spec, name) for name in COLUMNS}


def _used_columns(workload: Workload) -> list[str]:
    """Required columns + prompt_len + every optional column some request sets (non-default)."""
    defaults = RequestSpec("x", 0.0, 1, 1)
    used = {*REQUIRED, "prompt_len"}
    for spec in workload.requests:
        for name in COLUMNS:
            if name not in used and getattr(spec, name) != getattr(defaults, name):
                used.add(name)
    return [c for c in COLUMNS if c in used]


def _cell_value(spec: RequestSpec, column: str) -> Any:
    """The column's value as the JSON / CSV writers take it (multimodal items as plain dicts)."""
    value = getattr(spec, column)
    return mm_items_json(value) if column == "mm_items" else value


def _csv_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list):  # multimodal items
        return json.dumps(value, separators=(",", ":"))
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return " ".join(map(str, value))
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _encode(workload: Workload, encoding: str, target: Path, *, gz: bool) -> None:
    columns = _used_columns(workload)
    if encoding == "parquet":
        _write_parquet(workload, columns, target)
        return
    buffer = io.StringIO(newline="")
    if encoding == "csv":
        writer = csv.writer(buffer, lineterminator="\r\n")  # RFC 4180; also quotes \r in cells
        writer.writerow(columns)
        for spec in workload.requests:
            writer.writerow([_csv_cell(_cell_value(spec, c)) for c in columns])
    else:
        for spec in workload.requests:
            row = {c: _cell_value(spec, c) for c in columns if getattr(spec, c) is not None}
            buffer.write(json.dumps(row, ensure_ascii=False) + "\n")
    data = buffer.getvalue().encode("utf-8")
    if gz:
        data = gzip.compress(data, mtime=0)  # mtime=0: byte-identical output for equal input
    target.write_bytes(data)


def _write_parquet(workload: Workload, columns: list[str], target: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    kinds = {"text": pa.string(), "time": pa.float64(), "ids": pa.list_(pa.int64()),
             "hashes": pa.list_(pa.int64()), "times": pa.list_(pa.float64()),
             "bool": pa.bool_(), "length": pa.int64(), "count": pa.int64(), "int": pa.int64(),
             "mm": pa.list_(pa.struct([("offset", pa.int64()), ("length", pa.int64()), ("mm_hash", pa.string()),
                                       ("modality", pa.string())]))}
    schema = pa.schema([(c, kinds[COLUMNS[c]]) for c in columns])
    data = {c: [getattr(s, c) for s in workload.requests] for c in columns}
    if "mm_items" in data:  # every struct field present (Parquet has no optional keys)
        data["mm_items"] = [[dict(d, modality=d.get("modality", "image")) for d in mm_items_json(s.mm_items)]
                            for s in workload.requests]
    pq.write_table(pa.table(data, schema=schema), target)


def save_workload(workload: Workload, path: str | Path) -> Path:
    """Write `workload` in the canonical format; the encoding follows the extension
    (.jsonl, .csv, optionally .gz; .parquet). Written to a temporary name, then renamed."""
    target = Path(path)
    encoding = encoding_of(target)
    if encoding is None:
        raise InputError("cannot tell the encoding from the file name", path=str(target),
                         allowed=".jsonl, .jsonl.gz, .csv, .csv.gz, .parquet")
    gz = target.suffix.lower() == ".gz"
    if gz and encoding == "parquet":
        raise InputError("Parquet is compressed already; drop .gz", path=str(target),
                         allowed=".jsonl, .jsonl.gz, .csv, .csv.gz, .parquet")
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        _encode(workload, encoding, tmp, gz=gz)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target
