"""`--set a.b=c`: override any field of the configuration tree by its dotted path."""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any

import yaml

from simulator.config_values import coerce_field
from traces.errors import InputError


def _fields(obj) -> list[str]:
    return [f.name for f in dataclasses.fields(obj)]


def apply_overrides(cfg, overrides: dict[str, Any]):
    """Return a copy of cfg with each dotted key set; values are parsed as YAML scalars when strings."""
    for key, raw in overrides.items():
        value = yaml.safe_load(raw) if isinstance(raw, str) else raw
        cfg = _set(cfg, key.split("."), value, key)
        if key == "cache.num_gpu_blocks":
            cfg = dataclasses.replace(cfg, derive_num_gpu_blocks=False)
    return cfg


def _set(obj, path: list[str], value, full_key: str):
    if not dataclasses.is_dataclass(obj):
        if isinstance(obj, dict):
            new = dict(obj)
            new[path[0]] = value if len(path) == 1 else _set(obj.get(path[0], {}), path[1:], value, full_key)
            return new
        raise InputError(f"cannot set {full_key!r}: {path[0]!r} is inside a plain value", field=full_key)
    name = path[0]
    valid = _fields(obj)
    if name not in valid:
        near = difflib.get_close_matches(name, valid, n=3)
        hint = f" (did you mean {', '.join(near)}?)" if near else ""
        raise InputError(f"unknown key {name!r} in {full_key!r}{hint}", field=full_key, allowed=", ".join(valid))
    current = getattr(obj, name)
    if len(path) > 1:
        value = _set(current, path[1:], value, full_key)
    else:
        value = _coerce(current, value, full_key)
    try:
        return dataclasses.replace(obj, **{name: value})
    except (TypeError, ValueError) as e:
        raise InputError(f"invalid value {value!r}: {e}", field=full_key) from None


def _coerce(current, value, full_key: str):
    """Keep the field's type: an int field takes ints, a float field ints or floats, and so on."""
    if dataclasses.is_dataclass(current) and isinstance(value, dict):
        # A mapping for a nested config: set its fields one by one (validated like dotted keys).
        for k, v in value.items():
            current = _set(current, [k], v, f"{full_key}.{k}")
        return current
    return coerce_field(current, value, full_key)
