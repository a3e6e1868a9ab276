"""One part of the check: its time box, its pass/fail verdict and its lines of the report."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


class OverBudget(Exception):
    """Raised from a replay's progress callback to stop it at the part's budget."""


@dataclass(slots=True)
class Part:
    """A part's record. `check` fails the part on a false condition (never raises: the other
    parts still run); `expired` ends it at its budget (counted as a failure, so a rerun with the
    cause fixed is needed rather than a report with a silent gap)."""

    title: str
    budget_s: float
    log_line: Callable[[str], None]
    ok: bool = True
    timed_out: bool = False
    started_s: float = field(default_factory=time.monotonic)
    elapsed_s: float = 0.0
    summary: str = ""
    failures: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)  # markdown, under the part's heading

    def log(self, msg: str) -> None:
        self.log_line(f"[{self.title}] {msg}")

    def check(self, cond: bool, what: str) -> bool:
        if not cond:
            self.ok = False
            self.failures.append(what)
            self.log(f"FAIL: {what}")
        return cond

    def expired(self) -> bool:
        if not self.timed_out and time.monotonic() - self.started_s > self.budget_s:
            self.timed_out = True
            self.check(False, f"stopped at its budget of {self.budget_s:.0f} s")
        return self.timed_out

    def progress(self, now_s: float, num_done: int) -> None:
        """A replay's progress callback (every few hundred steps): stops the replay at the budget."""
        if self.expired():
            raise OverBudget(self.title)

    def fail_with(self, exc: BaseException) -> None:
        """An exception inside the part: recorded as its failure, with the exception's last line."""
        lines = str(exc).strip().splitlines()
        hint = " (a package this machine lacks: make the carry with `make gpu-carry` and carry .gpu-carry)" \
            if isinstance(exc, ModuleNotFoundError) else ""
        self.check(False, f"raised {type(exc).__name__}: {lines[-1] if lines else ''}{hint}")

    def finish(self) -> None:
        self.elapsed_s = time.monotonic() - self.started_s
