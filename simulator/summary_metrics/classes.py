"""Every metric by tenant and by SLO class (summary.json's `classes` block), and the gateway's own
figures (`gateway`).

A request's tenant and SLO class come from its RequestSpec (the trace's `tenant` / `slo_class`
columns, or a generated workload's mix); None reads as "default". Each group reports what the
whole run does: requests, completed / rejected (by reason) / timed out, TTFT, TPOT, E2E and
queueing statistics, throughput, and goodput against the group's own targets: a request meets its
SLO class's `ttft_s`, `tpot_s` (and `e2e_s` when set; GatewayConfig.slo_classes), and a request of
an unlisted class the run's `slo`. `bench_serve` is `vllm bench serve`'s figures for the group's
requests (its `failed` counts the gateway's rejections like any other failure).

Not a registered metric (those see finished requests only): running.py and cluster/results.py call
`class_summary` with the workload, when it names tenants or classes or the gateway is on.
"""

from __future__ import annotations

import numpy as np

from servesim.simulator.bench_metrics import GoodputSlo, bench_serve_result
from servesim.simulator.gateway.config import GatewayConfig
from servesim.simulator.gateway.defaults import DEFAULT_CLASS, DEFAULT_TENANT
from servesim.simulator.metrics import stats
from servesim.traces.workload import Workload


def wants_classes(workload: Workload, gateway: GatewayConfig) -> bool:
    """Whether the summary gets a `classes` block: tenants or classes in the workload, or a gateway."""
    return gateway.enabled or workload.columns.any_set("tenant") or workload.columns.any_set("slo_class")


def class_summary(requests, workload: Workload, gateway: GatewayConfig, slo, sim_duration_s: float) -> dict:
    """{by_tenant: {name: figures}, by_slo_class: {name: figures}} for a run's requests table."""
    specs = {s.request_id: s for s in workload.requests}
    ids = np.asarray(requests["request_id"]).tolist()
    tenant = np.array([specs[r].tenant or DEFAULT_TENANT for r in ids], dtype=object)
    klass = np.array([specs[r].slo_class or DEFAULT_CLASS for r in ids], dtype=object)
    targets = {name: (c.ttft_s, c.tpot_s, c.e2e_s) for name, c in gateway.slo_classes.items()}
    meets = _meets_own_slo(requests, klass, targets, (slo.ttft_s, slo.tpot_s, slo.e2e_s))
    out = {}
    for key, labels in (("by_tenant", tenant), ("by_slo_class", klass)):
        out[key] = {str(name): _group(requests, labels == name, meets, targets.get(name), slo, sim_duration_s)
                    for name in sorted(set(labels.tolist()))}
    completed = np.asarray(requests["status"]) == "completed"
    out["fraction_meeting_own_slo"] = float(meets.sum()) / max(int(completed.sum()), 1)
    return out


def _meets_own_slo(requests, klass: np.ndarray, targets: dict, default: tuple) -> np.ndarray:
    """Per row: completed and within its class's targets (TPOT of a one-token answer: met)."""
    completed = np.asarray(requests["status"]) == "completed"
    ttft, tpot, e2e = (np.asarray(requests[c], dtype=float) for c in ("ttft_s", "tpot_s", "e2e_s"))
    out = np.zeros(len(klass), dtype=bool)
    for i, name in enumerate(klass.tolist()):
        if not completed[i]:
            continue
        t_ttft, t_tpot, t_e2e = targets.get(name, default)
        ok = ttft[i] <= t_ttft and (np.isnan(tpot[i]) or tpot[i] <= t_tpot)
        out[i] = bool(ok and (t_e2e is None or e2e[i] <= t_e2e))
    return out


def _group(requests, mask: np.ndarray, meets: np.ndarray, target, slo, sim_duration_s: float) -> dict:
    rows = requests[mask]
    status = np.asarray(rows["status"])
    done = rows[status == "completed"]
    reasons = np.asarray(rows["reject_reason"])[status == "rejected"].tolist()
    by_reason: dict[str, int] = {}
    for r in reasons:
        by_reason[str(r)] = by_reason.get(str(r), 0) + 1
    ttft_s, tpot_s, e2e_s = target if target is not None else (slo.ttft_s, slo.tpot_s, slo.e2e_s)
    num_good = int(meets[mask].sum())
    dur = max(sim_duration_s, 1e-12)
    bench = bench_serve_result(rows, GoodputSlo(ttft_ms=ttft_s * 1e3, tpot_ms=tpot_s * 1e3,
                                                e2el_ms=None if e2e_s is None else e2e_s * 1e3))
    return {
        "num_requests": int(mask.sum()), "num_completed": int(len(done)),
        "num_rejected": len(reasons), "rejected_by_reason": dict(sorted(by_reason.items())),
        "num_timed_out": int((status == "timed_out").sum()),
        "ttft_s": stats(done["ttft_s"]), "tpot_s": stats(done["tpot_s"]), "e2e_s": stats(done["e2e_s"]),
        "queueing_s": stats(done["queueing_s"]),
        "throughput": {"requests_per_s": len(done) / dur,
                       "output_tokens_per_s": int(np.asarray(done["output_len"]).sum()) / dur},
        "goodput": {"slo_ttft_s": ttft_s, "slo_tpot_s": tpot_s, "slo_e2e_s": e2e_s, "requests_per_s": num_good / dur,
                    "fraction_meeting_slo": num_good / max(len(done), 1)},
        "bench_serve": {k: v for k, v in bench.items()
                        if k in ("completed", "failed", "request_goodput") or k.endswith("ttft_ms")
                        or k.endswith("tpot_ms") or k.endswith("e2el_ms")},
    }


def add_gateway_figures(summary: dict, gateway, cfg, workload: Workload, requests) -> None:
    """summary.json's `gateway` (the Gateway's counts, when one ran) and `classes` blocks; a run
    with neither tenants, classes nor a gateway gets neither (its summary is unchanged)."""
    if gateway is not None:
        summary["gateway"] = gateway.summary()
    if wants_classes(workload, cfg.gateway):
        summary["classes"] = class_summary(requests, workload, cfg.gateway, cfg.slo, summary["sim_duration_s"])
