"""A KV-transfer link on the SimPy clock: fixed latency, then bandwidth shared by concurrent transfers.

Two sharing models:
- "fair" (processor sharing): n active transfers each get bandwidth/n. Implemented with a virtual
  clock V that advances at bandwidth/n bytes per second; a transfer of b bytes joining at V0 finishes
  when V reaches V0 + b. Only V moves on each event, so a join or a finish costs O(log n), and there
  is no per-transfer float drift.
- "lanes": N lanes, each bandwidth/N, first come first served: each lane a FIFO copy queue
  (scheduler/copy_stream.py TransferStream, the one "n bytes over a link with a queue" model the
  CPU KV tiers' host-link copies use too); a transfer takes the lane free first (ties: the lowest).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

import simpy

from servesim.scheduler.copy_stream import TransferStream
from servesim.simulator.cluster.config import LinkConfig


class KVLink:
    def __init__(self, env: simpy.Environment, cfg: LinkConfig, name: str = "link") -> None:
        self.env = env
        self.cfg = cfg
        self.name = name
        self.bytes_sent = 0  # bytes, completed transfers
        self.num_transfers = 0  # completed transfers
        self.busy_s = 0.0  # seconds with at least one transfer on the wire
        self._lanes = [TransferStream() for _ in range(cfg.lanes)] if cfg.sharing == "lanes" else None
        self._busy_until = 0.0  # lanes mode: the end of the last busy interval counted in busy_s
        # fair sharing state
        self._heap: list[tuple[float, int, int, Callable[[], None]]] = []  # (finish tag, seq, bytes, done)
        self._seq = itertools.count()
        self._virtual = 0.0  # bytes each active transfer has received since the link was built
        self._last_s = 0.0
        self._changed: simpy.Event | None = None
        self._server: simpy.Process | None = None
        # When calls of done() can next come (next_event_s): the clock's readings at which the
        # transfers still in their latency join the wire, at which the lanes' transfers land, and
        # at which the fair server next wakes (inf: it is not running). Heaps, entries past dropped.
        self._joins_s: list[float] = []
        self._lands_s: list[float] = []
        self._wake_s = float("inf")

    def transfer(self, nbytes: int, done: Callable[[], None]) -> None:
        """Send nbytes; call done() (inside the simulation) when the last byte arrives."""
        now = self.env.now
        heapq.heappush(self._joins_s, now + self.cfg.latency_s if self.cfg.latency_s > 0 else now)
        self.env.process(self._send(nbytes, done))

    def next_event_s(self) -> float:
        """No transfer on this link lands before this time, from its state now (a lower bound:
        the P/D fast path's, simulator/fastpath/pd_runs.py). A transfer in its latency lands no
        earlier than it joins (timeouts are the clock's now + delay, as recorded); one on a lane
        lands at its recorded time; one shared fairly lands no earlier than the server's next
        wake as now scheduled, since a join only slows those on the wire (the joiner itself is
        counted by its join time until the server has seen it, in that same instant)."""
        now = self.env.now
        for times in (self._joins_s, self._lands_s):
            while times and times[0] < now:
                heapq.heappop(times)
        return min(self._joins_s[0] if self._joins_s else self._wake_s,
                   self._lands_s[0] if self._lands_s else self._wake_s, self._wake_s)

    def _send(self, nbytes: int, done: Callable[[], None]):
        if self.cfg.latency_s > 0:
            yield self.env.timeout(self.cfg.latency_s)
        if self._lanes is not None:
            end_s = self._on_lane(nbytes)
            now = self.env.now
            heapq.heappush(self._lands_s, now + (end_s - now))
            yield self.env.timeout(end_s - now)
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

    def _on_lane(self, nbytes: int) -> float:
        """Queue nbytes on the lane free first; when its last byte lands. Starts never decrease
        (a lane's free time only grows and the clock only moves on), so busy_s, the union of the
        lanes' busy intervals, grows by the part of each new interval past the last one's end."""
        lanes, now = self._lanes, self.env.now
        lane = min(lanes, key=lambda q: q.free_at_s)  # min keeps the first of equals: the lowest lane
        start_s = max(now, lane.free_at_s)
        end_s = lane.submit(now, nbytes / (self.cfg.bandwidth_bytes_per_s / self.cfg.lanes))
        self.busy_s += max(0.0, end_s - max(start_s, self._busy_until))
        self._busy_until = max(self._busy_until, end_s)
        return end_s

    def _serve(self):
        env, bw = self.env, self.cfg.bandwidth_bytes_per_s
        while self._heap:
            tag = self._heap[0][0]
            wait = max(tag - self._virtual, 0.0) * len(self._heap) / bw
            self._changed = env.event()
            self._wake_s = env.now + wait
            yield env.timeout(wait) | self._changed
            self._advance()
            # Finish every transfer whose tag has been reached; the tolerance absorbs float rounding.
            eps = 1e-9 * max(1.0, abs(self._virtual))
            while self._heap and self._heap[0][0] <= self._virtual + eps:
                _, _, nbytes, done = heapq.heappop(self._heap)
                self._complete(nbytes, done)
        self._wake_s = float("inf")

    def _complete(self, nbytes: int, done: Callable[[], None]) -> None:
        self.bytes_sent += nbytes
        self.num_transfers += 1
        done()

    def stats(self) -> dict:
        return {"name": self.name, "num_transfers": self.num_transfers, "bytes": self.bytes_sent,
                "busy_s": self.busy_s}
