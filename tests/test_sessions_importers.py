"""Session trace importers: the canonical session format (traces/sessions.py) and the Qwen-Bailian
KVCache trace (traces/bailian.py): exact specs from hand-built files, sniffing, and bad rows naming
file, line, field and what is allowed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servesim.traces import load_workload, sniff_format
from servesim.traces.canonical import save_workload
from servesim.traces.errors import InputError

CSV = """session_id,turn,start_s,think_time_s,tool_time_s,input_tokens,tool_output_tokens,output_tokens
fix-42,0,0.0,,,1800,,250
fix-42,2,,12.5,,60,,90
b,0,1.5,,,100,,10
fix-42,1,,0,3.2,40,1200,180
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def jsonl(tmp_path: Path, name: str, rows: list[dict]) -> Path:
    return write(tmp_path, name, "".join(json.dumps(r) + "\n" for r in rows))


def test_canonical_sessions_grow_the_context_and_link_the_turns(tmp_path):
    path = write(tmp_path, "agent.csv", CSV)
    assert sniff_format(path) == "sessions"
    wl = load_workload(path)
    by_id = {r.request_id: r for r in wl.requests}
    t0, t1, t2 = (by_id[f"fix-42-t{k}"] for k in range(3))
    assert (t0.prompt_len, t1.prompt_len, t2.prompt_len) == (1800, 1800 + 250 + 1200 + 40, 3290 + 180 + 60)
    assert (t1.parent_request_id, t1.think_time_s) == ("fix-42-t0", 3.2)  # tool time + think time
    assert (t2.parent_request_id, t2.think_time_s) == ("fix-42-t1", 12.5)
    assert (t1.arrival_time_s, t2.arrival_time_s) == (3.2, 3.2 + 12.5)  # lower bounds
    assert [r.is_last_turn for r in (t0, t1, t2)] == [False, False, True] and by_id["b-t0"].is_last_turn
    assert {r.session_id for r in (t0, t1, t2)} == {"fix-42"}
    assert [r.request_id for r in wl.requests] == ["fix-42-t0", "b-t0", "fix-42-t1", "fix-42-t2"]


def test_canonical_sessions_jsonl_and_open_loop(tmp_path):
    rows = [{"session_id": "a", "turn": 0, "start_s": 2.0, "input_tokens": 10, "output_tokens": 5,
             "prefix_group": 3, "prefix_len": 100},
            {"session_id": "a", "turn": 1, "think_time_s": 1.0, "tool_time_s": 0.5, "input_tokens": 7,
             "tool_output_tokens": 3, "output_tokens": 2}]
    path = jsonl(tmp_path, "a.jsonl", rows)
    t0, t1 = load_workload(path, arrivals="open_loop").requests
    assert (t0.prompt_len, t0.prefix_group, t0.prefix_len) == (110, 3, 100)
    assert t1.prompt_len == 110 + 5 + 3 + 7 and t1.prefix_len == 100
    assert t1.parent_request_id is None and t1.think_time_s is None and t1.arrival_time_s == 3.5
    closed = load_workload(path).requests[1]
    assert closed.parent_request_id == "a-t0" and closed.think_time_s == 1.5


def test_canonical_request_format_keeps_the_turn_links(tmp_path):
    wl = load_workload(write(tmp_path, "agent.csv", CSV))
    for ext in ("jsonl", "csv"):
        out = tmp_path / f"copy.{ext}"
        save_workload(wl, out)
        back = load_workload(out)
        assert [(r.request_id, r.parent_request_id, r.think_time_s) for r in back.requests] == \
            [(r.request_id, r.parent_request_id, r.think_time_s) for r in wl.requests]


@pytest.mark.parametrize("text, line, field, allowed", [
    ("session_id,turn,input_tokens,output_tokens\na,0,5,1\n", 2, "start_s", "turn 0"),
    ("session_id,turn,start_s,think_time_s,input_tokens,output_tokens\na,0,0,1,5,1\n", 2, "think_time_s",
     "later turns only"),
    ("session_id,turn,start_s,input_tokens,output_tokens\na,0,0,5,1\na,1,3,5,1\n", 3, "start_s", "turn 0 only"),
    ("session_id,turn,start_s,input_tokens,output_tokens\na,0,0,5,1\na,2,,5,1\n", 3, "turn", "each once"),
    ("session_id,turn,start_s,input_tokens,output_tokens\na,0,0,5,1\na,0,1,5,1\n", 3, "turn", "each once"),
    ("session_id,turn,start_s,input_tokens,output_tokens\na,0,0,5,0\n", 2, "output_tokens", ">= 1"),
    ("session_id,turn,start_s,input_tokens,output_tokens\na,0,0,five,1\n", 2, "input_tokens", "integer"),
    ("session_id,turn,start_s,input_tokens,output_tokens\na,0,0,0,1\n", 2, "input_tokens", ">= 1"),
    ("session_id,turn,start_s,input_tokens,output_tokens,tool_s\na,0,0,5,1,2\n", 2, "tool_s", "tool_time_s"),
    ("session_id,turn,start_s,think_time_s,input_tokens,output_tokens\na,0,0,,5,1\na,1,,-2,5,1\n", 3,
     "think_time_s", ">= 0"),
])
def test_canonical_sessions_bad_rows(tmp_path, text, line, field, allowed):
    path = write(tmp_path, "bad.csv", text)
    with pytest.raises(InputError) as err:
        load_workload(path, fmt="sessions")
    e = err.value
    assert (e.path, e.line, e.field) == (str(path), line, field) and allowed in (e.allowed or ""), str(e)


def test_unknown_arrivals_mode_and_format_name_suggest_the_right_one(tmp_path):
    path = write(tmp_path, "agent.csv", CSV)
    with pytest.raises(InputError, match="did you mean 'closed_loop'") as err:
        load_workload(path, arrivals="closed")
    assert err.value.field == "arrivals"
    with pytest.raises(InputError, match="did you mean 'sessions'"):
        load_workload(path, fmt="sesions")


# --- Qwen-Bailian ------------------------------------------------------------------------------------

BAILIAN = [
    {"chat_id": 1, "parent_chat_id": -1, "timestamp": 0.5, "input_length": 40, "output_length": 8, "type": "text",
     "turn": 1, "hash_ids": [1, 2, 3]},
    {"chat_id": 2, "parent_chat_id": -1, "timestamp": 1.0, "input_length": 20, "output_length": 4, "type": "search",
     "turn": 1, "hash_ids": [9, 10]},
    {"chat_id": 3, "parent_chat_id": 1, "timestamp": 4.0, "input_length": 70, "output_length": 6, "type": "text",
     "turn": 2, "hash_ids": [1, 2, 3, 4, 5]},
    {"chat_id": 5, "parent_chat_id": 1, "timestamp": 6.0, "input_length": 60, "output_length": 2, "type": "text",
     "turn": 2, "hash_ids": [1, 2, 3, 7]},
    {"chat_id": 4, "parent_chat_id": 3, "timestamp": 9.0, "input_length": 90, "output_length": 6, "type": "file",
     "turn": 3, "hash_ids": [1, 2, 3, 4, 5, 6]},
    {"chat_id": 8, "parent_chat_id": 77, "timestamp": 9.5, "input_length": 16, "output_length": 1, "type": "text",
     "turn": 4, "hash_ids": [12]},
]


def test_bailian_sessions_are_trees_of_parent_links(tmp_path):
    path = jsonl(tmp_path, "qwen_traceB_blksz_16.jsonl", BAILIAN)
    assert sniff_format(path) == "bailian"  # not mooncake, whose columns it also has
    wl = load_workload(path)
    by_id = {r.request_id: r for r in wl.requests}
    c3, c5, c4, c8 = by_id["bailian-3"], by_id["bailian-5"], by_id["bailian-4"], by_id["bailian-8"]
    assert (c3.parent_request_id, c3.think_time_s) == ("bailian-1", 3.5)
    assert (c5.parent_request_id, c5.think_time_s) == ("bailian-1", 5.5)  # a second branch of chat 1
    assert (c4.parent_request_id, c4.think_time_s) == ("bailian-3", 5.0)
    assert {c3.session_id, c4.session_id, c5.session_id} == {"bailian-1"}
    assert c8.parent_request_id is None and c8.session_id == "bailian-8"  # its parent precedes the trace
    assert [by_id[f"bailian-{c}"].is_last_turn for c in (1, 2, 3, 4, 5)] == [False, True, False, True, True]
    assert c4.prefix_hash_ids == (1, 2, 3, 4, 5, 6) and c4.prefix_block_len == 16
    assert "ATC" in wl.attribution
    recorded = load_workload(path, arrivals="recorded")
    assert all(r.parent_request_id is None for r in recorded.requests)
    assert [r.arrival_time_s for r in recorded.requests] == [0.5, 1.0, 4.0, 6.0, 9.0, 9.5]


def test_bailian_tree_runs_closed_loop(tmp_path):
    from servesim.simulator.build import build_engine
    from test_sessions import cfg

    wl = load_workload(jsonl(tmp_path, "t.jsonl", BAILIAN))
    engine = build_engine(cfg(), wl)
    engine.run()
    r = engine.metrics.requests
    assert r["bailian-3"].arrival_s == r["bailian-1"].finish_s + 3.5
    assert r["bailian-5"].arrival_s == r["bailian-1"].finish_s + 5.5
    assert r["bailian-4"].arrival_s == r["bailian-3"].finish_s + 5.0
    # hash blocks of 16 tokens, KV blocks of 4: chat 3 re-reads chat 1's 3 hash blocks (48 > 40 tokens:
    # chat 1's prompt covers 40 of them, 10 KV blocks)
    assert r["bailian-3"].num_cached_tokens == 40


@pytest.mark.parametrize("change, line, field", [
    ({1: {"chat_id": 1}}, 2, "chat_id"),  # chat 1 twice
    ({2: {"timestamp": 0.1}}, 3, "timestamp"),  # a child before its parent
    ({0: {"parent_chat_id": 1}}, 1, "parent_chat_id"),  # its own parent
    ({0: {"parent_chat_id": 3}}, 1, "parent_chat_id"),  # 1 -> 3 -> 1: a loop
    ({0: {"hash_ids": [1, 2, 3, 4]}}, 1, "hash_ids"),  # 4 blocks of 16 for 40 tokens
    ({0: {"output_length": 0}}, 1, "output_length"),
    ({0: {"parent_chat_id": -2}}, 1, "parent_chat_id"),
])
def test_bailian_bad_rows(tmp_path, change, line, field):
    rows = [dict(r) for r in BAILIAN]
    for i, values in change.items():
        rows[i].update(values)
    path = jsonl(tmp_path, "bad.jsonl", rows)
    with pytest.raises(InputError) as err:
        load_workload(path, fmt="bailian")
    e = err.value
    assert (e.path, e.field) == (str(path), field), str(e)
    assert e.line == line or field == "parent_chat_id", str(e)


def test_bailian_missing_field_and_bad_mode(tmp_path):
    rows = [{k: v for k, v in BAILIAN[0].items() if k != "parent_chat_id"}]
    path = jsonl(tmp_path, "m.jsonl", rows)
    with pytest.raises(InputError) as err:
        load_workload(path, fmt="bailian")
    assert (err.value.line, err.value.field) == (1, "parent_chat_id")
    with pytest.raises(InputError, match="did you mean 'recorded'"):
        load_workload(jsonl(tmp_path, "ok.jsonl", BAILIAN), arrivals="recorde")
