"""Raw ShareGPT conversations (e.g. ShareGPT_V3_unfiltered_cleaned_split.json): a JSON array of

    {"id": "...", "conversations": [{"from": "human", "value": "..."}, {"from": "gpt", "value": "..."}, ...]}

As vLLM's ShareGPTDataset reads it: an entry with at least two turns is one request, its first turn
the prompt and its second the completion; entries with fewer turns are skipped (counted in the
workload's source). Requests keep the file's order (vLLM shuffles with its seed: `--dataset-name
sharegpt --dataset-path FILE` samples from these lengths instead).

Token counts, tokenizer-free by default: ceil(characters / `chars_per_token`), at least 1, with
`chars_per_token` = 4.0, OpenAI's rule of thumb for English text ("one token generally corresponds
to ~4 characters of text for common English text", help.openai.com "What are tokens and how to
count them?"). It is an estimate: code and non-English text run to more tokens per character.
`tokenizer="org/name"` counts with that Hugging Face tokenizer instead (transformers'
AutoTokenizer, `add_special_tokens=False` as vLLM counts; only where transformers is installed).
`prune=True` applies vLLM's is_valid_sequence limits (prompt and output >= 4 tokens, prompt
<= 1024, prompt + output <= 2048).

The file has no arrival times: `rate_per_s` (and `process`, `cv`, `seed`) give them, as for a
length-only trace (`replay FILE --request-rate R`); inf sends every request at t = 0.

A malformed entry (not an object, no `conversations` list, a turn without a string `value`) is an
InputError naming the file, the line the entry starts on and the field.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from servesim.traces.distributions import arrival_times
from servesim.traces.errors import InputError
from servesim.traces.external import trace_name
from servesim.traces.registry import register_format
from servesim.traces.rows import open_text
from servesim.traces.synthetic_config import ArrivalConfig
from servesim.traces.workload import RequestSpec, Workload

CHARS_PER_TOKEN = 4.0  # OpenAI's rule of thumb for English text (see the module docstring)
# vLLM 0.19.1 benchmarks/datasets.py is_valid_sequence defaults.
PRUNE_MIN_LEN, PRUNE_MAX_PROMPT_LEN, PRUNE_MAX_TOTAL_LEN = 4, 1024, 2048


def iter_json_array(path: Path):
    """Yield (1-based line where the element starts, element) for each element of a JSON array file."""
    with open_text(path) as fh:
        text = fh.read()
    decoder = json.JSONDecoder()
    i = _skip_ws(text, 0)
    if text[i:i + 1] == "\ufeff":  # a UTF-8 byte-order mark read as text
        i = _skip_ws(text, i + 1)
    if text[i:i + 1] != "[":
        raise InputError("not a JSON array", path=str(path), line=text.count("\n", 0, i) + 1,
                         allowed="a ShareGPT JSON file: [ {\"conversations\": [...]}, ... ]")
    line, last = 1, 0
    i = _skip_ws(text, i + 1)
    while i < len(text) and text[i] != "]":
        line += text.count("\n", last, i)
        last = i
        try:
            element, end = decoder.raw_decode(text, i)
        except json.JSONDecodeError as exc:
            raise InputError(f"not valid JSON ({exc.msg})", path=str(path), line=exc.lineno,
                             allowed="a JSON array of conversation objects") from None
        yield line, element
        i = _skip_ws(text, end)
        if text[i:i + 1] == ",":
            i = _skip_ws(text, i + 1)
        elif text[i:i + 1] != "]":
            raise InputError("expected ',' or ']' after an entry", path=str(path),
                             line=text.count("\n", 0, i) + 1, allowed="a JSON array")


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _counter(tokenizer: str | None, chars_per_token: float):
    if not (isinstance(chars_per_token, (int, float)) and math.isfinite(chars_per_token) and chars_per_token > 0):
        raise InputError(f"got {chars_per_token!r}", field="chars_per_token", allowed="a number > 0")
    if tokenizer is None:
        return lambda text: max(1, math.ceil(len(text) / chars_per_token))
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise InputError(f"tokenizer {tokenizer!r} needs the transformers package, which is not installed",
                         field="tokenizer", allowed="no tokenizer (the 4-characters-per-token estimate)") from None
    try:
        tok = AutoTokenizer.from_pretrained(tokenizer)
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot load tokenizer {tokenizer!r} ({exc})", field="tokenizer",
                         allowed="a Hugging Face tokenizer id or folder") from None
    return lambda text: max(1, len(tok(text, add_special_tokens=False).input_ids))


def _turn_text(entry: dict, turn: int, path: Path, line: int) -> str:
    value = entry["conversations"][turn]
    text = value.get("value") if isinstance(value, dict) else None
    if not isinstance(text, str):
        raise InputError(f"turn {turn} has no string 'value'", path=str(path), line=line,
                         field=f"conversations[{turn}].value", allowed='{"from": ..., "value": "text"}')
    return text


@register_format("sharegpt", signatures=(("conversations",),), encodings=("jsonl",))
def load_sharegpt(path: Path, *, rate_per_s: float | None = None, process: str = "poisson", cv: float | None = None,
                  seed: int = 0, num_requests: int | None = None, chars_per_token: float = CHARS_PER_TOKEN,
                  tokenizer: str | None = None, prune: bool = False) -> Workload:
    """Raw ShareGPT JSON: first turn = prompt, second = output; lengths by a 4-chars/token estimate."""
    if rate_per_s is None:  # before reading what may be a large file
        raise InputError("a ShareGPT file has no arrival times", field="rate_per_s",
                         allowed="a rate: --request-rate R (and --burstiness) on the command line, "
                                 "rate_per_s (and process, cv, seed) in Python or YAML options")
    count = _counter(tokenizer, chars_per_token)
    lengths: list[tuple[int, int]] = []
    skipped = 0
    for line, entry in iter_json_array(path):
        if not isinstance(entry, dict) or not isinstance(entry.get("conversations"), list):
            raise InputError("an entry without a 'conversations' list", path=str(path), line=line,
                             field="conversations", allowed='{"conversations": [{"from": ..., "value": ...}, ...]}')
        if len(entry["conversations"]) < 2:
            skipped += 1
            continue
        prompt, output = count(_turn_text(entry, 0, path, line)), count(_turn_text(entry, 1, path, line))
        if prune and not (prompt >= PRUNE_MIN_LEN and output >= PRUNE_MIN_LEN and prompt <= PRUNE_MAX_PROMPT_LEN
                          and prompt + output <= PRUNE_MAX_TOTAL_LEN):
            skipped += 1
            continue
        lengths.append((prompt, output))
        if num_requests is not None and len(lengths) >= num_requests:
            break
    if not lengths:
        raise InputError("no conversation with two turns" + (" within the prune limits" if prune else ""),
                         path=str(path), allowed="entries with at least two conversation turns")
    times = _arrivals(rate_per_s, process, cv, seed, len(lengths))
    how = f"tokenizer {tokenizer}" if tokenizer else f"~{chars_per_token:g} chars/token"
    rate = "every request at t = 0" if math.isinf(rate_per_s) else f"{process} arrivals at {rate_per_s:g}/s"
    source = f"{path} ({how}, {rate}, seed {seed}" + (f", {skipped} entries skipped" if skipped else "") + ")"
    requests = [RequestSpec(f"sharegpt-{i}", float(t), p, o) for i, (t, (p, o)) in enumerate(zip(times, lengths))]
    return Workload(requests, name=trace_name(path), source=source)


def _arrivals(rate_per_s: float, process: str, cv: float | None, seed: int, num: int) -> list[float]:
    if rate_per_s == math.inf:
        return [0.0] * num
    arrival = ArrivalConfig(process=process, rate_per_s=rate_per_s, cv=cv)
    return arrival_times(arrival, np.random.default_rng(seed), num=num).tolist()
