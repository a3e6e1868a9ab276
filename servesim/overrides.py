"""`--set a.b=c`: override any field of the configuration tree by its dotted path."""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any

import yaml

from servesim.simulator.config_values import coerce_field
from servesim.traces.errors import InputError


def _fields(obj) -> list[str]:
    return [f.name for f in dataclasses.fields(obj)]


def split_set_items(items: list[str]) -> dict[str, str]:
    """`--set k=v` items -> {k: raw v} (values still text: each caller parses them as YAML)."""
    pairs: dict[str, str] = {}
    for item in items:
        if "=" not in item:
            raise InputError(f"expects key=value, got {item!r}", field="--set")
        key, raw = item.split("=", 1)
        pairs[key.strip()] = raw
    return pairs


def apply_overrides(cfg, overrides: dict[str, Any]):
    """Return a copy of cfg with each dotted key set; values are parsed as YAML scalars when strings.

    All keys are applied before any config is rebuilt, each dataclass once, innermost first: the
    checks that tie fields together (SimConfig's start-up checks) see the final values, never a
    half-applied mix, so the order of the keys does not matter."""
    tree: dict[str, Any] = {}
    for key, raw in overrides.items():
        value = yaml.safe_load(raw) if isinstance(raw, str) else raw
        node, parts = tree, key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise InputError(f"{key!r} is set both as a value and as a section", field=key)
        node[parts[-1]] = _Leaf(value, key)
        if key == "cache.num_gpu_blocks":
            tree["derive_num_gpu_blocks"] = _Leaf(False, key)
    return _build(cfg, tree, "") if tree else cfg


class _Leaf:
    __slots__ = ("value", "key")

    def __init__(self, value, key: str) -> None:
        self.value, self.key = value, key


def _build(obj, changes: dict, prefix: str):
    if not dataclasses.is_dataclass(obj):
        if isinstance(obj, dict):  # a plain mapping (e.g. cost_model.params): set keys inside it
            new = dict(obj)
            for name, change in changes.items():
                new[name] = change.value if isinstance(change, _Leaf) else _build(obj.get(name, {}), change,
                                                                                  f"{prefix}{name}.")
            return new
        raise InputError(f"cannot set {prefix}...: {prefix.rstrip('.')!r} is a plain value", field=prefix.rstrip("."))
    valid = _fields(obj)
    kwargs = {}
    for name, change in changes.items():
        full_key = change.key if isinstance(change, _Leaf) else f"{prefix}{name}"
        if name not in valid:
            near = difflib.get_close_matches(name, valid, n=3)
            hint = f" (did you mean {', '.join(near)}?)" if near else ""
            raise InputError(f"unknown key {name!r} in {full_key!r}{hint}", field=full_key, allowed=", ".join(valid))
        current = getattr(obj, name)
        if isinstance(change, _Leaf):
            kwargs[name] = _coerce(current, change.value, full_key)
        else:
            kwargs[name] = _build(current, change, f"{prefix}{name}.")
    try:
        return dataclasses.replace(obj, **kwargs)
    except InputError:
        raise  # already names its field
    except (TypeError, ValueError) as e:
        named = sorted((str(e).find(f), f) for f in valid if f in str(e))  # the field named first
        key = f"{prefix}{named[0][1]}" if named else (prefix.rstrip(".") or None)
        raise InputError(f"{e}", field=key) from None


def _coerce(current, value, full_key: str):
    """Keep the field's type: an int field takes ints, a float field ints or floats, and so on."""
    if dataclasses.is_dataclass(current) and isinstance(value, dict):
        # A mapping for a nested config: set its fields one by one (validated like dotted keys).
        return _build(current, {k: _Leaf(v, f"{full_key}.{k}") for k, v in value.items()}, f"{full_key}.")
    return coerce_field(current, value, full_key)
