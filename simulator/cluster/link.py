"""A KV-transfer link on the SimPy clock: fixed latency, then bandwidth shared by concurrent transfers.

Two sharing models:
- "fair" (processor sharing): n active transfers each get bandwidth/n. Implemented with a virtual
  clock V that advances at bandwidth/n bytes per second; a transfer of b bytes joining at V0 finishes
  when V reaches V0 + b. Only V moves on each event, so a join or a finish costs O(log n), and there
  is no per-transfer float drift.
- "lanes": a simpy Resource of N lanes, each bandwidth/N, first come first served.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

import simpy

from servesim.simulator.cluster.config import LinkConfig


class KVLink:
    def __init__(self, env: simpy.Environment, cfg: LinkConfig, name: str = "link") -> None:
        self.env = env
        self.cfg = cfg
        self.name = name
        self.bytes_sent = 0  # bytes, completed transfers
        self.num_transfers = 0  # completed transfers
        self.busy_s = 0.0  # seconds with at least one transfer on the wire
        self._lanes = simpy.Resource(env, capacity=cfg.lanes) if cfg.sharing == "lanes" else None
        # fair sharing state
        self._heap: list[tuple[float, int, int, Callable[[], None]]] = []  # (finish tag, seq, bytes, done)
        self._seq = itertools.count()
        self._virtual = 0.0  # bytes each active transfer has received since the link was built
        self._last_s = 0.0
        self._changed: simpy.Event | None = None
        self._server: simpy.Process | None = None
        self._num_on_wire = 0  # lanes mode: transfers holding a lane
        self._busy_since = 0.0

    def transfer(self, nbytes: int, done: Callable[[], None]) -> None:
        """Send nbytes; call done() (inside the simulation) when the last byte arrives."""
        self.env.process(self._send(nbytes, done))

    def _send(self, nbytes: int, done: Callable[[], None]):
        if self.cfg.latency_s > 0:
            yield self.env.timeout(self.cfg.latency_s)
        if self._lanes is not None:
            with self._lanes.request() as lane:
                yield lane
                self._mark_busy(+1)
                yield self.env.timeout(nbytes / (self.cfg.bandwidth_bytes_per_s / self.cfg.lanes))
                self._mark_busy(-1)
            self._complete(nbytes, done)
            return
        self._advance()
        heapq.heappush(self._heap, (self._virtual + nbytes, next(self._seq), nbytes, done))
        if self._server is None or not self._server.is_alive:
            self._server = self.env.process(self._serve())
        elif self._changed is not None and not self._changed.triggered:
            self._changed.succeed()

    def _advance(self) -> None:
        now = self.env.now
        if self._heap:
            self._virtual += (now - self._last_s) * self.cfg.bandwidth_bytes_per_s / len(self._heap)
            self.busy_s += now - self._last_s
        self._last_s = now

    def _mark_busy(self, delta: int) -> None:
        now = self.env.now
        if self._num_on_wire > 0:
            self.busy_s += now - self._busy_since
        self._busy_since = now
        self._num_on_wire += delta

    def _serve(self):
        env, bw = self.env, self.cfg.bandwidth_bytes_per_s
        while self._heap:
            tag = self._heap[0][0]
            wait = max(tag - self._virtual, 0.0) * len(self._heap) / bw
            self._changed = env.event()
            yield env.timeout(wait) | self._changed
            self._advance()
            # Finish every transfer whose tag has been reached; the tolerance absorbs float rounding.
            eps = 1e-9 * max(1.0, abs(self._virtual))
            while self._heap and self._heap[0][0] <= self._virtual + eps:
                _, _, nbytes, done = heapq.heappop(self._heap)
                self._complete(nbytes, done)

    def _complete(self, nbytes: int, done: Callable[[], None]) -> None:
        self.bytes_sent += nbytes
        self.num_transfers += 1
        done()

    def stats(self) -> dict:
        return {"name": self.name, "num_transfers": self.num_transfers, "bytes": self.bytes_sent,
                "busy_s": self.busy_s}
