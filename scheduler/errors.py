"""One error type for bad user input (trace files, profiles, specs, scenarios, configs).

It lives in the lowest layer (stdlib only) so every package can raise it; `servesim.traces.errors`
re-exports it under the name most callers use.

Every message names where the problem is (file and line when there is one), which field, what was
found and what is allowed, so a user can fix the input without reading our code.
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad input: raised instead of crashing or silently corrupting results."""

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        line: int | None = None,  # 1-based line (or row) number in `path`
        field: str | None = None,
        allowed: str | None = None,  # what would have been accepted, in words
    ) -> None:
        self.path = path
        self.line = line
        self.field = field
        self.allowed = allowed
        self.detail = message
        super().__init__(self._format())

    def _format(self) -> str:
        parts = [self.path] if self.path else []
        if self.line is not None:
            parts.append(f"line {self.line}")
        if self.field is not None:
            parts.append(f"field '{self.field}'")
        text = f"{', '.join(parts)}: {self.detail}" if parts else self.detail
        if self.allowed:
            text += f" (allowed: {self.allowed})"
        return text


def field_error(field: str | None, path: object = None):
    """An `error=` factory for servesim.scheduler.registry.Registry: unknown names (and failed
    auto-detection) become InputErrors on `field`, naming the file `path` when given."""
    def make(message: str, allowed: str) -> InputError:
        return InputError(message, path=None if path is None else str(path), field=field, allowed=allowed)
    return make
