"""`--set a.b=c`: override any field of the configuration tree by its dotted path."""

from __future__ import annotations

from typing import Any

import yaml

from servesim.simulator.config_values import build_dataclass
from servesim.traces.errors import InputError


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
        value = yaml.safe_load(raw) if isinstance(raw, str) else raw
        node, parts = tree, key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise InputError(f"{key!r} is set both as a value and as a section", field=key)
        node[parts[-1]] = value
        if key == "cache.num_gpu_blocks":
            tree["derive_num_gpu_blocks"] = False
    return build_dataclass(cfg, tree, "", name_checked_field=True) if tree else cfg
