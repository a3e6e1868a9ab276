"""`sweep:` — dotted keys with lists of values (grid product), and `zip:` groups of paired keys.

    sweep:
      cache.block_size: [16, 32, 64]            # an axis
      zip:                                      # one axis whose points set several keys at once
        scheduler.num_spec_tokens: [0, 3]
        spec_decode.acceptance: [[], [0.8, 0.7, 0.6]]

`zip:` may also be a list of such groups. Variants are the product of all axes, the first axis
varying slowest. `--set` on the command line pins a swept key (its axis goes away) or, written
`--set sweep.KEY=[...]`, replaces an axis's values.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass
from typing import Any


from servesim.overrides import split_set_items
from servesim.scenario.source import Mark, Marks
from servesim.simulator.yaml_input import safe_load_bounded
from servesim.traces.errors import InputError

RESERVED = ("sweep", "smoke", "name", "description", "extends")


@dataclass(slots=True)
class Axis:
    keys: tuple[str, ...]  # dotted paths; more than one for a zip group
    points: list[tuple[Any, ...]]  # one value per key, per point
    marks: tuple[tuple, ...]  # where each key was written (a path into marks)

    @property
    def name(self) -> str:
        return " + ".join(self.keys)


def parse_sweep(raw: Any, marks: Marks) -> list[Axis]:
    if raw is None:
        return []
    if not isinstance(raw, dict):
        raise marks.error("expected a mapping of dotted keys to lists of values", ("sweep",))
    axes = []
    for key, values in raw.items():
        if key == "zip":
            groups = values if isinstance(values, list) else [values]
            for i, group in enumerate(groups):
                where = ("sweep", "zip", i) if isinstance(values, list) else ("sweep", "zip")
                axes.append(_zip_axis(group, where, marks))
            continue
        _check_key(key, ("sweep", key), marks)
        if not isinstance(values, list) or not values:
            raise marks.error(f"sweep values must be a non-empty list, got {values!r:.60}", ("sweep", key))
        axes.append(Axis((key,), [(v,) for v in values], (("sweep", key),)))
    for axis in axes:  # a repeated point would run twice into the same result folder
        texts = [repr(p) for p in axis.points]
        dup = next((t for t in texts if texts.count(t) > 1), None)
        if dup is not None:
            raise marks.error(f"{axis.name}: the point {dup} is listed twice", axis.marks[0])
    seen: set[str] = set()
    for axis in axes:
        for key in axis.keys:
            if key in seen:
                raise marks.error(f"{key!r} is swept twice", ("sweep",))
            seen.add(key)
    return axes


def _zip_axis(group: Any, where: tuple, marks: Marks) -> Axis:
    if not isinstance(group, dict) or not group:
        raise marks.error("a zip group is a mapping of dotted keys to equally long lists", where)
    lengths = set()
    for key, values in group.items():
        _check_key(key, where + (key,), marks)
        if not isinstance(values, list) or not values:
            raise marks.error("zip values must be a non-empty list", where + (key,))
        lengths.add(len(values))
    if len(lengths) > 1:
        sizes = ", ".join(f"{k}: {len(v)}" for k, v in group.items())
        raise marks.error(f"zip lists differ in length ({sizes})", where, allowed="lists of equal length")
    keys = tuple(group)
    points = list(zip(*(group[k] for k in keys)))
    return Axis(keys, points, tuple(where + (k,) for k in keys))


def _check_key(key: Any, where: tuple, marks: Marks) -> None:
    if not isinstance(key, str) or not key or key.split(".")[0] in RESERVED:
        raise marks.error(f"cannot sweep {key!r}", where, allowed="a dotted configuration key, e.g. cache.block_size")


def expand(axes: list[Axis]) -> list[list[tuple[Axis, int]]]:
    """Every combination of one point per axis (first axis slowest); one empty combo if no axes."""
    return [list(zip(axes, combo)) for combo in itertools.product(*(range(len(a.points)) for a in axes))]


def set_path(data: dict, dotted_key: str, value: Any) -> None:
    """data[a][b][c] = value for "a.b.c", creating mappings on the way."""
    parts = dotted_key.split(".")
    node = data
    for i, part in enumerate(parts[:-1]):
        if not isinstance(node.get(part), dict):
            if part in node and node[part] is not None:
                raise InputError(f"cannot set {dotted_key!r}: {'.'.join(parts[:i + 1])} is not a mapping",
                                 field=dotted_key)
            node[part] = {}
        node = node[part]
    node[parts[-1]] = copy.deepcopy(value)


def apply_point(data: dict, marks: Marks, combo: list[tuple[Axis, int]]) -> tuple[dict, Marks, dict]:
    """The variant's tree and marks, and its swept parameters (dotted key -> value)."""
    data, marks = copy.deepcopy(data), Marks(marks)
    params: dict[str, Any] = {}
    for axis, i in combo:
        for key, value, where in zip(axis.keys, axis.points[i], axis.marks):
            set_path(data, key, value)
            marks[tuple(key.split("."))] = marks.near(where)
            params[key] = value
    return data, marks, params


def parse_sets(items: list[str] | dict[str, Any] | None) -> dict[str, Any]:
    """`--set k=v` items (values parsed as YAML), or a dict given through the API."""
    if not items:
        return {}
    if isinstance(items, dict):
        return dict(items)
    out = {}
    for key, raw in split_set_items(items).items():
        try:
            out[key] = safe_load_bounded(raw)
        except InputError as exc:
            raise InputError(f"cannot parse the value of --set {key}: {exc}", field=key) from None
    return out


def apply_sets(data: dict, marks: Marks, axes: list[Axis], sets: dict[str, Any]) -> tuple[list[Axis], list[str]]:
    """Apply overrides to the base tree in place; return the remaining axes and notes for the user."""
    notes = []
    axes = list(axes)
    for key, value in sets.items():
        mark = Mark("--set", None)
        if key.startswith("sweep."):
            axis_key = key[len("sweep."):]
            _check_key(axis_key, ("sweep",), marks)
            if not isinstance(value, list) or not value:
                raise InputError(f"--set {key} needs a non-empty list, e.g. [16, 32]", path="--set", field=key)
            marks[("sweep", axis_key)] = mark
            new = Axis((axis_key,), [(v,) for v in value], (("sweep", axis_key),))
            at = next((i for i, a in enumerate(axes) if a.keys == (axis_key,)), None)
            axes = axes[:at] + [new] + axes[at + 1:] if at is not None else [*axes, new]  # keep its place
            continue
        for axis in axes:
            if key in axis.keys and len(axis.keys) > 1:
                raise InputError(f"{key!r} is part of the zip group {axis.name}; override the group in the file",
                                 path="--set", field=key)
            if axis.keys == (key,):
                notes.append(f"--set {key}={value!r} pins a swept key (axis removed)")
        axes = [a for a in axes if a.keys != (key,)]
        if key.split(".")[0] in RESERVED:
            raise InputError(f"cannot --set {key!r}", path="--set", field=key)
        set_path(data, key, value)
        marks[tuple(key.split("."))] = mark
    return axes, notes
