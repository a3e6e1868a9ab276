"""The vocab-parallel logits all-gather of every TP > 1 step (collectives.py, fitted.py, roofline.py).

Expected values are interpolated by hand from aiconfigurator's H100 NCCL 2.29.2 table
(../shared/data/gpu_profiles/aiconfigurator/h100_sxm/nccl_2.29.2/nccl_perf.csv.gz, all_gather, half,
num_gpus 4): message_size 1,048,576 elements (2 MiB gathered) 0.01913 ms, 2,097,152 elements
(4 MiB) 0.03698 ms.
"""

import copy

import pytest

from servesim.simulator.cost_model import StepShape, make_cost_model
from servesim.simulator.cost_model.calibrated import load_calibrated
from servesim.simulator.cost_model.collectives import Collectives, logits_gather_bytes_per_row
from servesim.simulator.cost_model.fitted import FittedCostModel
from servesim.simulator.specs import default_host, resolve_gpu

LLAMA3_ROW_BYTES = 128256 * 2  # Llama-3 vocab (a multiple of 64) x bf16 logits
# 10 sampled rows: 2,565,120 bytes gathered, between the 2 MiB and 4 MiB rows of the table
TEN_ROWS_S = 1.913e-5 + (10 * LLAMA3_ROW_BYTES - 2 * 2**20) / (2 * 2**20) * (3.698e-5 - 1.913e-5)


def _decode(n, ctx=700):
    return StepShape((1,) * n, (ctx,) * n, n)


def test_row_bytes_follow_vllm_padding_and_the_activation_dtype():
    assert logits_gather_bytes_per_row(128256, 2) == LLAMA3_ROW_BYTES
    assert logits_gather_bytes_per_row(32001, 2) == 32064 * 2  # padded to 64 before the gather


def test_measured_all_gather_is_the_table_interpolated():
    c = Collectives("h100", 4)
    assert c.source.allgather == "measured (NCCL all_gather, host h100-hgx)"
    assert c.allgather_s(2 * 2**20) == pytest.approx(1.913e-5, rel=1e-12)
    assert c.allgather_s(10 * LLAMA3_ROW_BYTES) == pytest.approx(TEN_ROWS_S, rel=1e-12)
    assert c.logits_gather_curve(LLAMA3_ROW_BYTES)(10) == pytest.approx(TEN_ROWS_S, rel=1e-12)
    assert Collectives("h100", 1).allgather_s(1e6) == 0.0


def test_without_a_table_the_ring_link_model():
    g = resolve_gpu("h100-pcie")  # no shipped collective table
    c = Collectives(g, 2)
    assert c.source.allgather.startswith("model: ring")
    h = default_host(g)
    link = h.link_bytes_per_s * h.interconnect_efficiency
    assert c.allgather_s(2**24) == pytest.approx(h.collective_latency_s + 0.5 * 2**24 / link, rel=1e-12)


def test_calibrated_tp4_adds_the_measured_gather_per_sampled_row():
    cm = make_cost_model("calibrated", model="llama-3.1-70b", gpu="h100", tp=4)
    assert cm.logits_gather_source == "measured (NCCL all_gather, host h100-hgx)"
    data = copy.deepcopy(load_calibrated("llama-3.1-70b", "h100", 4).data)
    data["metadata"]["fit_error"]["lm_head"]["origin"] = "measured"  # as if the gather were in it
    without = FittedCostModel(data)
    assert without.logits_gather_source == "in the lm_head (measured)"
    added_s = cm.step_time_s(_decode(10)) - without.step_time_s(_decode(10))
    assert added_s == pytest.approx(TEN_ROWS_S, rel=1e-9)
    # no sampled rows (a step of partial prefills only): no gather
    chunk = StepShape((512,), (0,), 0)
    assert cm.step_time_s(chunk) == without.step_time_s(chunk)


def test_no_gather_at_tp1_or_where_the_lm_head_was_measured_whole():
    tp1 = make_cost_model("calibrated", model="llama-3.1-8b", gpu="h100", tp=1)
    assert tp1.logits_gather_source == "none"
    # LLMServingSim's vLLM profiler times the LogitsProcessor module: GEMM and gather together
    rtx = make_cost_model("calibrated", model="qwen3-32b", gpu="rtx-pro-6000", tp=2)
    assert rtx.logits_gather_source == "in the lm_head (measured)"


def test_roofline_prices_the_gather_from_the_same_table_or_its_link_model():
    tabled = make_cost_model("roofline", model="llama-3.1-70b", gpu="h100", tp=4)
    assert tabled._gather(10) == pytest.approx(TEN_ROWS_S, rel=1e-12)
    explicit = make_cost_model("roofline", model="llama-3.1-70b", gpu="h100", tp=4,
                               interconnect_efficiency=0.5, collective_latency_s=1e-5)
    link = default_host("h100").link_bytes_per_s * 0.5
    assert explicit._gather(10) == pytest.approx(1e-5 + 0.75 * 10 * LLAMA3_ROW_BYTES / link, rel=1e-12)
    assert make_cost_model("roofline", model="llama-3.1-70b", gpu="h100", tp=1)._gather is None
