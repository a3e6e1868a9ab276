"""Replicates (issue 45): seeds, the perturbed cost model, the interval maths, the replicates folder,
and `--replicates 1` being the plain run byte for byte."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
from typer.testing import CliRunner

from servesim.cli import _register, app
from servesim.intervals import differ, interval, normal_quantile, probability_meeting, t_quantile
from servesim.replicates import (check_replicates, perturbed_config, plan_replicates, replicate_seed,
                                 run_replay_replicates, Perturbation)
from servesim.replicate_summary import describe_variation, is_replicates, replicate_values
from servesim.running import load_trace, run
from servesim.scheduler.step_shape import StepShape
from servesim.simulator.config import CostModelConfig, SimConfig
from servesim.simulator.cost_model import make_cost_model
from servesim.simulator.cost_model.perturbed import (MAPE_TO_SIGMA, draw_factors, fitted_sigmas, residual_sigmas,
                                                     roofline_sigmas, step_kind)
from servesim.traces.errors import InputError

_register()

FILES = ("requests.parquet", "steps.parquet", "timeseries.csv", "config.yaml")


def _mask_wall(text: str) -> str:
    """The two figures of the wall clock (how long the simulation took), the only bytes two runs of
    the same command may differ in."""
    return re.sub(r'"(wall_time_s|sim_speedup_x)": [0-9.e+-]+', r'"\1": X', text)


def test_replicates_1_is_the_plain_run_byte_for_byte(tmp_path):
    args = ["replay", "--dataset-name", "random", "--num-prompts", "40",
            "--request-rate", "20", "--random-input-len", "64", "--random-output-len", "16"]
    r = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "plain")])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, [*args, "--replicates", "1", "--out", str(tmp_path / "one")])
    assert r.exit_code == 0, r.output
    for name in FILES:
        assert (tmp_path / "plain" / name).read_bytes() == (tmp_path / "one" / name).read_bytes(), name
    # summary.json: byte for byte but for the wall-clock time the simulation took
    plain, one = ((tmp_path / d / "summary.json").read_text() for d in ("plain", "one"))
    assert _mask_wall(plain) == _mask_wall(one)
    assert "replicates" not in json.loads(one)


def test_seeds_are_derived_deterministically():
    assert replicate_seed(0, 0) == 0 and replicate_seed(7, 0) == 7
    seeds = [replicate_seed(0, k) for k in range(1, 6)]
    assert seeds == [int(np.random.SeedSequence(0, spawn_key=(k,)).generate_state(1, np.uint32)[0])
                     for k in range(1, 6)]
    assert len(set(seeds)) == 5 and seeds[0] == 673228719
    assert replicate_seed(1, 1) != replicate_seed(0, 1)
    reps = plan_replicates(3, 4, Perturbation({"prefill": 0.1, "decode": 0.2, "mixed": 0.0}, "test"))
    again = plan_replicates(3, 4, Perturbation({"prefill": 0.1, "decode": 0.2, "mixed": 0.0}, "test"))
    assert [(r.seed, r.factors) for r in reps] == [(r.seed, r.factors) for r in again]
    assert all(r.factors["mixed"] == 1.0 for r in reps)  # sigma 0: no perturbation of that kind
    assert len({r.factors["decode"] for r in reps}) == 4


@pytest.mark.parametrize("bad", [0, -1, 1001, 2.5, True, "3"])
def test_bad_replicate_counts_are_refused(bad):
    with pytest.raises(InputError, match="--replicates"):
        check_replicates(bad)


def test_negative_base_seed_is_refused():
    with pytest.raises(InputError, match="seed"):
        replicate_seed(-1, 1)


def test_step_kinds():
    assert step_kind(StepShape((1, 1), (5, 6), 2)) == "decode"
    assert step_kind(StepShape((), (), 0)) == "decode"
    assert step_kind(StepShape((128,), (0,), 1)) == "prefill"
    assert step_kind(StepShape((1, 64), (9, 0), 2)) == "mixed"


def test_perturbed_model_scales_each_kind_exactly():
    base = make_cost_model("roofline", model="llama-3.1-8b", gpu="h100", tp=1)
    f = {"prefill": 1.5, "decode": 0.5, "mixed": 2.0}
    p = make_cost_model("perturbed", model="llama-3.1-8b", gpu="h100", tp=1, base="roofline", factors=f)
    for shape, kind in ((StepShape((1,) * 4, (100,) * 4, 4), "decode"), (StepShape((512,), (0,), 1), "prefill"),
                        (StepShape((1, 256), (50, 0), 2), "mixed")):
        assert p.step_time_s(shape) == base.step_time_s(shape) * f[kind]
    bulk = p.decode_step_times_s([100, 200], 3)
    assert bulk == [p.step_time_s(StepShape((1, 1), (100 + j, 200 + j), 2)) for j in range(3)]


@pytest.mark.parametrize("factors", [None, {"prefill": 1.0}, {"prefill": 1, "decode": 0, "mixed": 1},
                                     {"prefill": 1, "decode": float("nan"), "mixed": 1}])
def test_bad_factors_are_refused(factors):
    with pytest.raises(InputError, match="factors"):
        make_cost_model("perturbed", model="llama-3.1-8b", gpu="h100", tp=1, base="roofline", factors=factors)


def test_a_perturbed_model_needs_its_base_and_passes_the_rest_to_it():
    ones = {"prefill": 1, "decode": 1, "mixed": 1}
    with pytest.raises(InputError, match="params.base"):
        make_cost_model("perturbed", model="llama-3.1-8b", gpu="h100", factors=ones)
    with pytest.raises(InputError, match="skew_alphaz"):  # the base's own parameter check
        make_cost_model("perturbed", model="llama-3.1-8b", gpu="h100", base="calibrated", factors=ones, skew_alphaz=0)
    shape = StepShape((1,) * 8, (300,) * 8, 8)
    cal = make_cost_model("calibrated", model="llama-3.1-8b", gpu="h100", skew_alpha=0.0)
    p = make_cost_model("perturbed", model="llama-3.1-8b", gpu="h100", base="calibrated", factors=ones, skew_alpha=0.0)
    assert p.step_time_s(shape) == cal.step_time_s(shape)


def test_perturbing_a_perturbed_model_is_refused():
    with pytest.raises(InputError, match="perturb"):
        make_cost_model("perturbed", model="llama-3.1-8b", gpu="h100", base="perturbed",
                        factors={"prefill": 1, "decode": 1, "mixed": 1})


def test_fitted_sigmas_from_hand_built_fit_error():
    fit_error = {"gemm": {"origin": "measured gemm kernels", "mape_holdout": 0.03},
                 "attn_decode": {"origin": "measured", "mape_holdout": 0.04},
                 "attn_prefill": {"origin": "measured", "mape_holdout": 0.12},
                 "sampler": {"origin": "roofline", "mape_holdout": None}}
    s = fitted_sigmas(fit_error)
    assert s["decode"] == pytest.approx(MAPE_TO_SIGMA * math.sqrt((0.03 ** 2 + 0.04 ** 2) / 2))
    assert s["prefill"] == pytest.approx(MAPE_TO_SIGMA * math.sqrt((0.03 ** 2 + 0.12 ** 2) / 2))
    assert s["mixed"] == pytest.approx(MAPE_TO_SIGMA * math.sqrt((0.03 ** 2 + 0.04 ** 2 + 0.12 ** 2) / 3))


def test_roofline_sigmas_per_generation_and_pooled_fallback():
    hopper, where = roofline_sigmas("Hopper")
    assert "Hopper" in where and all(0 < v < 1 for v in hopper.values())
    pooled, where = roofline_sigmas("sm99")
    assert "all generations" in where and pooled != hopper
    cfg = SimConfig()
    assert residual_sigmas(cfg)[0] == hopper
    cfg.cost_model = CostModelConfig(name="calibrated")
    sig, where = residual_sigmas(cfg)
    assert "fit_error" in where and sig["prefill"] > sig["decode"] > 0  # prefill attention fits worse


def test_draw_factors_are_lognormal_with_the_sigma():
    rng = np.random.default_rng(1)
    logs = np.log([draw_factors({"prefill": 0.1, "decode": 0.1, "mixed": 0.1}, rng)["decode"] for _ in range(4000)])
    assert abs(logs.mean()) < 0.01 and logs.std() == pytest.approx(0.1, rel=0.05)


def test_perturbed_run_is_exact_with_and_without_macro_steps():
    wl = load_trace(None, max_requests=60)
    cfg = perturbed_config(SimConfig(), 5, {"prefill": 1.1, "decode": 0.9, "mixed": 1.05})
    a = run(cfg, wl).summary
    cfg.macro_steps = False
    b = run(cfg, wl).summary
    for key in ("ttft_s", "tpot_s", "e2e_s", "sim_duration_s", "num_steps"):
        assert a[key] == b[key]
    plain = run(SimConfig(), wl).summary
    assert a["tpot_s"]["p50"] < plain["tpot_s"]["p50"]  # decode 10 % faster


# --- the interval maths ----------------------------------------------------------------------------

def test_t_and_normal_quantiles_match_the_tables():
    # Student t table values (e.g. NIST/SEMATECH e-Handbook, table 1.3.6.7.2)
    assert t_quantile(0.975, 1) == pytest.approx(12.706, abs=1e-3)
    assert t_quantile(0.975, 7) == pytest.approx(2.365, abs=1e-3)
    assert t_quantile(0.95, 10) == pytest.approx(1.812, abs=1e-3)
    assert t_quantile(0.025, 30) == pytest.approx(-2.042, abs=1e-3)
    assert normal_quantile(0.95) == pytest.approx(1.6449, abs=1e-4)


def test_intervals_shrink_as_replicates_grow_on_known_variance():
    """Normal draws with sigma 2: the CI of the mean narrows as 1/sqrt(n) and covers the true mean
    about 95 % of the time; the prediction interval covers a new draw about 90 % of the time."""
    rng = np.random.default_rng(0)
    widths = {}
    for n in (4, 16, 64, 256):
        iv = interval(list(rng.normal(10.0, 2.0, n)))
        widths[n] = iv.ci_high - iv.ci_low
    assert widths[4] > widths[16] > widths[64] > widths[256]
    assert widths[256] == pytest.approx(2 * 1.969 * 2.0 / 16, rel=0.15)
    ci_hits = pi_hits = 0
    trials = 2000
    for _ in range(trials):
        x = rng.normal(10.0, 2.0, 8)
        iv = interval(list(x))
        ci_hits += iv.ci_low <= 10.0 <= iv.ci_high
        pi_hits += iv.pi_low <= rng.normal(10.0, 2.0) <= iv.pi_high
    assert ci_hits / trials == pytest.approx(0.95, abs=0.02)
    assert pi_hits / trials == pytest.approx(0.90, abs=0.02)


def test_one_replicate_has_a_zero_width_interval():
    iv = interval([3.0])
    assert (iv.mean, iv.sd, iv.ci_low, iv.pi_high) == (3.0, 0.0, 3.0, 3.0)


def test_welch_difference():
    d = differ([1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0])
    assert d.diff == 4.0 and d.beyond_noise and d.low > 0
    assert not differ([1.0, 2.0, 3.0, 4.0], [1.5, 2.5, 3.0, 4.0]).beyond_noise
    assert differ([1.0, 1.0], [2.0, 2.0]).beyond_noise and not differ([1.0, 1.0], [1.0, 1.0]).beyond_noise
    with pytest.raises(ValueError):
        differ([1.0], [2.0, 3.0])


def test_probability_meeting_with_wilson_interval():
    p, lo, hi = probability_meeting([True] * 9 + [False])
    assert p == 0.9 and lo == pytest.approx(0.6523, abs=1e-3) and hi == pytest.approx(0.9774, abs=1e-3)
    assert probability_meeting([True] * 4)[0:2] == (1.0, pytest.approx(0.5965, abs=1e-3))


# --- the replicates folder -------------------------------------------------------------------------

def test_replicates_folder_with_a_generated_workload(tmp_path):
    from servesim.traces.bench import BenchConfig, bench_workload

    def workload_for(rep):
        return bench_workload(BenchConfig(dataset_name="random", num_prompts=30, request_rate=15.0, seed=rep.seed,
                                          random_input_len=64, random_output_len=16))

    s = run_replay_replicates(SimConfig(), workload_for, 3, tmp_path / "r", perturb=False, workers=1)
    rep = s["replicates"]
    assert rep["num_replicates"] == 3 and rep["seeds"][0] == 0 and rep["cost_model_factors"] == [None] * 3
    assert any("reseeded" in v for v in rep["varies"]) and "wall_time_s" not in s
    assert is_replicates(tmp_path / "r")
    values = replicate_values(tmp_path / "r", "ttft_s.p50")
    assert len(values) == 3 and len(set(values)) == 3  # arrivals differ
    assert rep["metrics"]["ttft_s.p50"]["mean"] == pytest.approx(sum(values) / 3)
    assert s["ttft_s"]["p50"] == pytest.approx(sum(values) / 3)  # the mean summary, readable as a run's
    for i, seed in enumerate(rep["seeds"]):
        run_json = json.loads((tmp_path / "r" / "replicates" / f"r{i:02d}" / "run.json").read_text())
        assert run_json["seed"] == seed
    assert (tmp_path / "r" / "replicates.csv").read_text().count("\n") == 4


def test_a_fixed_trace_without_perturbation_warns_that_nothing_varies():
    v = describe_variation(SimConfig(), generated=False, cluster=False, perturbation=None)
    assert not v["varies"] and "identical" in v["warning"]
    assert any("arrival noise" in line for line in v["fixed"])


def test_replay_replicates_refuse_a_step_trace(tmp_path):
    r = CliRunner().invoke(app, ["replay", "--max-requests", "5", "--replicates", "2", "--step-trace",
                                 str(tmp_path / "t.jsonl"), "--out", str(tmp_path / "o")])
    assert r.exit_code != 0 and "--step-trace" in r.output
