"""`servesim plot`: figures and a self-contained report.html for sweeps and single runs."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import servesim.commands.plot  # noqa: F401
import servesim.commands.run  # noqa: F401
import servesim.plots as plots
from servesim.api import load_trace, plot_results, run, run_scenario
from servesim.cli import app
from servesim.plots.run import hit_rate_over_time
from servesim.simulator.config import SimConfig
from servesim.traces.errors import InputError

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_plot_command_on_a_sweep_writes_a_self_contained_report(tmp_path, monkeypatch):
    sc = {"name": "plot-test", "description": "two pool sizes",
          "workload": {"generator": "poisson", "num_requests": 30, "arrival": {"rate_per_s": 30},
                       "prompt_len": 300, "output_len": 40, "prefix": {"num_groups": 2, "prefix_len": 200},
                       "priority": {"values": [0, 1]}},
          "scheduler": {"max_num_seqs": 16, "max_model_len": 1024, "policy": "priority"},
          "sweep": {"cache.num_gpu_blocks": [80, 400], "cache.block_size": [16, 0]}}  # block 0: one failure
    run_scenario(sc, out_dir=tmp_path / "sweep")
    monkeypatch.setattr(plots, "MAX_VARIANT_PAGES", 1)  # per-variant pages cost ~2 s each
    result = CliRunner().invoke(app, ["plot", str(tmp_path / "sweep"), "--out", str(tmp_path / "plots")])
    assert result.exit_code == 0, f"{result.output}\n{result.exception!r}"
    pngs = sorted((tmp_path / "plots").rglob("*.png"))
    names = {p.name for p in pngs}
    assert {"metrics_vs_axis.png", "latency_cdfs.png", "small_multiples.png", "timeline.png",
            "preemptions_hits.png", "batch_composition.png"} <= names
    assert all(p.read_bytes()[:8] == PNG and p.stat().st_size > 10_000 for p in pngs)
    html = (tmp_path / "plots" / "report.html").read_text()
    assert html.count("data:image/png;base64,") == len(pngs)
    assert not re.search(r"""(src|href)=['"](?!data:)""", html), "the report must not load external files"
    assert "num_gpu_blocks=80" in html and "failed" in html and "two pool sizes" in html


@pytest.mark.slow
def test_plot_a_single_run(tmp_path):
    run(SimConfig(), load_trace(None, max_requests=24), out_dir=tmp_path / "run")
    pngs, report = plot_results(tmp_path / "run")
    assert {p.name for p in pngs} == {"latency_cdf.png", "timeline.png", "preemptions_hits.png",
                                      "batch_composition.png", "request_timelines.png"}
    assert report == tmp_path / "run" / "plots" / "report.html" and "TTFT (ms)" in report.read_text()
    again, _ = plot_results(tmp_path / "run")  # the default folder is refreshed without --overwrite
    assert again == pngs
    plot_results(tmp_path / "run", tmp_path / "elsewhere")
    with pytest.raises(InputError, match="--overwrite"):  # a named folder is replaced only with overwrite
        plot_results(tmp_path / "run", tmp_path / "elsewhere")
    plot_results(tmp_path / "run", tmp_path / "elsewhere", overwrite=True)
    assert not list(tmp_path.glob(".*servesim-tmp*")) and [p.name for p in (tmp_path / "run").glob(".*")] == [".servesim"]


def test_plot_rejects_a_folder_without_results(tmp_path):
    with pytest.raises(InputError, match="not a results folder"):
        plot_results(tmp_path)


def test_hit_rate_over_time_is_token_weighted_by_finish_time():
    req = pd.DataFrame({"finish_s": [0.5, 0.6, 1.5, None], "prompt_len": [100, 300, 50, 10],
                        "num_cached_tokens": [100, 0, 25, 10]})
    mid, rate = hit_rate_over_time(req, np.array([0.0, 1.0, 2.0, 3.0]))
    assert list(mid) == [0.5, 1.5, 2.5]
    assert rate[0] == pytest.approx(0.25) and rate[1] == pytest.approx(0.5) and np.isnan(rate[2])


@pytest.mark.slow
def test_an_unfinished_sweep_is_plotted_from_the_variants_it_finished(tmp_path, monkeypatch):
    sc = {"name": "cut", "workload": {"generator": "poisson", "num_requests": 12, "arrival": {"rate_per_s": 20},
                                      "prompt_len": 100, "output_len": 8},
          "sweep": {"scheduler.max_num_seqs": [4, 8, 16]}}
    run_scenario(sc, out_dir=tmp_path / "sweep")
    (tmp_path / "sweep" / "sweep.parquet").unlink()  # as a sweep killed before its table is written
    (tmp_path / "sweep" / "variants" / sorted(p.name for p in (tmp_path / "sweep" / "variants").iterdir())[2]
     / "summary.json").unlink()  # and before its last variant finished
    monkeypatch.setattr(plots, "MAX_VARIANT_PAGES", 1)
    monkeypatch.setattr(plots, "run_figures", lambda *a, **k: [])  # the per-variant pages are not the point
    _pngs, report = plot_results(tmp_path / "sweep")
    html = report.read_text()
    assert "did not finish: 2 of 3 variants have results" in html and "not run (the sweep did not finish)" in html
    assert "First finished variant: llama-3.1-8b on h100 (TP 1, PP 1)" in html
