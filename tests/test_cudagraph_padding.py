"""vLLM CUDA-graph padding in the fitted cost models (simulator/cost_model/cudagraph.py)."""

import pytest

from servesim.simulator.cost_model import make_cost_model
from servesim.simulator.cost_model.base import StepShape
from servesim.simulator.cost_model.cudagraph import default_capture_sizes, padded_tokens
from servesim.traces.errors import InputError


def test_default_capture_sizes_follow_vllm():
    # [1, 2, 4] + range(8, 256, 8) + range(256, max + 1, 16), max = min(2 * max_num_seqs, 512, mbt)
    sizes = default_capture_sizes(128, 2048)
    assert sizes[:5] == (1, 2, 4, 8, 16) and sizes[-3:] == (240, 248, 256) and len(sizes) == 35
    assert default_capture_sizes(512, 300)[-3:] == (256, 272, 288)
    assert default_capture_sizes(2, 2048) == (1, 2, 4)
    assert [padded_tokens(sizes, n) for n in (1, 3, 13, 250, 256, 257, 495)] == [1, 4, 16, 256, 256, 257, 495]
    assert padded_tokens((), 13) == 13


def _decode(n, ctx=700):
    return StepShape((1,) * n, (ctx,) * n, n)


def test_padding_prices_token_parallel_ops_at_the_graph_size():
    plain = make_cost_model("calibrated", model="mistral-nemo-12b", gpu="h100", tp=1)
    graph = make_cost_model("calibrated", model="mistral-nemo-12b", gpu="h100", tp=1,
                            cudagraph_capture_sizes=default_capture_sizes(128, 2048))
    assert plain.step_time_s(_decode(13)) == pytest.approx(0.00986460365390625, rel=1e-12)
    # 13 decodes run the 16-token graph: GEMMs/elementwise at 16 tokens, attention and the
    # lm_head/sampler at the 13 real requests.
    assert graph.step_time_s(_decode(13)) == pytest.approx(0.00988540580390625, rel=1e-12)
    layers = plain._layers
    extra = layers * (plain._dense(16) - plain._dense(13)) + plain._tok(16) - plain._tok(13)
    assert graph.step_time_s(_decode(13)) - plain.step_time_s(_decode(13)) == pytest.approx(extra, rel=1e-9)
    # a batch on a capture size, or above the largest one (no graph), is unchanged
    assert graph.step_time_s(_decode(16)) == plain.step_time_s(_decode(16))
    mixed = StepShape((1,) * 12 + (480,), (700,) * 12 + (96,), 13)
    assert graph.step_time_s(mixed) == plain.step_time_s(mixed)


def test_padding_pads_the_all_reduce_too():
    plain = make_cost_model("calibrated", model="llama-3.1-70b", gpu="h100", tp=4)
    graph = make_cost_model("calibrated", model="llama-3.1-70b", gpu="h100", tp=4,
                            cudagraph_capture_sizes=default_capture_sizes(128, 2048))
    # + the logits all-gather of 10 bf16 rows (tests/test_logits_gather.py), not padded: it runs
    # outside the graph on the real rows
    gather_s = 1.913e-5 + (10 * 128256 * 2 - 2 * 2**20) / (2 * 2**20) * (3.698e-5 - 1.913e-5)
    assert plain.step_time_s(_decode(10)) == pytest.approx(0.016381710248178933 + gather_s, rel=1e-12)
    assert graph.step_time_s(_decode(10)) == pytest.approx(0.016610871795855662 + gather_s, rel=1e-12)


def test_bad_capture_sizes_are_named():
    with pytest.raises(InputError, match="cudagraph_capture_sizes"):
        make_cost_model("calibrated", model="mistral-nemo-12b", gpu="h100", tp=1, cudagraph_capture_sizes=[0, 8])
