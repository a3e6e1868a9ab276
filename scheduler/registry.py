"""One registry type for every pluggable kind (cost models, engines, routers, trace formats, backends...).

    ROUTERS: Registry[RouterFactory] = Registry("router")
    @ROUTERS.register("round_robin")
    class RoundRobin: ...
    ROUTERS.get("round-robn")  # UnknownNameError: unknown router 'round-robn'; did you mean 'round_robin'?

Built-ins are declared in one place, the plug-in package: `Registry("policy",
plugins="servesim.scheduler.policies")` imports every module of that folder on the first lookup, so a
new plug-in is one new file there. The registry names its package as a string (no import edge), so
plug-ins import the registry and the registry never imports them back: no module cycle.

A name maps to one entry; registering a second, different entry under a taken name is refused (two
plug-ins silently shadowing each other is the bug this prevents). An unknown name is answered with
the valid names and the closest match (difflib), so a typo never needs a look at our code.

Auto-detection is one rule for every kind that recognises input by content (trace formats, measured
runs, profile importers): `detect()` asks every entry; exactly one match wins; several are an error
naming them (pass the name explicitly); none is an error listing the valid names. A detector may
answer a number instead of True: a more specific match (trace formats: the larger signature) wins
over less specific ones, and a tie at the top is ambiguous.

Stdlib only: scheduler/ must import nothing else. Callers that report user input errors pass
`error=` to raise their own exception type (servesim's InputError) with the same message.
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")

ErrorFactory = Callable[[str, str], Exception]  # (message, allowed names in words) -> exception


class RegistryError(ValueError):
    """A lookup or detection that failed; `allowed` lists the valid names."""

    def __init__(self, message: str, allowed: str) -> None:
        self.detail = message
        self.allowed = allowed
        super().__init__(f"{message} (valid: {allowed})")


class UnknownNameError(RegistryError):
    """An unknown registry name; the message lists the valid names and a did-you-mean."""


class DetectionError(RegistryError):
    """Auto-detection found several candidates (named in the message) or none."""


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


def import_package_modules(package: str) -> None:
    """Import every module of `package` (one level, names starting with "_" skipped): each
    plug-in registers itself on import. A plain module (no folder) is just imported."""
    spec = importlib.import_module(package).__spec__
    folders = spec.submodule_search_locations if spec is not None else None
    if not folders:  # a plain module: importing it registered its entries
        return
    for info in pkgutil.iter_modules(folders):
        if not info.name.startswith("_"):
            importlib.import_module(f"{package}.{info.name}")


Detection = bool | int | float  # True/False, or a specificity: the larger wins


class Registry(Generic[T]):
    """name -> entry for one pluggable kind. The built-ins register themselves when their modules
    are imported, which happens on the first lookup: every module of the `plugins` package, then
    `loader` (for the odd kind whose built-ins live elsewhere)."""

    def __init__(self, kind: str, *, plugins: str | None = None, loader: Callable[[], None] | None = None,
                 error: ErrorFactory | None = None, normalize: Callable[[str], str] | None = None) -> None:
        self.kind = kind
        self.plugins = plugins
        self._entries: dict[str, T] = {}
        self._loader = loader
        self._loaded = loader is None and plugins is None
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
            if self.plugins is not None:
                import_package_modules(self.plugins)
            if self._loader is not None:
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

    # --- auto-detection ------------------------------------------------------------------------
    def detect(self, test: Callable[[str, T], Detection], *, subject: str, explicit: str,
               tried: Callable[[str, T], str] | None = None, error: ErrorFactory | None = None) -> str:
        """The one entry whose `test(name, entry)` matches `subject` (the rule in the module doc).

        `explicit` says how the user names the entry instead (e.g. "--format NAME"); `tried`, when
        given, describes why an entry did not match (for the no-match message); `error` overrides
        the registry's error factory (e.g. to name the file being detected)."""
        scores: list[tuple[float, str]] = []
        misses: list[str] = []
        for name, entry in self.items():
            score = test(name, entry)
            if score:
                scores.append((float(score), name))
            elif tried is not None:
                misses.append(tried(name, entry))
        error = error or self._error or DetectionError
        allowed = ", ".join(self.names()) or "(none registered)"
        if not scores:
            why = f"; tried {'; '.join(misses)}" if misses else ""
            raise error(f"cannot tell the {self.kind} of {subject}: none matches{why}; "
                        f"pass one with {explicit}", allowed)
        best = max(s for s, _ in scores)
        top = [n for s, n in scores if s == best]
        if len(top) > 1:
            raise error(f"ambiguous {self.kind} for {subject}: {', '.join(top)} all match; "
                        f"pass one with {explicit}", allowed)
        return top[0]
