"""Bad input: every loader raises InputError naming the file, the 1-based line and the field."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from servesim.traces import InputError, load_workload, sniff_format


def write_jsonl(path: Path, rows: list[dict], *, gz: bool = False) -> Path:
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if gz:
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def expect(path: Path, line: int | None, field: str | None, *fragments: str, **kwargs):
    with pytest.raises(InputError) as err:
        load_workload(path, **kwargs)
    message = str(err.value)
    assert str(path) in message
    if line is not None:
        assert err.value.line == line and f"line {line}" in message
    if field is not None:
        assert err.value.field == field and f"'{field}'" in message
    for fragment in fragments:
        assert fragment in message
    return err.value


MC = {"timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [1, 2]}


@pytest.mark.parametrize(
    ("bad", "field", "fragment"),
    [
        ({"input_length": 0}, "input_length", "0"),
        ({"output_length": -3}, "output_length", "-3"),
        ({"input_length": "600"}, "input_length", "'600'"),
        ({"timestamp": "soon"}, "timestamp", "'soon'"),
        ({"hash_ids": [1, 2, 3]}, "hash_ids", "3 hash ids"),
        ({"hash_ids": [1, -2]}, "hash_ids", "-2"),
    ],
)
def test_mooncake_bad_values(tmp_path, bad, field, fragment):
    path = write_jsonl(tmp_path / "t.jsonl.gz", [MC, {**MC, **bad}], gz=True)
    expect(path, 2, field, fragment, fmt="mooncake")


def test_mooncake_missing_field_unsorted_and_bad_json(tmp_path):
    row = {k: v for k, v in MC.items() if k != "output_length"}
    expect(write_jsonl(tmp_path / "a.jsonl", [MC, MC, row]), 3, "output_length", "missing",
           fmt="mooncake")
    unsorted = write_jsonl(tmp_path / "b.jsonl", [{**MC, "timestamp": 5}, MC])
    expect(unsorted, 2, "timestamp", "sorted", fmt="mooncake")
    assert len(load_workload(unsorted, fmt="mooncake", require_sorted=False)) == 2
    broken = tmp_path / "c.jsonl"
    broken.write_text(json.dumps(MC) + "\n{not json\n")
    expect(broken, 2, None, "not valid JSON", fmt="mooncake")


def test_empty_files(tmp_path):
    empty_jsonl = tmp_path / "e.jsonl"
    empty_jsonl.write_text("\n")
    expect(empty_jsonl, None, None, "empty", fmt="mooncake")
    empty_csv = tmp_path / "e.csv"
    empty_csv.write_text("")
    expect(empty_csv, None, None, "empty", fmt="azure")
    header_only = tmp_path / "h.csv"
    header_only.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    expect(header_only, None, None, "no requests", fmt="azure")


AZ_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
AZ_ROW = "2023-11-16 18:17:03.9799600,4808,10\n"


@pytest.mark.parametrize(
    ("row", "field", "fragment"),
    [
        ("2023-11-16 18:17:04.0,abc,8\n", "ContextTokens", "'abc'"),
        ("2023-11-16 18:17:04.0,100,0\n", "GeneratedTokens", "'0'"),
        ("2023-11-16 18:17:04.0,12.5,3\n", "ContextTokens", "'12.5'"),
        ("yesterday,100,3\n", "TIMESTAMP", "'yesterday'"),
        ("2023-11-16 18:17:02.0,100,3\n", "TIMESTAMP", "sorted"),
    ],
)
def test_azure_bad_rows(tmp_path, row, field, fragment):
    path = tmp_path / "az.csv"
    path.write_text(AZ_HEADER + AZ_ROW + row)
    expect(path, 3, field, fragment, fmt="azure")


def test_azure_missing_column(tmp_path):
    path = tmp_path / "az.csv"
    path.write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:17:03.9,4808\n")
    expect(path, 1, "GeneratedTokens", "missing column", fmt="azure")


def test_lengths_errors(tmp_path):
    path = tmp_path / "len.csv"
    path.write_text("num_prefill_tokens,num_decode_tokens\n10,5\n7,-1\n")
    expect(path, 3, "num_decode_tokens", "'-1'", fmt="lengths", rate_per_s=1.0)
    path.write_text("num_prefill_tokens,num_decode_tokens\n10,5\n")
    expect(path, None, "rate_per_s", "no arrival times", fmt="lengths")
    path.write_text("prefill,decode\n10,5\n")
    expect(path, 1, "num_prefill_tokens", "no length column", fmt="lengths", rate_per_s=1.0)
    path.write_text("num_prefill_tokens,num_decode_tokens\n10,5\n")
    expect(path, None, "cv", "cv", fmt="lengths", rate_per_s=1.0, cv=2.0)  # cv needs gamma


LSS = {"input_toks": 3, "output_toks": 2, "arrival_time_ns": 0, "input_tok_ids": [1, 2, 3]}


def test_llmservingsim_errors(tmp_path):
    path = write_jsonl(tmp_path / "w.jsonl", [LSS, {**LSS, "input_tok_ids": [1, 2]}])
    expect(path, 2, "input_tok_ids", "2 token ids", fmt="llmservingsim")
    path = write_jsonl(tmp_path / "w.jsonl", [LSS, {**LSS, "input_tok_ids": [1, "x", 3]}])
    expect(path, 2, "input_tok_ids", "'x'", fmt="llmservingsim")
    path = write_jsonl(tmp_path / "w.jsonl", [{**LSS, "arrival_time_ns": 9}, LSS])
    expect(path, 2, "arrival_time_ns", "sorted", fmt="llmservingsim")


ORACLE = {"req_id": "a", "prompt_token_ids": [1, 2], "max_tokens": 4, "arrival_step": 0}


def test_oracle_errors(tmp_path):
    path = write_jsonl(tmp_path / "o.jsonl", [ORACLE, {**ORACLE, "req_id": "b", "max_tokens": 0}])
    expect(path, 2, "max_tokens", "0", fmt="oracle")
    path = write_jsonl(tmp_path / "o.jsonl", [ORACLE, ORACLE])
    expect(path, 2, "req_id", "duplicate", fmt="oracle")
    path = write_jsonl(tmp_path / "o.jsonl", [{**ORACLE, "prompt_token_ids": []}])
    expect(path, 1, "prompt_token_ids", "empty", fmt="oracle")
    path = write_jsonl(tmp_path / "o.jsonl", [{**ORACLE, "arrival_step": -1}])
    expect(path, 1, "arrival_step", "-1", fmt="oracle")
    no_step = {k: v for k, v in ORACLE.items() if k != "arrival_step"}
    expect(write_jsonl(tmp_path / "o.jsonl", [no_step]), 1, "arrival_step", "missing",
           fmt="oracle")


def test_canonical_errors(tmp_path):
    path = tmp_path / "c.csv"
    path.write_text("request_id,arrival_time_s,output_len,prompt_len,prompt_token_ids\n"
                    "a,0.0,3,2,5 6\nb,0.5,3,3,5 6\n")
    expect(path, 3, "prompt_token_ids", "2 token ids but prompt_len is 3")
    path.write_text("request_id,arrival_time_s,output_len,prompt_len\na,0.0,3,2\nb,x,3,2\n")
    expect(path, 3, "arrival_time_s", "'x'")
    path.write_text("request_id,arrival_time_s,output_len,prompt_len,priorty\na,0,3,2,1\n")
    expect(path, 2, "priorty", "unknown column")
    path.write_text("request_id,arrival_time_s,output_len\na,0,3\n")
    expect(path, 2, "prompt_len", "neither")
    jsonl = write_jsonl(tmp_path / "c.jsonl", [
        {"request_id": "a", "arrival_time_s": 0, "output_len": 1, "prompt_len": 4},
        {"request_id": "b", "arrival_time_s": 0, "output_len": 1, "prompt_len": 4,
         "prefix_len": 2},
    ])
    expect(jsonl, 2, "prefix_group", "prefix_group")


def test_unknown_format_option_and_auto_failure(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [MC])
    err = expect(path, None, "fmt", "unknown trace format", fmt="mooncak")
    assert "mooncake" in err.allowed and "canonical" in err.allowed
    err = expect(path, None, "rate", "unknown option", fmt="mooncake", rate=3)
    assert "block_len" in err.allowed
    odd = write_jsonl(tmp_path / "odd.jsonl", [{"when": 1, "tokens": 5}])
    err = expect(odd, None, "fmt", "cannot tell the trace format", "tried", "mooncake (needs")
    with pytest.raises(InputError, match="file not found"):
        sniff_format(tmp_path / "missing.jsonl")


def test_auto_sniffing(tmp_path):
    assert sniff_format(write_jsonl(tmp_path / "m.jsonl.gz", [MC], gz=True)) == "mooncake"
    assert sniff_format(write_jsonl(tmp_path / "o.jsonl", [ORACLE])) == "oracle"
    assert sniff_format(write_jsonl(tmp_path / "l.jsonl", [LSS])) == "llmservingsim"
    noext = tmp_path / "trace_without_extension"
    noext.write_text(AZ_HEADER + AZ_ROW)
    assert sniff_format(noext) == "azure"
    assert len(load_workload(noext)) == 1
