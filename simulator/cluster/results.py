"""Cluster results: per-replica EngineResults, merged request/step frames and a cluster summary.

Merged request records use the cluster arrival time (before the routing latency), so TTFT and
queueing include the router. With P/D one row joins a request's two halves: queueing and the
prompt from its prefill replica, the output tokens from its decode replica, and

    ttft_s = prefill_queue_s + prefill_s + transfer_s + first_decode_s

prefill_queue_s: arrival -> first scheduled on the prefill replica (routing latency included);
prefill_s: -> the prefill replica's token; transfer_s: -> the KV landed on the decode replica
(handoff latency, waiting for decode-side blocks, link latency and bandwidth share;
kv_link_s is the part on the link); first_decode_s: -> the decode replica's first token.

The tables are columns (simulator/columns.py), as a replay's: the summary and the result files
read them without pandas, which `servesim cluster` then never imports (~0.5 s); the frames
(`ClusterResult.requests`, `.steps`) are built on first read.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from servesim.simulator.cluster.autoscale.cost import cost_summary
from servesim.simulator.cluster.config import ClusterConfig, cluster_config_to_dict
from servesim.simulator.collector import release_freed_heap
from servesim.simulator.columns import Columns
from servesim.simulator.config import SimConfig
from servesim.simulator.engine_result import EngineResult
from servesim.simulator.metrics import MetricsCollector, RequestRecord, stats
from servesim.simulator.outputs import hicache_summary
from servesim.simulator.summary import brief_summary, summarize, warn_rejected
from servesim.simulator.outputs import build_summary, write_result_folder
from servesim.simulator.session_metrics import has_sessions, session_summary
from servesim.simulator.step_fold import RunFolds
from servesim.simulator.step_table import StepTable
from servesim.simulator.summary_metrics.classes import add_gateway_figures

if TYPE_CHECKING:
    import pandas as pd

    from servesim.simulator.cluster.cluster import Cluster

PD_PARTS = ("prefill_queue_s", "prefill_s", "transfer_s", "first_decode_s")


@dataclass(slots=True)
class ReplicaResult:
    index: int
    name: str
    role: str
    cfg: SimConfig
    result: EngineResult
    num_routed: int  # requests its router sent here
    _summary: dict | None = field(default=None, repr=False)

    @property
    def summary(self) -> dict:
        """simulator.outputs.build_summary of this replica alone, built when first read (the
        cluster's own summary needs only a brief of each replica: metrics.brief_summary)."""
        if self._summary is None:
            self._summary = build_summary(self.cfg, self.result, self.num_routed)
        return self._summary


@dataclass(slots=True)
class ClusterResult:
    config: ClusterConfig
    replicas: list[ReplicaResult]
    # merged: one record per request; its tables (adopted) are the cluster's: the requests with the
    # replica / routing (/ P/D) columns, every replica's steps with a replica column
    metrics: MetricsCollector
    summary: dict
    wall_time_s: float
    # Extra CSV files of the run by name (autoscaling: scale_events, scale_timeline, replica_lifetimes)
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)

    @property
    def requests(self) -> pd.DataFrame:
        """One row per request: metrics.requests_frame()'s columns and the routing (and P/D) ones."""
        return self.metrics.tables().requests

    @property
    def steps(self) -> pd.DataFrame:
        """Every replica's steps, with a replica column."""
        return self.metrics.tables().steps


def build_result(cluster: Cluster, wall_time_s: float) -> ClusterResult:
    steps = _steps_columns(cluster)
    reps = [ReplicaResult(r.index, r.name, r.role, r.cfg, r.engine.result(wall_time_s), r.num_routed)
            for r in cluster.replicas]  # (each engine's result first: its clients' token times delivered)
    merged = MetricsCollector()
    for spec in cluster.sent_requests():
        merged.requests[spec.request_id] = _merged_record(cluster, spec)
    merged.adopt_steps(steps)
    merged.adopt_step_folds(RunFolds({r.index: r.engine.metrics.steps.finish_fold() for r in cluster.replicas},
                                     grouped=True, rows_kept=_keeps_rows(cluster)))
    _share_gaps(merged, reps)
    end_s = max([r.finish_s for r in merged.requests.values() if r.finish_s is not None], default=0.0)
    # Every table is built: the records (and every token time) go before the summary's statistics
    # take their scratch copies of the gaps (a day of a fleet: ~3 GB of token times).
    for collector in (merged, *(rr.result.metrics for rr in reps)):
        collector.release_records()
    release_freed_heap()  # (small arrays: their memory goes back to the system only when trimmed)
    # The summary reads merged's requests table as the records made it; the cluster's table (what
    # requests.parquet and the frame hold) is that table with the routing columns added.
    summary = _summary(cluster, reps, merged, wall_time_s, end_s)
    requests = _requests_columns(cluster, merged.columns().requests)
    merged.adopt_requests(requests)
    add_gateway_figures(summary, cluster.gateway, cluster.cfg, cluster.workload, requests)
    warn_rejected(requests)
    if has_sessions(cluster.workload.requests):  # per-session figures (simulator/session_metrics.py)
        summary["sessions"] = session_summary(cluster.workload.requests, requests,
                                              cluster.turns.num_abandoned if cluster.turns is not None else 0)
    if cluster.cfg.pd is not None:
        summary["pd"] = _pd_summary(cluster, requests)
    summary["cost"] = cost_summary(cluster, summary["sim_duration_s"], requests)
    tables = {}
    if cluster.autoscaler is not None:
        from servesim.simulator.cluster.autoscale.summary import autoscale_summary, autoscale_tables

        summary["autoscale"] = autoscale_summary(cluster, summary["sim_duration_s"])
        tables = autoscale_tables(cluster)
    return ClusterResult(cluster.cfg, reps, merged, summary, wall_time_s, tables)


def _share_gaps(merged: MetricsCollector, reps: list[ReplicaResult]) -> None:
    """Every inter-token gap computed once, into one buffer: the merged table's (built here, pooled
    over its records), which the replicas' tables then view wherever a replica's record has the very
    token times a merged record has (a colocated request's; a P/D request's decode side). A day of
    a fleet streams ~10^8-10^9 tokens: one buffer, not one per replica plus the copies the summary
    and bench_serve's statistics would concatenate from rows."""
    merged.columns()  # each merged record keeps its gaps, a view of the table's one buffer
    gaps = {id(rec.token_times_s): rec.itl_s for rec in merged.requests.values() if len(rec.token_times_s)}
    for rr in reps:
        for rec in rr.result.metrics.requests.values():
            shared = gaps.get(id(rec.token_times_s))
            if shared is not None:
                rec.itl_s = shared
        rr.result.metrics.columns()  # its rows view the shared gaps (request_columns keeps what is current)


def _keeps_rows(cluster: Cluster) -> bool:
    """Whether the replicas kept their step rows (one setting for all: ClusterConfig checks it)."""
    return all(r.engine.metrics.steps.keep_rows for r in cluster.replicas)


def _steps_columns(cluster: Cluster) -> Columns:
    """Every replica's steps in one table with a `replica` column, each value copied once and held
    once (a cluster hour has ~17 M steps): each replica's own steps are a view of its rows
    (adopted), the merged collector's the whole, whose series is then the group's. No rows
    (step_rows: false): the table is empty, the figures and series come from the replicas' folds."""
    tables = [r.engine.metrics.steps for r in cluster.replicas]
    if not _keeps_rows(cluster):
        return StepTable().columns().inserted(0, {"replica": np.zeros(0, dtype=np.int64)})
    bounds = np.cumsum([0] + [len(t) for t in tables])
    # each column's freed arrays go back to the system before the next is copied (collector.py)
    steps = StepTable.move_to_columns(tables, release_freed_heap)
    for r, start, end in zip(cluster.replicas, bounds[:-1], bounds[1:]):
        r.engine.metrics.adopt_steps(steps.rows(int(start), int(end)))
    replica = np.repeat(np.array([r.index for r in cluster.replicas], dtype=np.int64), np.diff(bounds))
    return steps.inserted(0, {"replica": replica})


def _merged_record(cluster: Cluster, spec) -> RequestRecord:
    rid = spec.request_id
    gateway = cluster.gateway
    if gateway is not None and rid in gateway.rejected:  # refused before any replica
        return RequestRecord(rid, spec.arrival_time_s, spec.prompt_len, spec.output_len,
                             reject_reason=gateway.rejected[rid])
    if gateway is not None and rid in gateway.gone:  # its client gave up in the gateway's queue
        return RequestRecord(rid, spec.arrival_time_s, spec.prompt_len, spec.output_len, finish_reason="abort",
                             status="timed_out")
    front = cluster.replicas[cluster.routes[rid].replica].engine.metrics.requests[rid]
    if cluster.cfg.pd is None:
        return replace(front, arrival_s=spec.arrival_time_s)
    tl = cluster.handoffs.timelines[rid]
    if tl.decode is None:  # ignored on the prefill side
        return replace(front, arrival_s=spec.arrival_time_s, output_len_target=spec.output_len)
    back = cluster.replicas[tl.decode.replica].engine.metrics.requests[rid]
    return RequestRecord(rid, spec.arrival_time_s, spec.prompt_len, spec.output_len,
                         first_scheduled_s=front.first_scheduled_s, first_token_s=back.first_token_s,
                         finish_s=back.finish_s, token_times_s=back.token_times_s, itl_s=back.itl_s,
                         num_preemptions=front.num_preemptions + back.num_preemptions,
                         num_cached_tokens=front.num_cached_tokens, finish_reason=back.finish_reason,
                         reject_reason=back.reject_reason, status=back.status)  # timed out on the decode side


def _requests_columns(cluster: Cluster, table: Columns) -> Columns:
    """The merged requests `table` with the routing columns after request_id (and P/D's at the
    end). Each is typed as pandas types the list it is made of (_inferred), the frame and the
    result file's types: a request the gateway refused has no route (its replica columns are then
    nullable integers, as a P/D request's decode replica always is)."""
    ids = table.raw("request_id")
    routes = [cluster.routes.get(rid) for rid in ids]
    unrouted = any(r is None for r in routes)
    pd_on = cluster.cfg.pd is not None
    first = "prefill_replica" if pd_on else "replica"
    new: dict[str, np.ndarray | list] = {first: _inferred([None if r is None else r.replica for r in routes])}
    nullable = [first] if unrouted else []
    tls = [cluster.handoffs.timelines.get(rid) for rid in ids] if pd_on else []  # None: refused
    if pd_on:
        new["decode_replica"] = _inferred([t.decode.replica if t is not None and t.decode else None for t in tls])
        nullable.append("decode_replica")
    new["route_time_s"] = _inferred([float("nan") if r is None else r.time_s for r in routes])
    new["route_reason"] = [None if r is None else r.reason for r in routes]
    new["route_score"] = _inferred([None if r is None else r.score for r in routes])
    out = table.inserted(1, new, nullable)
    return _with_pd_columns(out, tls) if pd_on else out


def _with_pd_columns(table: Columns, tls: list) -> Columns:
    """The TTFT parts and the KV moved (the module docstring); `tls`: each row's timeline (None: the
    gateway refused it)."""
    arrival, first_sched, first_tok = (np.asarray(table[c], dtype=float) for c in
                                       ("arrival_s", "first_scheduled_s", "first_token_s"))
    nan = float("nan")
    done = np.array([t.prefill_done_s if t is not None and t.decode is not None and t.prefill_done_s is not None
                     else nan for t in tls])
    t_start = np.array([nan if t is None or t.transfer_start_s is None else t.transfer_start_s for t in tls])
    t_end = np.array([nan if t is None or t.transfer_end_s is None else t.transfer_end_s for t in tls])
    return table.inserted(len(table.columns), {
        "prefill_queue_s": first_sched - arrival, "prefill_s": done - first_sched, "transfer_s": t_end - done,
        "first_decode_s": first_tok - t_end, "kv_link_s": t_end - t_start,
        "kv_tokens": _inferred([0 if t is None else t.external_tokens for t in tls]),
        "kv_bytes": _inferred([0 if t is None else t.kv_bytes for t in tls])})


def _inferred(values: list) -> np.ndarray | list:
    """A column of Python values as pandas types such a list (the frame's type, and what the
    result file stores): integers alone as int64, numbers with a float or a None among them as
    float64 (None: NaN), anything else (strings, None alone) as the list."""
    kinds = set(map(type, values))
    if not kinds or kinds <= {type(None)} or any(k is bool or k is np.bool_ for k in kinds):
        return values
    if all(issubclass(k, (int, np.integer)) for k in kinds):
        return np.array(values, dtype=np.int64)
    if all(k is type(None) or issubclass(k, (int, float, np.integer, np.floating)) for k in kinds):
        return np.array([float("nan") if v is None else v for v in values], dtype=np.float64)
    return values


def _summary(cluster: Cluster, reps: list[ReplicaResult], merged: MetricsCollector, wall_time_s: float,
             end: float) -> dict:
    """The cluster's summary; `end` the last finish (s)."""
    cfg = cluster.cfg
    front = [rr for rr in reps if rr.role != "decode"]  # where prompts are computed
    hits = sum(rr.result.prefix_hits for rr in front)
    queries = sum(rr.result.prefix_queries for rr in front)
    s = summarize(merged, end, wall_time_s, cfg.slo, len(cluster.workload.requests), hits, queries)
    s["sim_speedup_x"] = end / wall_time_s if wall_time_s > 0 else None
    s["cluster"] = {
        "num_replicas": cfg.num_replicas, "num_gpus": cfg.num_gpus, "router": cfg.router.name,
        "routing_latency_s": cfg.routing_latency_s, "pd": cfg.pd is not None,
        "requests_per_replica": {rr.name: rr.num_routed for rr in reps},
    }
    s["replicas"] = [{"name": rr.name, "role": rr.role, "gpu": rr.cfg.hardware.gpu, "tp": rr.cfg.hardware.tp, "pp": rr.cfg.hardware.pp,
                      "num_routed": rr.num_routed, "fast_path_declined": rr.result.planner_declined,
                      **_replica_brief(rr)} for rr in reps]
    tiers = [rr.result.kv_offload.summary() for rr in reps if rr.result.kv_offload is not None]
    if tiers:
        s["kv_offload"] = _offload_totals(tiers)
    hosts = [r["hicache"] for r in s["replicas"] if "hicache" in r]
    if hosts:  # SGLang's host tiers, summed
        s["hicache"] = {k: sum(h[k] for h in hosts) for k in hosts[0]}
    return s


def _offload_totals(tiers: list[dict]) -> dict:
    """The replicas' CPU KV tiers summed (each replica's own block is in `replicas[i].kv_offload`)."""
    out = {k: sum(t[k] for t in tiers) for k in (
        "cpu_hit_tokens", "cpu_query_tokens", "preempted_cpu_hit_tokens", "preempted_cpu_query_tokens", "num_loads",
        "num_stores", "bytes_loaded_per_gpu", "bytes_stored_per_gpu", "load_wait_s_total")}
    out["cpu_hit_rate"] = out["cpu_hit_tokens"] / out["cpu_query_tokens"] if out["cpu_query_tokens"] else 0.0
    out["load_wait_s_mean"] = out["load_wait_s_total"] / out["num_loads"] if out["num_loads"] else 0.0
    return out


def _pd_summary(cluster: Cluster, requests: Columns) -> dict:
    ok = requests[requests["output_len"] > 0]
    return {
        "decode_router": cluster.cfg.pd.decode_router.name,
        "ttft_breakdown_s": {p: stats(ok[p]) for p in PD_PARTS},
        "kv_link_s": stats(ok["kv_link_s"]),
        "kv_bytes_total": int(requests["kv_bytes"].sum()),
        "links": [link.stats() for link in cluster.links],
    }


def _replica_brief(rr: ReplicaResult) -> dict:
    res = rr.result
    return {**brief_summary(res.metrics, res.prefix_hits, res.prefix_queries),
            "num_gpu_blocks": res.cache.num_gpu_blocks,
            **({"kv_offload": res.kv_offload.summary()} if res.kv_offload is not None else {}),
            **({"hicache": hicache_summary(res.hicache, res.prefix_hits)} if res.hicache is not None else {})}


def write_cluster_results(out_dir: str | Path, res: ClusterResult, workload_meta: dict,
                          overwrite: bool = False, identity: dict | None = None) -> Path:
    """requests.parquet, steps.parquet (unless the rows were folded: step_rows false), timeseries.csv
    (the group's 1-s series: counts summed over the replicas, KV usage their mean, each replica's
    running / waiting / KV usage beside; simulator/step_fold.py), summary.json, config.yaml,
    through the replay's atomic writer."""
    resolved = cluster_config_to_dict(res.config)
    resolved["workload"] = workload_meta
    kept = res.metrics.step_folds().rows_kept
    cols = res.metrics.columns()  # the tables as columns: written without pandas
    return write_result_folder(out_dir, "cluster", requests=cols.requests, steps=cols.steps if kept else None,
                               timeseries=cols.timeseries(res.summary["sim_duration_s"]), config=resolved,
                               summary=res.summary, overwrite=overwrite, identity=identity, extra_csv=res.tables)
