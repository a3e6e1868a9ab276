"""The "how much CPU KV do I need?" figure: TTFT and hit rates against the CPU tier's size, drawn
whenever a sweep varies it (servesim/plots/offload.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from servesim.plots.offload import tier_axis, tier_sizing, tier_sizing_table
from servesim.scenario import run_scenario

ROOT = Path(__file__).resolve().parents[1]
AGENTIC = ROOT / "scenarios" / "cpu_kv_sizing_agentic.yaml"


@pytest.fixture(scope="module")
def tier_sweep(tmp_path_factory):
    # The agentic scenario's smoke variant (16 requests, 512 GPU blocks) at two sizes: off and 8 GiB.
    return run_scenario(AGENTIC, out_dir=tmp_path_factory.mktemp("tier"), smoke=True,
                        sets={"sweep.kv_offload.kv_offloading_size": [None, 8]})


def test_the_table_has_one_row_per_size_with_the_runs_own_rates(tier_sweep):
    assert tier_axis(tier_sweep) == "kv_offload.kv_offloading_size"
    t = tier_sweep.table.set_index(tier_sweep.table["kv_offload.kv_offloading_size"].fillna(0).astype(float))
    rows = tier_sizing_table(tier_sweep).set_index("tier")
    assert list(rows.index) == [0.0, 8.0] and set(rows["series"]) == {""}
    off, on = rows.loc[0.0], rows.loc[8.0]
    assert off["cpu_hit_rate"] == 0.0  # no tier: no kv_offload section, drawn as 0
    assert on["cpu_hit_rate"] == t.loc[8.0, "kv_offload.cpu_hit_tokens"] / t.loc[8.0, "kv_offload.cpu_query_tokens"] > 0
    for size in (0.0, 8.0):
        assert rows.loc[size, "gpu_hit_rate"] == t.loc[size, "prefix_cache_hit_rate"]
        assert rows.loc[size, "ttft_mean_s"] == t.loc[size, "ttft_s.mean"]
        assert rows.loc[size, "ttft_p90_s"] == t.loc[size, "ttft_s.p90"]
    # combined: prompt tokens not recomputed (GPU hits + tokens loaded from the tier) over the prompts
    name = rows.loc[8.0, "variant"]
    req = tier_sweep.variant(name).requests
    req = req[req["finish_s"].notna()]
    assert on["combined_hit_rate"] == req["num_cached_tokens"].sum() / req["prompt_len"].sum()
    assert on["combined_hit_rate"] > off["combined_hit_rate"]  # the tier served evicted contexts


def test_the_figure_has_a_ttft_and_a_hit_rate_panel(tier_sweep):
    fig = tier_sizing(tier_sweep)
    left, right = fig.axes
    assert left.get_title() == "TTFT" and right.get_title() == "Hit rates"
    assert [t.get_text() for t in left.get_xticklabels()] == ["off", "8"]
    assert len(left.get_lines()) == 2 and len(right.get_lines()) == 3  # mean, p90; GPU, CPU, combined


def test_a_sweep_that_does_not_size_the_tier_is_not_drawn(tmp_path):
    sw = run_scenario({"workload": {"generator": "sessions", "num_requests": 4}, "hardware": {"model": "llama-3.1-8b"},
                       "scheduler": {"max_model_len": 8192}, "cache": {"num_gpu_blocks": 600},
                       "sweep": {"scheduler.max_num_seqs": [4, 8]}},
                      out_dir=tmp_path, smoke=True)
    assert tier_axis(sw) is None
    with pytest.raises(ValueError, match="does not vary the CPU KV tier"):
        tier_sizing_table(sw)
