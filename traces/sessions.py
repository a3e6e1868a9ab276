"""The canonical session trace: one row per turn of a multi-turn or agentic session (JSONL or CSV).

    session_id,turn,start_s,think_time_s,tool_time_s,input_tokens,tool_output_tokens,output_tokens
    fix-42,0,0.0,,,1800,,250
    fix-42,1,,0,3.2,40,1200,180
    fix-42,2,,12.5,,60,,90

Columns (an empty CSV cell or an absent JSON key means "not set"):
- `session_id` (required): the session (an agent's job, a chat); also vLLM's Continuum job_id.
- `turn` (required): 0, 1, 2, ... within the session, each once (rows may come in any order).
- `start_s`: when turn 0 is sent (s from the trace start); required on turn 0, not set on later turns.
- `think_time_s`, `tool_time_s`: the gap before a later turn, after its client has the previous
  answer: a user's think time and a tool call's latency (both default 0; the turn waits for their
  sum). Not set on turn 0.
- `input_tokens` (required): new prompt tokens of this turn (the user's message, the agent's
  instructions); `tool_output_tokens` (later turns, default 0): what the tool call returned.
- `output_tokens` (required, >= 1): the answer's length.
- `prefix_group`, `prefix_len` (turn 0 only): a prefix shared across sessions (an agent's system
  prompt and tool descriptions): prefix_len tokens of shared-prefix group prefix_group.

Context grows as it does in a real conversation: turn k's prompt is turn k-1's prompt, turn k-1's
answer, the tool output and the new input, in that order, so
    prompt_0 = prefix_len + input_tokens_0
    prompt_k = prompt_(k-1) + output_(k-1) + tool_output_tokens_k + input_tokens_k.
All turns read one token stream keyed by the session (traces/tokens.py), so each turn's prompt starts
with exactly the ids of the previous turn's prompt and answer.

Arrivals (`arrivals=` option): "closed_loop" (default) sends turn k its gap after the client has
turn k-1's answer in simulated time (simulator/sessions.py); "open_loop" sends it at the lower bound
start + sum of the gaps before it, whatever the latencies (a fixed-time replay).
Request ids are "<session_id>-t<turn>".
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servesim.scheduler.registry import unknown_name_message
from servesim.traces.errors import InputError
from servesim.traces.external import trace_name
from servesim.traces.registry import encoding_of, register_format
from servesim.traces.rows import as_float, as_int, iter_json_rows, open_text, require_rows
from servesim.traces.workload import RequestSpec, Workload

ARRIVALS = ("closed_loop", "open_loop")
REQUIRED = ("session_id", "turn", "input_tokens", "output_tokens")
# Column -> (kind, minimum); kinds: "text", "int", "time".
COLUMNS: dict[str, tuple[str, float]] = {
    "session_id": ("text", 0), "turn": ("int", 0), "start_s": ("time", 0.0), "think_time_s": ("time", 0.0),
    "tool_time_s": ("time", 0.0), "input_tokens": ("int", 0), "tool_output_tokens": ("int", 0),
    "output_tokens": ("int", 1), "prefix_group": ("int", 0), "prefix_len": ("int", 0),
}
_FIRST_ONLY = ("start_s", "prefix_group", "prefix_len")
_LATER_ONLY = ("think_time_s", "tool_time_s", "tool_output_tokens")


@dataclass(slots=True)
class TurnRow:
    """One validated row (file line kept for later errors)."""

    line: int
    session_id: str
    turn: int
    values: dict[str, Any]  # the row's set columns, typed

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)


def _typed(key: str, raw: Any, path: Path, line: int) -> Any:
    kind, low = COLUMNS[key]
    if kind == "text":
        if isinstance(raw, int) and not isinstance(raw, bool):
            raw = str(raw)
        if not isinstance(raw, str) or not raw:
            raise InputError(f"bad value {raw!r}", path=str(path), line=line, field=key, allowed="a non-empty string")
        return raw
    if kind == "time":
        return as_float(raw, path=path, line=line, field=key, min_value=low)
    return as_int(raw, path=path, line=line, field=key, min_value=int(low))


def _csv_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """CSV rows as (line, values): empty cells left out, numbers parsed as JSON would give them."""
    with open_text(path) as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None:
            raise InputError("file is empty", path=str(path), allowed="a CSV header and rows")
        header = [header[0].removeprefix("\ufeff"), *header[1:]]
        for cells in reader:
            if not cells:
                continue
            if len(cells) != len(header):
                raise InputError(f"{len(cells)} cells for {len(header)} columns", path=str(path),
                                 line=reader.line_num, allowed="one cell per header column")
            yield reader.line_num, {k: _cell(k, c) for k, c in zip(header, cells) if c != ""}


def _cell(key: str, text: str) -> Any:
    if key == "session_id":
        return text
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            pass
    return text  # the typed check names it


def read_turn_rows(path: Path) -> list[TurnRow]:
    """Every row of a session trace, checked column by column (file, line, field, allowed)."""
    rows_in = _csv_rows(path) if encoding_of(path) == "csv" else iter_json_rows(path)
    out: list[TurnRow] = []
    for line, obj in rows_in:
        unknown = [k for k in obj if k not in COLUMNS]
        if unknown:
            raise InputError(f"unknown column {unknown[0]!r}", path=str(path), line=line, field=unknown[0],
                             allowed=", ".join(COLUMNS))
        values = {k: _typed(k, v, path, line) for k, v in obj.items() if v is not None}
        for key in REQUIRED:
            if key not in values:
                raise InputError("missing value", path=str(path), line=line, field=key,
                                 allowed=f"required columns {', '.join(REQUIRED)}")
        turn = values["turn"]
        for key in (_LATER_ONLY if turn == 0 else _FIRST_ONLY):
            if key in values:
                where = "turn 0" if turn == 0 else f"turn {turn}"
                allowed = "later turns only" if turn == 0 else "turn 0 only"
                raise InputError(f"{key} set on {where}", path=str(path), line=line, field=key, allowed=allowed)
        if turn == 0 and "start_s" not in values:
            raise InputError("turn 0 without start_s", path=str(path), line=line, field="start_s",
                             allowed="the session's start time on turn 0")
        out.append(TurnRow(line, values["session_id"], turn, values))
    require_rows(len(out), path)
    return out


def sessions_of(rows: list[TurnRow], path: Path) -> dict[str, list[TurnRow]]:
    """Rows grouped by session (in order of first appearance), each sorted by turn and complete."""
    by_session: dict[str, list[TurnRow]] = {}
    for row in rows:
        by_session.setdefault(row.session_id, []).append(row)
    for turns in by_session.values():
        turns.sort(key=lambda r: r.turn)
        for expect, row in enumerate(turns):
            if row.turn != expect:
                what = "repeated" if row.turn < expect else f"after turn {expect - 1} (turn {expect} is missing)"
                raise InputError(f"session {row.session_id!r}: turn {row.turn} {what}", path=str(path),
                                 line=row.line, field="turn", allowed="turns 0, 1, 2, ... of a session, each once")
    return by_session


def session_specs(turns: list[TurnRow], closed_loop: bool, path: Path) -> list[RequestSpec]:
    """One session's RequestSpecs: prompts grown by each answer and tool output (module docstring)."""
    first = turns[0]
    group, prefix_len = first.get("prefix_group"), first.get("prefix_len", 0)
    if prefix_len and group is None:
        raise InputError("prefix_len without prefix_group", path=str(path), line=first.line, field="prefix_group",
                         allowed="the shared prefix's group id")
    specs: list[RequestSpec] = []
    for row in turns:
        sid = row.session_id
        if row.turn == 0:
            arrival_s, prompt_len, gap_s = first.get("start_s"), prefix_len + row.get("input_tokens"), None
        else:
            prev = specs[-1]
            gap_s = row.get("think_time_s", 0.0) + row.get("tool_time_s", 0.0)
            arrival_s = prev.arrival_time_s + gap_s
            prompt_len = (prev.prompt_len + prev.output_len + row.get("tool_output_tokens", 0)
                          + row.get("input_tokens"))
        if prompt_len < 1:
            raise InputError("turn 0 has an empty prompt", path=str(path), line=row.line, field="input_tokens",
                             allowed="input_tokens + prefix_len >= 1")
        parent = specs[-1].request_id if specs and closed_loop else None
        try:
            specs.append(RequestSpec(
                f"{sid}-t{row.turn}", arrival_s, prompt_len, row.get("output_tokens"), prefix_group=group,
                prefix_len=prefix_len if group is not None else 0, session_id=sid,
                is_last_turn=row is turns[-1], parent_request_id=parent,
                think_time_s=gap_s if parent is not None else None))
        except InputError as exc:
            raise InputError(exc.detail, path=str(path), line=row.line, field=exc.field, allowed=exc.allowed) from None
    return specs


def check_arrivals(arrivals: str, modes: tuple[str, ...], path: Path) -> None:
    """The `arrivals` option of a session importer: one of its modes, or an error with a did-you-mean."""
    if arrivals not in modes:
        raise InputError(unknown_name_message("arrivals mode", arrivals, modes), path=str(path),
                         field="arrivals", allowed=", ".join(modes))


@register_format(
    "sessions",
    signatures=(("session_id", "turn", "output_tokens"),),
    encodings=("jsonl", "csv"),
)
def load_sessions(path: Path, *, arrivals: str = "closed_loop") -> Workload:
    """Canonical session trace: one row per turn (session_id, turn, start_s, think/tool time, new
    input and tool-output tokens, output_tokens); turns sent after the previous answer (closed loop)."""
    check_arrivals(arrivals, ARRIVALS, path)
    by_session = sessions_of(read_turn_rows(path), path)
    specs = [s for turns in by_session.values() for s in session_specs(turns, arrivals == "closed_loop", path)]
    return Workload.from_unsorted(specs, name=trace_name(path), source=str(path))
