"""One registry type for every pluggable kind (cost models, engines, routers, trace formats, backends...).

    ROUTERS: Registry[RouterFactory] = Registry("router")
    @ROUTERS.register("round_robin")
    class RoundRobin: ...
    ROUTERS.get("round-robn")  # UnknownNameError: unknown router 'round-robn'; did you mean 'round_robin'?

A name maps to one entry; registering a second, different entry under a taken name is refused (two
plug-ins silently shadowing each other is the bug this prevents). An unknown name is answered with
the valid names and the closest match (difflib), so a typo never needs a look at our code.

Stdlib only: scheduler/ must import nothing else. Callers that report user input errors pass
`error=` to raise their own exception type (servesim's InputError) with the same message.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")

ErrorFactory = Callable[[str, str], Exception]  # (message, allowed names in words) -> exception


class UnknownNameError(ValueError):
    """An unknown registry name; the message lists the valid names and a did-you-mean."""

    def __init__(self, message: str, allowed: str) -> None:
        self.detail = message
        self.allowed = allowed
        super().__init__(f"{message} (valid: {allowed})")


def did_you_mean(name: str, valid: Iterable[str]) -> str | None:
    """The valid name closest to `name` (case-insensitive), or None when nothing is close."""
    valid = list(valid)
    lowered = {v.lower(): v for v in valid}
    hits = difflib.get_close_matches(str(name).lower(), list(lowered), n=1, cutoff=0.6)
    return lowered[hits[0]] if hits else None


def unknown_name_message(kind: str, name: str, valid: Iterable[str]) -> str:
    """"unknown <kind> '<name>'" plus "; did you mean '<x>'?" when one is close."""
    guess = did_you_mean(name, valid)
    return f"unknown {kind} {name!r}" + (f"; did you mean {guess!r}?" if guess else "")


class Registry(Generic[T]):
    """name -> entry for one pluggable kind. `loader` imports the modules that register the
    built-ins (run once, on first lookup) so registration order cannot cause import cycles."""

    def __init__(self, kind: str, *, loader: Callable[[], None] | None = None,
                 error: ErrorFactory | None = None, normalize: Callable[[str], str] | None = None) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}
        self._loader = loader
        self._loaded = loader is None
        self._error = error
        self._normalize = normalize or (lambda s: s)

    # --- registering ---------------------------------------------------------------------------
    def add(self, name: str, entry: T) -> T:
        """Register `entry` under `name`; the same entry twice is a no-op, a different one refused."""
        key = self._normalize(name)
        old = self._entries.get(key)
        if old is not None and old is not entry:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._entries[key] = entry
        return entry

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator form of `add`."""
        def wrap(entry: T) -> T:
            return self.add(name, entry)
        return wrap

    # --- looking up ----------------------------------------------------------------------------
    def _ensure_loaded(self) -> None:
        if not self._loaded:
            self._loaded = True  # first: a loader that looks a name up must not recurse
            self._loader()

    def names(self) -> list[str]:
        self._ensure_loaded()
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        self._ensure_loaded()
        return isinstance(name, str) and self._normalize(name) in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def items(self) -> list[tuple[str, T]]:
        """(name, entry) in registration order (auto-detection tries them in this order)."""
        self._ensure_loaded()
        return list(self._entries.items())

    def find(self, name: str) -> T | None:
        """The entry registered so far under `name`, or None (does not run the loader)."""
        return self._entries.get(self._normalize(name))

    def get(self, name: str, *, extra: Iterable[str] = ()) -> T:
        """The entry for `name`; unknown: the error lists the valid names (plus `extra` ones the
        caller also accepts, e.g. "auto") and the closest match."""
        self._ensure_loaded()
        key = self._normalize(str(name))
        if key in self._entries:
            return self._entries[key]
        valid = [*extra, *self.names()]
        message = unknown_name_message(self.kind, str(name), valid)
        allowed = ", ".join(valid) or "(none registered)"
        raise (self._error or UnknownNameError)(message, allowed)
