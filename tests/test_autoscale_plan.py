"""The diurnal day's arrival shape and `plan`'s autoscaled search."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from servesim.simulator.cluster.autoscale.diurnal import DailyShape, apply_daily_shape, daily_shape_from_dict
from servesim.simulator.cluster.plan import cost_per_hour, plan_config_from_dict
from servesim.simulator.cluster.plan_autoscale import autoscale_search, search_autoscaled, static_vs_autoscaled
from servesim.traces.errors import InputError
from servesim.traces.workload import RequestSpec, Workload


def _constant(n: int, gap_s: float) -> Workload:
    return Workload([RequestSpec(f"r{i}", i * gap_s, 100, 10) for i in range(n)], "constant", "test")


def test_daily_shape_keeps_the_mean_and_puts_the_peak_where_asked():
    shape = DailyShape(peak_to_trough=4.0, peak_s=14 * 3600.0)
    assert shape.amplitude == 0.6
    assert shape.cumulative(np.array([86400.0]))[0] == pytest.approx(86400.0)
    rate = shape.relative_rate(np.array([14 * 3600.0, 2 * 3600.0]))
    assert rate[0] / rate[1] == pytest.approx(4.0)
    wl = apply_daily_shape(_constant(8640, 10.0), shape)  # 0.1 req/s on average, warped
    t = np.array([r.arrival_time_s for r in wl.requests])
    assert len(t) == 8640 and (np.diff(t) >= 0).all()
    at_peak = ((t >= 13.5 * 3600) & (t < 14.5 * 3600)).sum()
    at_trough = ((t >= 1.5 * 3600) & (t < 2.5 * 3600)).sum()
    assert abs(at_peak - 360 * 1.6) <= 1 and abs(at_trough - 360 * 0.4) <= 1
    assert [r.prompt_len for r in wl.requests[:3]] == [100, 100, 100]


def test_daily_shape_window_keeps_one_hour_from_zero():
    full = apply_daily_shape(_constant(8640, 10.0), DailyShape())
    hour = apply_daily_shape(_constant(8640, 10.0), daily_shape_from_dict({"window_s": [9 * 3600, 10 * 3600]}))
    inside = [r for r in full.requests if 9 * 3600 <= r.arrival_time_s < 10 * 3600]
    assert [r.request_id for r in hour.requests] == [r.request_id for r in inside]
    assert [r.arrival_time_s for r in hour.requests] == [r.arrival_time_s - 9 * 3600 for r in inside]


@pytest.mark.parametrize("raw,field", [({"peak_to_trough": 0.5}, "workload.daily_shape.peak_to_trough"),
                                       ({"window_s": [5, 2]}, "workload.daily_shape.window_s"),
                                       ({"period_s": 0}, "workload.daily_shape.period_s"),
                                       ({"peak": 3}, "workload.daily_shape.peak")])
def test_bad_daily_shape(raw, field):
    with pytest.raises(InputError) as e:
        daily_shape_from_dict(raw)
    assert e.value.field == field


def _plan(autoscale: dict) -> dict:
    return {"workload": {"trace": "sharegpt-300"},
            "cluster": {"base": {"hardware": {"model": "llama-3.1-8b", "gpu": "h100"}}, "router": "least_outstanding",
                        "slo": {"ttft_s": 1.0, "tpot_s": 0.05}},
            "search": {"tp": [1], "colocated": {"min": 1, "max": 2}, "goodput_threshold": 0.5},
            "gpu_cost_per_hour": {"h100": 3.0}, "autoscale": autoscale}


def test_autoscaled_search_beside_the_static_one():
    plan = plan_config_from_dict(_plan({"sweep": {"param": "target", "values": [4, 64]}, "min_replicas": [1],
                                        "interval_s": 1, "window_s": 5,
                                        "pool": {"scale_down_stabilization_s": 5,
                                                 "cold_start": {"provision_s": 0, "image_bytes": 0}}}))
    search = autoscale_search(plan)
    assert search.max_replicas == 2 and search.values == (4, 64)
    wl = Workload([RequestSpec(f"r{i}", 0.05 * i, 200, 50) for i in range(40)], "w", "test")
    auto = search_autoscaled(plan, search, wl)
    assert list(auto["value"]) == [4, 64] and auto["error"].isna().all()
    assert (auto["usd_per_day"] == auto["usd"] * 86400 / auto["duration_s"]).all()
    static = pd.DataFrame([{"shape": "colocated tp1", "num_replicas": 2, "cost": 6.0, "goodput_fraction": 1.0,
                            "best": True}])
    both = static_vs_autoscaled(static, auto)
    assert both["static"]["usd_per_day"] == 144.0
    best = auto[auto["best"]]
    assert both["autoscaled"]["usd_per_day"] == best["usd_per_day"].item()


def test_plan_cost_defaults_to_the_shipped_table():
    plan = plan_config_from_dict({k: v for k, v in _plan({}).items() if k not in ("gpu_cost_per_hour", "autoscale")})
    from servesim.simulator.cluster.plan import Shape, candidate_config

    assert cost_per_hour(plan, candidate_config(plan, Shape("colocated", 2), 3)) == pytest.approx(6 * 4.176)


@pytest.mark.parametrize("raw,field", [({"sweeep": {}}, "autoscale.sweeep"),
                                       ({"min_replicas": [0]}, "autoscale.min_replicas"),
                                       ({"policy": "tresh"}, "autoscale.pools[0].policy.name")])
def test_bad_autoscale_plan(raw, field):
    with pytest.raises(InputError) as e:
        autoscale_search(plan_config_from_dict(_plan(raw), "plan.yaml"), "plan.yaml")
    assert e.value.field == field
