"""Type-checked assignment of config values and the one config-tree builder (shared by `--set`, the API,
scenario, cluster and plan loaders), and `--set a.b=c` itself (apply_overrides: the CLI's
servesim/overrides.py and `validate`'s replay config use the same)."""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any


from servesim.simulator.yaml_input import safe_load_bounded
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


def build_dataclass(obj: Any, data: Any, where: str, path: str | None = None, *,
                    name_checked_field: bool = False) -> Any:
    """A copy of dataclass `obj` with the fields in nested dict `data` replaced (recursively,
    type-checked): the one config-tree builder behind `--set`, the API's overrides and the cluster
    and plan loaders.

    `where` is the dotted place of `obj` in the user's input, named in errors ("" for the root:
    `--set` keys start at SimConfig). Starting from an instance, not the class, keeps factory
    defaults that differ from the nested class's own (SimConfig's scheduler has max_model_len=None:
    the model's, and async scheduling on). A plain-dict field (cost_model.params) takes the given
    keys on top of its current ones, so `--set cost_model.params.x=1` keeps the others.

    When a config's own check fails (ValueError), the error names the section; with
    `name_checked_field` (`--set`, where the user typed the full key) the field the message names."""
    if not isinstance(data, dict):
        raise InputError(f"expected a mapping, got {data!r}", path=path, field=where or None)
    names = [f.name for f in dataclasses.fields(obj)]
    changes = {}
    for key, value in data.items():
        key_path = f"{where}.{key}" if where else str(key)
        if key not in names:
            near = difflib.get_close_matches(str(key), names, n=3)
            hint = f" (did you mean {', '.join(near)}?)" if near else ""
            raise InputError(f"unknown key {key!r}{hint}", path=path, field=key_path, allowed=", ".join(names))
        current = getattr(obj, key)
        if dataclasses.is_dataclass(current):
            changes[key] = build_dataclass(current, value, key_path, path, name_checked_field=name_checked_field)
        elif isinstance(current, dict) and isinstance(value, dict):
            changes[key] = _merged(current, value)
        else:
            changes[key] = coerce_field(current, value, key_path, path)
    try:
        return dataclasses.replace(obj, **changes)
    except InputError as e:
        if where and e.field and not e.field.startswith(where):
            raise InputError(e.detail, path=path, field=f"{where}.{e.field}", allowed=e.allowed) from None
        raise
    except (TypeError, ValueError) as e:
        named = sorted((str(e).find(f), f) for f in names if f in str(e)) if name_checked_field else []
        field = (f"{where}.{named[0][1]}" if where else named[0][1]) if named else (where or None)
        raise InputError(str(e), path=path, field=field) from None


def _merged(current: dict, value: dict) -> dict:
    out = dict(current)
    for k, v in value.items():
        out[k] = _merged(out[k], v) if isinstance(out.get(k), dict) and isinstance(v, dict) else v
    return out


def split_set_items(items: list[str], flag: str = "--set") -> dict[str, str]:
    """`--set k=v` items (or another flag's, named in errors) -> {k: raw v} (values still text:
    each caller parses them as YAML)."""
    pairs: dict[str, str] = {}
    for item in items:
        if "=" not in item:
            raise InputError(f"expects key=value, got {item!r}", field=flag)
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
        value = safe_load_bounded(raw, f"--set {key}") if isinstance(raw, str) else raw
        node, parts = tree, key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise InputError(f"{key!r} is set both as a value and as a section", field=key)
        node[parts[-1]] = value
        if key == "cache.num_gpu_blocks":
            tree["derive_num_gpu_blocks"] = False
    return build_dataclass(cfg, tree, "", name_checked_field=True) if tree else cfg
