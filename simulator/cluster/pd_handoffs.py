"""A P/D cluster's requests from prefill to decode: the hand-off, the KV transfer, the end.

The router picks a prefill replica, which runs the prompt and one token (output_len=1) and keeps
the KV; `handoff_latency_s` later the decode router picks a decode replica, whose scheduler
reserves blocks for the prompt (WAITING_FOR_REMOTE_KVS) and thereby starts the transfer on its
link; when the transfer lands the prefill side frees its blocks and the decode side recomputes the
last prompt token and generates the full output_len tokens. Each request's milestones are its
`PDTimeline`; the results read them (results.py), the decode replicas' fast path the pending
hand-offs (fastpath/pd_runs.py).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, fields
from functools import partial
from operator import attrgetter
from typing import TYPE_CHECKING, cast

from servesim.scheduler.request import Request
from servesim.simulator.cluster.pd import DecodeEngine, PrefillEngine
from servesim.simulator.specs import resolve_model
from servesim.simulator.specs.pipeline_stages import stage_kv_bytes_per_token
from servesim.traces.request_spec import RequestSpec

if TYPE_CHECKING:
    import simpy

    from servesim.simulator.cluster.cluster import Cluster, Replica, RouteRecord
    from servesim.simulator.cluster.config import ClusterConfig

_SPEC_FIELDS = tuple(f.name for f in fields(RequestSpec))
# prefill_spec's copy: every field read in one C call, each written through its slot's descriptor
_READ_SPEC_FIELDS = attrgetter(*_SPEC_FIELDS)
_WRITE_SPEC_FIELD = tuple(getattr(RequestSpec, name).__set__ for name in _SPEC_FIELDS)


@dataclass(slots=True)
class PDTimeline:
    """One request's P/D milestones (seconds on the cluster clock)."""

    prefill_done_s: float | None = None  # the prefill replica produced its token and kept the KV
    decode: RouteRecord | None = None
    transfer_start_s: float | None = None  # decode side reserved blocks; the transfer began
    transfer_end_s: float | None = None  # the last byte landed
    external_tokens: int = 0  # tokens whose KV crossed the link (prompt minus decode-side cache hits)
    kv_bytes: int = 0  # bytes on the link (per GPU: each TP rank sends its shard in parallel)


class PDHandoffs:
    """Owns each P/D request's timeline, the hand-offs pending, and when the cluster is done with
    every request. Its methods are the P/D replicas' callbacks (the prefill side's finish, the
    decode side's block reservation and finish), so it exists before the replicas and is connected
    to the cluster's routing once they are built (connect)."""

    def __init__(self, env: simpy.Environment, cfg: ClusterConfig) -> None:
        self.env = env
        self.cfg = cfg
        self.timelines: dict[str, PDTimeline] = {}
        self.pending_handoffs_s: list[float] = []  # a heap: when hand-offs now pending land (fastpath/pd_runs.py)
        self.num_final = 0  # requests the cluster is done with (_final)
        self._arrivals_done = False  # every request that will reach the router has

    def connect(self, cluster: Cluster) -> None:
        """The cluster's replicas, routes, specs and routing (the cluster keeps them; the lists and
        dicts are shared, so replicas an autoscaler adds are seen), once its replicas are built."""
        self.replicas: list[Replica] = cluster.replicas
        self.decoders: list[Replica] = cluster.decoders
        self.routes: dict[str, RouteRecord] = cluster.routes
        self._specs: dict[str, RequestSpec] = cluster._specs
        self._route: Callable = cluster._route
        self.decode_router = cluster.decode_router
        self.pd_links = cluster.pd_links
        self.request_done = cluster.request_done
        self._kv_bytes = _kv_bytes_table(self.replicas)

    def dispatch(self, rep: Replica, spec: RequestSpec) -> None:
        """The router sent `spec` to prefill replica `rep` now."""
        self.timelines[spec.request_id] = PDTimeline()
        self._specs[spec.request_id] = spec  # as dispatched (the gateway's priority): the decode side's too
        rep.engine.submit(prefill_spec(spec))

    # --- completion callbacks (called from inside an engine's step) ------------------------------
    def on_prefill_finish(self, idx: int, request_id: str, reason: str | None) -> None:
        tl = self.timelines[request_id]
        tl.prefill_done_s = self.env.now
        if not self.replicas[idx].engine.metrics.requests[request_id].token_times_s:
            self._final(idx, request_id, reason)  # never fit on the prefill replica (or its client gave up): no decode
            return
        delay = self.cfg.pd.handoff_latency_s
        if delay > 0:
            self.env.timeout(delay).callbacks.append(lambda _ev: self._handoff(request_id))
            heapq.heappush(self.pending_handoffs_s, self.env.now + delay)  # the timeout's own time
        else:
            self._handoff(request_id)

    def _handoff(self, request_id: str) -> None:
        spec = self._specs[request_id]
        rep, rec = self._route(self.decode_router, spec, self.decoders)
        self.timelines[request_id].decode = rec
        rep.engine.connector.expect(request_id)
        rep.engine.submit_handed_over(spec, self.replicas[self.routes[request_id].replica].engine)

    def start_transfer(self, decode_idx: int, request: Request, num_external: int) -> None:
        rid = request.request_id
        tl = self.timelines[rid]
        tl.transfer_start_s = self.env.now
        tl.external_tokens = num_external
        prefill, decode = self.replicas[self.routes[rid].replica], self.replicas[decode_idx]
        p_hw, d_hw = prefill.cfg.hardware, decode.cfg.hardware
        tl.kv_bytes = num_external * self._kv_bytes[((p_hw.tp, p_hw.pp), (d_hw.tp, d_hw.pp))]
        self.pd_links.link_for(prefill, decode).transfer(tl.kv_bytes, partial(self._transfer_done, rid, decode_idx))

    def _transfer_done(self, request_id: str, decode_idx: int) -> None:
        self.timelines[request_id].transfer_end_s = self.env.now
        self._prefill_engine(request_id).kv_sent(request_id)
        self._decode_engine(decode_idx).kv_received(request_id)

    def _prefill_engine(self, request_id: str) -> PrefillEngine:
        """The engine of the prefill replica the request was routed to (a P/D cluster's front
        replicas are PrefillEngines: cluster.py builds them so)."""
        return cast(PrefillEngine, self.replicas[self.routes[request_id].replica].engine)

    def _decode_engine(self, idx: int) -> DecodeEngine:
        return cast(DecodeEngine, self.replicas[idx].engine)

    def on_decode_finish(self, idx: int, request_id: str, reason: str | None) -> None:
        if self.timelines[request_id].transfer_start_s is None:
            # Never fit on the decode replica: nobody will read the prefill side's KV.
            self._decode_engine(idx).connector.forget(request_id)
            self._prefill_engine(request_id).kv_sent(request_id)
        self._final(idx, request_id, reason)

    def _final(self, idx: int, request_id: str, reason: str | None) -> None:
        """Replica idx ended a P/D request for good: the cluster is done with it."""
        self.num_final += 1
        if self.request_done.hooked:
            self.request_done.done(idx, request_id, reason)
        self._maybe_close_pd()

    def arrivals_done(self) -> None:
        """Every request that will reach the router has (the cluster's arrival process ended)."""
        self._arrivals_done = True
        self._maybe_close_pd()

    def _maybe_close_pd(self) -> None:
        # P/D engines stay open until every request is done: a handoff or a transfer can come at any
        # time, and a stalled engine that was closed would stop (pd_schedulers.StallGate).
        # Once arrivals are done every request that will reach the router has (the gateway and the
        # turns settled first): each routed request ends in exactly one _final.
        if self._arrivals_done and self.num_final == len(self.routes):
            for r in self.replicas:
                r.engine.close()


def prefill_spec(spec: RequestSpec) -> RequestSpec:
    """The request a prefill replica serves: `spec` with one output token (its prefill plus the
    first token). Copied field by field, as dataclasses.replace copies, without running the spec's
    validation again (interpreted, most of replace's ~10 us a request): every field but
    output_len is one that was valid when the workload was built, and 1 is a valid output_len."""
    new = object.__new__(RequestSpec)
    for write, value in zip(_WRITE_SPEC_FIELD, _READ_SPEC_FIELDS(spec)):
        write(new, value)
    new.output_len = 1
    return new


def _kv_bytes_table(replicas: list[Replica]) -> dict[tuple[tuple[int, int], tuple[int, int]], int]:
    """Bytes per token on the link for each (prefill, decode) (tp, pp) pair: the larger per-GPU
    shard, since ranks send in parallel and the side with fewer ranks holds more per GPU (with
    pipeline stages, a GPU holds its stage's layers only; the stage with the most bounds)."""
    model = resolve_model(replicas[0].cfg.hardware.model)
    layouts = {(r.cfg.hardware.tp, r.cfg.hardware.pp) for r in replicas}
    per_gpu = {(tp, pp): max(stage_kv_bytes_per_token(model, tp, pp)) for tp, pp in layouts}
    return {(p, d): max(per_gpu[p], per_gpu[d]) for p in layouts for d in layouts}
