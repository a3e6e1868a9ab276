"""Importer of the Alibaba Qwen-Bailian KVCache traces (github alibaba-edu/qwen-bailian-usagetraces-anon,
Apache-2.0; Wang et al., "KVCache Cache in the Wild", USENIX ATC'25): JSONL, one request a line,

    {"chat_id": 159, "parent_chat_id": 55, "timestamp": 61.114, "input_length": 521,
     "output_length": 132, "type": "text", "turn": 2, "hash_ids": [1089, 1090, ...]}

`parent_chat_id` links a turn to the request whose answer it continues (-1: a session's first
request), `timestamp` is seconds from the trace start, `hash_ids` one salted hash per 16-token block
of the prompt (equal leading ids: a shared prefix), `type` text/search/image/file (the to-B trace is
API-calling task automation: agentic turns). What it holds is a tree per session; the session is the
root request's chat_id (vLLM's Continuum job_id), and a request without children ends its branch.

Arrivals (`arrivals=`): "closed_loop" (default) sends a child `timestamp - parent timestamp` after
its client has the parent's answer in simulated time. The trace records arrivals only, so that gap
still holds the parent's latency in production as well as the user's or tool's time: sessions run
at most as fast as recorded plus the simulated latencies (no latency is assumed or subtracted).
"recorded" replays every request at its timestamp (open loop), sessions still linked.

A parent missing from the file (the trace starts inside a session) makes the request a root.
"""

from __future__ import annotations

from pathlib import Path

from servesim.traces.errors import InputError
from servesim.traces.external import trace_name
from servesim.traces.registry import register_format
from servesim.traces.rows import as_float, as_int, as_int_tuple, iter_json_rows, require_keys, require_rows
from servesim.traces.sessions import check_arrivals
from servesim.traces.workload import RequestSpec, Workload

BAILIAN_BLOCK_LEN = 16  # tokens per hash id, as the dataset's README states ("16 tokens per block")
ARRIVALS = ("closed_loop", "recorded")
_KEYS = ("chat_id", "parent_chat_id", "timestamp", "input_length", "output_length")
_ROOT = -1  # the dataset's parent_chat_id of a session's first request


def _row(obj: dict, path: Path, line: int, block_len: int) -> tuple[int, int, float, int, int, tuple[int, ...] | None]:
    require_keys(obj, _KEYS, path, line)
    chat = as_int(obj["chat_id"], path=path, line=line, field="chat_id", min_value=0)
    parent = as_int(obj["parent_chat_id"], path=path, line=line, field="parent_chat_id", min_value=_ROOT)
    ts = as_float(obj["timestamp"], path=path, line=line, field="timestamp")
    prompt = as_int(obj["input_length"], path=path, line=line, field="input_length", min_value=1)
    output = as_int(obj["output_length"], path=path, line=line, field="output_length", min_value=1)
    hashes = obj.get("hash_ids")
    if hashes is not None:
        hashes = as_int_tuple(hashes, path=path, line=line, field="hash_ids", upper=2**63)
        if len(hashes) > -(-prompt // block_len):
            raise InputError(f"{len(hashes)} hash ids for input_length {prompt}", path=str(path), line=line,
                             field="hash_ids", allowed=f"at most ceil(input_length/{block_len}) ids")
    if parent == chat:
        raise InputError(f"chat {chat} is its own parent", path=str(path), line=line, field="parent_chat_id",
                         allowed="-1 or another request's chat_id")
    return chat, parent, ts, prompt, output, hashes or None


@register_format(
    "bailian",
    signatures=(_KEYS,),
    encodings=("jsonl",),
)
def load_bailian(path: Path, *, arrivals: str = "closed_loop", block_len: int = BAILIAN_BLOCK_LEN) -> Workload:
    """Qwen-Bailian KVCache trace JSONL (chat_id, parent_chat_id, timestamp s, input/output_length,
    hash_ids of 16-token blocks): sessions as parent links, turns sent after the parent's answer."""
    check_arrivals(arrivals, ARRIVALS, path)
    rows = [(line, *_row(obj, path, line, block_len)) for line, obj in iter_json_rows(path)]
    require_rows(len(rows), path)
    by_chat: dict[int, tuple] = {}
    for row in rows:
        if row[1] in by_chat:
            raise InputError(f"chat_id {row[1]} appears twice (line {by_chat[row[1]][0]})", path=str(path),
                             line=row[0], field="chat_id", allowed="unique chat ids")
        by_chat[row[1]] = row
    has_child = {row[2] for row in rows}
    roots = _roots(by_chat, path)
    specs = []
    # By arrival; a parent before its children at equal timestamps (depth), then file order.
    for line, chat, parent, ts, prompt, output, hashes in sorted(rows, key=lambda r: (r[3], roots[r[1]][1], r[0])):
        up = by_chat.get(parent)
        if up is not None and up[3] > ts:
            raise InputError(f"chat {chat} arrives at {ts:g} s, before its parent {parent} ({up[3]:g} s)",
                             path=str(path), line=line, field="timestamp", allowed="a child after its parent")
        linked = up is not None and arrivals == "closed_loop"
        specs.append(RequestSpec(
            f"bailian-{chat}", ts, prompt, output, prefix_hash_ids=hashes, prefix_block_len=block_len,
            session_id=f"bailian-{roots[chat][0]}", is_last_turn=chat not in has_child,
            parent_request_id=f"bailian-{parent}" if linked else None, think_time_s=ts - up[3] if linked else None))
    return Workload(specs, name=trace_name(path), source=str(path),
                    attribution="Alibaba Qwen-Bailian usage traces (alibaba-edu/qwen-bailian-usagetraces-anon), "
                                "Apache-2.0; Wang et al., USENIX ATC'25")


def _roots(by_chat: dict[int, tuple], path: Path) -> dict[int, tuple[int, int]]:
    """Per chat id: (its session's root chat id, its depth below the root); a parent loop is refused."""
    out: dict[int, tuple[int, int]] = {}
    for chat in by_chat:
        chain = [chat]
        while chain[-1] not in out:
            parent = by_chat[chain[-1]][2]
            if parent not in by_chat:  # -1, or a parent before the trace began: a root
                out[chain[-1]] = (chain[-1], 0)
                break
            if len(chain) > len(by_chat):
                raise InputError(f"chat {chat}: its parent_chat_id links loop", path=str(path),
                                 line=by_chat[chat][0], field="parent_chat_id", allowed="links that reach a root (-1)")
            chain.append(parent)
        root, depth = out[chain.pop()]
        while chain:
            depth += 1
            out[chain.pop()] = (root, depth)
    return out
