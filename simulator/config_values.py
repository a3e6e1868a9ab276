"""Type-checked assignment of config values (shared by `--set`, scenario and cluster loaders)."""

from __future__ import annotations

import dataclasses
from typing import Any

from servesim.traces.errors import InputError


def coerce_field(current: Any, value: Any, where: str, path: str | None = None) -> Any:
    """Keep a field's type: ints take ints, floats ints or floats, tuples lists, and so on."""
    if current is None or value is None or dataclasses.is_dataclass(current):
        return value
    if isinstance(current, bool):
        ok = isinstance(value, bool)
    elif isinstance(current, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(current, float):
        if isinstance(value, str):  # PyYAML reads 25.0e9 (no sign in the exponent) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif isinstance(current, (tuple, list)):
        ok = isinstance(value, (list, tuple))
        value = type(current)(value) if ok else value
    else:
        ok = isinstance(value, type(current))
    if not ok:
        raise InputError(f"expected {type(current).__name__}, got {value!r}", path=path, field=where)
    return value
