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
from functools import partial

import simpy
from simpy.events import NORMAL, URGENT, EventPriority

from servesim.scheduler.copy_stream import TransferStream
from servesim.simulator.cluster.config import LinkConfig


# The fair server's states (KVLink._state).
_DEAD, _STARTING, _ARMED, _WOKEN, _RUNNING = range(5)


class KVLink:
    """One link's transfers (module docstring), driven by plain events and callbacks.

    Each callback runs at the event turn a SimPy process would run at: a transfer starts at an
    urgent event at its call's instant (a process's initialisation), joins the wire when its
    latency timeout fires, and lands when its lane's timeout fires; the fair server's wake-ups
    take the hops a process waiting on `timeout | changed` takes (a join succeeds `changed`, which
    triggers the condition, whose turn resumes the server; the timeout triggers the condition
    directly). Only events that run nothing are left out (a finished process's own event, a
    condition's losers), so every other event keeps its order on the clock."""

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
        self._state = _DEAD  # the fair server (class docstring)
        self._wake_gen = 0  # the armed timeout's number: an earlier one fires into nothing
        self._join_pending = False  # armed: a join already asked for a wake-up
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
        self._at_turn(partial(self._start, nbytes, done), URGENT)

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
        # (two-argument mins: mypyc compiles those inline, a three-argument one is a call)
        return min(min(self._joins_s[0] if self._joins_s else self._wake_s,
                       self._lands_s[0] if self._lands_s else self._wake_s), self._wake_s)

    # --- event plumbing --------------------------------------------------------------------------
    def _at_turn(self, fn: Callable[[], None], priority: EventPriority = NORMAL) -> None:
        """Run fn at an event of its own at this instant (after those already due now)."""
        ev = simpy.Event(self.env)
        ev.callbacks.append(lambda _ev: fn())
        ev._ok = True
        ev._value = None
        self.env.schedule(ev, priority)

    def _after(self, delay_s: float, fn: Callable[[], None]) -> None:
        self.env.timeout(delay_s).callbacks.append(lambda _ev: fn())

    def _start(self, nbytes: int, done: Callable[[], None]) -> None:
        if self.cfg.latency_s > 0:
            self._after(self.cfg.latency_s, partial(self._join, nbytes, done))
        else:
            self._join(nbytes, done)

    def _join(self, nbytes: int, done: Callable[[], None]) -> None:
        if self._lanes is not None:
            end_s = self._on_lane(nbytes)
            now = self.env.now
            heapq.heappush(self._lands_s, now + (end_s - now))
            self._after(end_s - now, partial(self._complete, nbytes, done))
            return
        self._advance()
        heapq.heappush(self._heap, (self._virtual + nbytes, next(self._seq), nbytes, done))
        if self._state == _DEAD:
            self._state = _STARTING
            self._at_turn(self._serve_start, URGENT)
        elif self._state == _ARMED and not self._join_pending:
            self._join_pending = True  # `changed` succeeded: the condition is checked at its turn
            self._at_turn(self._changed_turn)

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
        assert lanes is not None
        lane = min(lanes, key=lambda q: q.free_at_s)  # min keeps the first of equals: the lowest lane
        start_s = max(now, lane.free_at_s)
        end_s = lane.submit(now, nbytes / (self.cfg.bandwidth_bytes_per_s / self.cfg.lanes))
        self.busy_s += max(0.0, end_s - max(start_s, self._busy_until))
        self._busy_until = max(self._busy_until, end_s)
        return end_s

    # --- the fair server -----------------------------------------------------------------------
    def _serve_start(self) -> None:
        self._state = _RUNNING
        self._arm()

    def _arm(self) -> None:
        """Wait for the first finish tag on the wire, or for a join: whichever comes first."""
        if not self._heap:
            self._state = _DEAD
            self._wake_s = float("inf")
            return
        tag = self._heap[0][0]
        wait = max(tag - self._virtual, 0.0) * len(self._heap) / self.cfg.bandwidth_bytes_per_s
        self._state, self._join_pending = _ARMED, False
        self._wake_gen += 1
        self._wake_s = self.env.now + wait
        self._after(wait, partial(self._timer_turn, self._wake_gen))

    def _changed_turn(self) -> None:
        if self._state == _ARMED:  # the join came first: the condition's own turn resumes the server
            self._state = _WOKEN
            self._at_turn(self._serve)

    def _timer_turn(self, gen: int) -> None:
        if gen == self._wake_gen and self._state == _ARMED:
            self._state = _WOKEN
            self._at_turn(self._serve)

    def _serve(self) -> None:
        self._state = _RUNNING
        self._advance()
        # Finish every transfer whose tag has been reached; the tolerance absorbs float rounding.
        eps = 1e-9 * max(1.0, abs(self._virtual))
        while self._heap and self._heap[0][0] <= self._virtual + eps:
            _, _, nbytes, done = heapq.heappop(self._heap)
            self._complete(nbytes, done)
        self._arm()

    def _complete(self, nbytes: int, done: Callable[[], None]) -> None:
        self.bytes_sent += nbytes
        self.num_transfers += 1
        done()

    def stats(self) -> dict:
        return {"name": self.name, "num_transfers": self.num_transfers, "bytes": self.bytes_sent,
                "busy_s": self.busy_s}
