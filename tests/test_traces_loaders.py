"""Loaders against the real shared traces: counts and means from /work/shared/data/README.md."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from servesim.traces import available_formats, load_workload, sniff_format
from inner_loop import share  # tests/inner_loop.py

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
TRACES = SHARED / "data" / "traces"


def trace(rel: str) -> Path:
    path = TRACES / rel
    if not path.is_file():
        pytest.skip(f"shared trace {path} not present (the shared data folder is optional)")
    return path


@pytest.fixture(scope="module")
def mooncake_conv():
    return load_workload(trace("mooncake_fast25/conversation_trace.jsonl.gz"))


def _means(workload):
    prompt = np.array([r.prompt_len for r in workload.requests])
    output = np.array([r.output_len for r in workload.requests])
    return prompt.mean(), output.mean()


def test_available_formats():
    assert available_formats() == ["azure", "bailian", "burstgpt", "canonical", "lengths", "llmservingsim",
                                   "mooncake", "oracle", "servegen", "sessions", "sharegpt"]


def test_mooncake_conversation_counts_and_means(mooncake_conv):
    w = mooncake_conv
    assert len(w) == 12031
    prompt, output = _means(w)
    assert round(prompt) == 12035 and round(output) == 343
    assert w.requests[0].arrival_time_s == 0.0
    assert w.requests[-1].arrival_time_s == pytest.approx(3536.999)
    assert max(r.prompt_len for r in w.requests) == 126195
    # hash ids cover the prompt exactly: len == ceil(input_length / 512) for every row
    assert all(len(r.prefix_hash_ids) == -(-r.prompt_len // 512) for r in w.requests)


def test_mooncake_conversation_materialises_no_token_ids(mooncake_conv):
    """What keeps loading it cheap (~0.2 s; ~150 M tokens if built): ids are made on demand from the
    hash ids (traces/workload.py)."""
    assert all(r.prompt_token_ids is None and r.prefix_hash_ids for r in mooncake_conv.requests)


def test_mooncake_ideal_block_reuse_is_36_6_percent(mooncake_conv):
    total = sum(len(r.prefix_hash_ids) for r in mooncake_conv.requests)
    distinct = len({h for r in mooncake_conv.requests for h in r.prefix_hash_ids})
    assert distinct == 182790
    assert 1 - distinct / total == pytest.approx(0.366, abs=0.0005)


def test_mooncake_synthetic_counts():
    w = load_workload(trace("mooncake_fast25/synthetic_trace.jsonl.gz"))
    assert len(w) == 3993
    prompt, output = _means(w)
    assert round(prompt) == 15325 and round(output) == 149
    total = sum(len(r.prefix_hash_ids) for r in w.requests)
    distinct = len({h for r in w.requests for h in r.prefix_hash_ids})
    assert 1 - distinct / total == pytest.approx(0.640, abs=0.0005)


@pytest.mark.parametrize(
    ("name", "rows", "mean_prompt", "mean_output", "rate"),
    [("code", 8819, 2048, 28, 2.57), ("conv", 19366, 1155, 211, 5.53)],
)
def test_azure(name, rows, mean_prompt, mean_output, rate):
    path = trace(f"azure_llm_inference_2023/AzureLLMInferenceTrace_{name}.csv")
    assert sniff_format(path) == "azure"
    w = load_workload(path)
    assert len(w) == rows
    prompt, output = _means(w)
    assert round(prompt) == mean_prompt and round(output) == mean_output
    assert w.requests[0].arrival_time_s == 0.0
    assert len(w) / w.duration_s == pytest.approx(rate, abs=0.01)


@pytest.mark.parametrize(
    ("stem", "rows", "mean_prefill", "mean_decode"),
    share([
        ("sharegpt_8k_filtered_stats_llama2_tokenizer", 30731, 2340, 439),
        ("bwb_stats_llama2_tokenizer_filtered_v2", 33768, 1067, 1613),
        ("arxiv_summarization_stats_llama2_tokenizer_filtered_v2", 28257, 2588, 291),
    ], [2]),
)
def test_length_datasets(stem, rows, mean_prefill, mean_decode):
    path = trace(f"request_length_datasets/{stem}.csv.gz")
    w = load_workload(path, rate_per_s=10.0, seed=3)
    assert len(w) == rows
    prompt, output = _means(w)
    assert round(prompt) == mean_prefill and round(output) == mean_decode
    assert len(w) / w.duration_s == pytest.approx(10.0, rel=0.03)  # generated Poisson arrivals
    again = load_workload(path, rate_per_s=10.0, seed=3, num_requests=50)
    assert [r.arrival_time_s for r in again.requests] == [
        r.arrival_time_s for r in w.requests[:50]]


def test_lengths_gamma_arrivals():
    path = trace("request_length_datasets/sharegpt_8k_filtered_stats_llama2_tokenizer.csv.gz")
    w = load_workload(path, rate_per_s=5.0, process="gamma", cv=2.0, seed=1)
    gaps = np.diff([r.arrival_time_s for r in w.requests])
    assert gaps.std() / gaps.mean() == pytest.approx(2.0, rel=0.1)


def test_llmservingsim_sharegpt():
    w = load_workload(trace("llmservingsim_sharegpt/sharegpt-llama-3.1-8b-300-sps10.jsonl.gz"))
    assert len(w) == 300
    prompt, output = _means(w)
    assert round(prompt) == 857 and round(output) == 653
    first = w.requests[0]
    assert first.arrival_time_s == pytest.approx(0.046926808)
    assert first.prompt_token_ids is not None and len(first.prompt_token_ids) == first.prompt_len
    assert first.token_ids()[:3] == [5971, 2927, 220]  # real Llama-3.1 ids
    assert w.duration_s == pytest.approx(29.18, abs=0.01)


def test_llmservingsim_lengths_csv_uses_file_arrivals():
    path = trace("llmservingsim_sharegpt/sharegpt-llama-3.1-8b-300-sps10.lengths.csv")
    csv_w = load_workload(path)
    assert len(csv_w) == 300
    assert csv_w.requests[0].arrival_time_s == pytest.approx(0.046926808)
    assert round(_means(csv_w)[0]) == 857
