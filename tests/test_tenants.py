"""Tenants and SLO classes: on RequestSpec, in canonical traces, in a generated workload's mix, and
the summary's per-tenant / per-class figures (simulator/summary_metrics/classes.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from servesim.running import run
from servesim.simulator.config import SimConfig, SloConfig
from servesim.simulator.config_values import build_dataclass
from servesim.simulator.gateway.config import GatewayConfig
from servesim.simulator.summary_metrics.classes import class_summary
from servesim.traces.canonical import save_workload
from servesim.traces.errors import InputError
from servesim.traces.formats import load_workload
from servesim.traces.synthetic import make_workload
from servesim.traces.workload import RequestSpec, Workload


@pytest.mark.parametrize("field", ["tenant", "slo_class"])
@pytest.mark.parametrize("value", ["", 3])
def test_request_spec_refuses_a_bad_tenant_or_class(field, value):
    with pytest.raises(InputError) as err:
        RequestSpec("r", 0.0, 1, 1, **{field: value})
    assert err.value.field == field


@pytest.mark.parametrize("ext", ["jsonl", "csv", "parquet"])
def test_canonical_traces_carry_tenant_and_class(tmp_path, ext):
    reqs = [RequestSpec("a", 0.0, 10, 5, tenant="free", slo_class="batch"), RequestSpec("b", 0.5, 10, 5),
            RequestSpec("c", 1.0, 10, 5, tenant="premium")]
    path = save_workload(Workload(reqs, "t", "hand"), tmp_path / f"t.{ext}")
    back = load_workload(path, "canonical")
    assert [(r.request_id, r.tenant, r.slo_class) for r in back.requests] == \
        [("a", "free", "batch"), ("b", None, None), ("c", "premium", None)]


def test_canonical_refuses_an_empty_tenant(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"request_id": "a", "arrival_time_s": 0, "prompt_len": 3, "output_len": 2, "tenant": ""}\n')
    with pytest.raises(InputError) as err:
        load_workload(path, "canonical")
    assert err.value.field == "tenant" and err.value.line == 1


_BASE = {"num_requests": 40, "arrival": {"rate_per_s": 4}}


def test_fraction_mix_labels_the_same_requests():
    plain = make_workload("poisson", _BASE, np.random.default_rng(3))
    mixed = make_workload("poisson", {**_BASE, "mix": [{"tenant": "p", "slo_class": "i", "fraction": 0.25},
                                                       {"tenant": "f", "fraction": 0.75}]}, np.random.default_rng(3))
    key = [(r.request_id, r.arrival_time_s, r.prompt_len, r.output_len) for r in plain.requests]
    assert key == [(r.request_id, r.arrival_time_s, r.prompt_len, r.output_len) for r in mixed.requests]
    labels = {(r.tenant, r.slo_class) for r in mixed.requests}
    assert labels == {("p", "i"), ("f", None)}


def test_rate_mix_superposes_one_stream_per_entry():
    wl = make_workload("poisson", {**_BASE, "mix": [{"tenant": "p", "rate_per_s": 1}, {"tenant": "f", "rate_per_s": 9}]},
                       np.random.default_rng(0))
    assert len(wl.requests) == 40
    times = [r.arrival_time_s for r in wl.requests]
    assert times == sorted(times)
    assert all(r.request_id.startswith(f"synthetic-{r.tenant}-") for r in wl.requests)
    n_free = sum(r.tenant == "f" for r in wl.requests)
    assert 28 <= n_free <= 40  # ~90 % of the merged stream; the exact count is the seed's
    again = make_workload("poisson", {**_BASE, "mix": [{"tenant": "p", "rate_per_s": 1},
                                                       {"tenant": "f", "rate_per_s": 9}]}, np.random.default_rng(0))
    assert [r.request_id for r in again.requests] == [r.request_id for r in wl.requests]


@pytest.mark.parametrize("mix, field, words", [
    ([{"tenant": "a", "fraction": 0.5}, {"tenant": "b", "fraction": 0.4}], "mix[].fraction", "sum to 1"),
    ([{"tenant": "a", "fraction": 0.5}, {"tenant": "b", "rate_per_s": 1}], "mix", "every entry"),
    ([{"tenant": "a", "fraction": 0.5}, {"tenant": "a", "fraction": 0.5}], "mix", "distinct"),
    ([{"fraction": 1.0}], "mix[0]", "tenant and/or"),
    ([{"tenant": "a"}], "mix[0]", "one of fraction"),
    ([{"tenant": "a", "fraction": 1.0, "share": 1}], "mix[0].share", "keys"),
    ([{"tenant": "a", "rate_per_s": -2}], "mix[0].rate_per_s", "> 0"),
    ([], "mix", "non-empty"),
])
def test_bad_mix_is_a_clear_error(mix, field, words):
    with pytest.raises(InputError) as err:
        make_workload("poisson", {**_BASE, "mix": mix}, np.random.default_rng(0))
    assert err.value.field == field and words in str(err.value)


def _table(rows):
    """A requests table of completed/rejected rows: (id, status, ttft_s, e2e_s, output_len)."""
    out = []
    for rid, status, ttft, e2e, n in rows:
        done = status == "completed"
        out.append({"request_id": rid, "status": status, "reject_reason": None if done else "gateway_rate_limited",
                    "arrival_s": 0.0, "first_token_s": ttft if done else np.nan,
                    "finish_s": e2e if done else np.nan, "ttft_s": ttft if done else np.nan,
                    "e2e_s": e2e if done else np.nan,
                    "tpot_s": (e2e - ttft) / (n - 1) if done and n > 1 else np.nan,
                    "queueing_s": 0.0 if done else np.nan, "prompt_len": 10, "output_len": n if done else 0,
                    "itl_s": np.full(n - 1, (e2e - ttft) / (n - 1)) if done and n > 1 else np.empty(0)})
    return pd.DataFrame(out)


def test_class_summary_judges_each_class_by_its_own_targets():
    specs = [RequestSpec("p1", 0.0, 10, 5, tenant="premium", slo_class="gold"),
             RequestSpec("p2", 0.0, 10, 5, tenant="premium", slo_class="gold"),
             RequestSpec("f1", 0.0, 10, 5, tenant="free"), RequestSpec("f2", 0.0, 10, 5, tenant="free"),
             RequestSpec("f3", 0.0, 10, 5, tenant="free")]
    table = _table([("p1", "completed", 0.25, 0.5, 5), ("p2", "completed", 0.75, 1.0, 5),
                    ("f1", "completed", 0.75, 1.0, 5), ("f2", "completed", 3.0, 4.0, 5), ("f3", "rejected", 0, 0, 0)])
    gw = GatewayConfig(slo_classes={"gold": {"ttft_s": 0.5, "tpot_s": 0.1}})
    out = class_summary(table, Workload(specs, "w", "hand"), gw, SloConfig(ttft_s=2.0, tpot_s=0.5), 4.0)
    gold, default = out["by_slo_class"]["gold"], out["by_slo_class"]["default"]
    assert gold["goodput"]["fraction_meeting_slo"] == 0.5  # p2's 0.75 s TTFT misses gold's 0.5 s
    assert gold["goodput"]["requests_per_s"] == 0.25 and gold["goodput"]["slo_ttft_s"] == 0.5
    assert default["goodput"]["fraction_meeting_slo"] == 0.5  # f2's 3 s misses the run's 2 s
    free = out["by_tenant"]["free"]
    assert (free["num_requests"], free["num_completed"], free["num_rejected"]) == (3, 2, 1)
    assert free["rejected_by_reason"] == {"gateway_rate_limited": 1}
    assert free["bench_serve"]["failed"] == 1 and out["by_tenant"]["premium"]["bench_serve"]["failed"] == 0
    assert free["ttft_s"]["p50"] == pytest.approx(1.875)
    assert out["fraction_meeting_own_slo"] == 0.5  # p1 and f1 of four completed


def test_a_two_tenant_replay_breaks_metrics_down_without_a_gateway():
    specs = [RequestSpec(f"r{i}", 0.25 * i, 64, 8, tenant="a" if i % 2 else "b",
                         slo_class="fast" if i < 2 else None) for i in range(6)]
    cfg = build_dataclass(SimConfig(), {"gateway": {"slo_classes": {"fast": {"ttft_s": 1.0, "tpot_s": 0.05}}}}, "")
    res = run(cfg, Workload(specs, "two", "hand"))
    classes = res.summary["classes"]
    assert {t: v["num_completed"] for t, v in classes["by_tenant"].items()} == {"a": 3, "b": 3}
    assert {c: v["num_requests"] for c, v in classes["by_slo_class"].items()} == {"default": 4, "fast": 2}
    assert classes["by_slo_class"]["fast"]["goodput"]["slo_ttft_s"] == 1.0
    assert "gateway" not in res.summary and res.summary["fast_path"]["used"]
