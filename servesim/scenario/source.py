"""Scenario YAML with line numbers, and `extends:` (deep merge).

PyYAML's `safe_load` forgets where each value came from, so we compose the node tree ourselves and
record, for every key path, the file and line of its key. Validation errors can then say
"scenarios/x.yaml, line 12, field 'cache.blok_size'" instead of "bad config".
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, ScalarNode, SequenceNode

from servesim.simulator.yaml_input import compose_bounded, read_text_bounded
from servesim.traces.errors import InputError

Path_ = tuple  # a key path inside the scenario tree, e.g. ("cache", "block_size")


@dataclass(slots=True, frozen=True)
class Mark:
    file: str  # the scenario file (or "--set" for command-line overrides)
    line: int | None  # 1-based line of the key


class Marks(dict):
    """Key path -> Mark. Lookups fall back to the nearest enclosing path that has a mark."""

    def near(self, path: Path_) -> Mark | None:
        path = tuple(path)
        while path:
            if path in self:
                return self[path]
            path = path[:-1]
        return self.get(())

    def error(self, message: str, path: Path_, *, allowed: str | None = None,
              field: str | None = None) -> InputError:
        mark = self.near(path)
        return InputError(message, path=mark.file if mark else None, line=mark.line if mark else None,
                          field=field if field is not None else dotted(path), allowed=allowed)


def dotted(path: Path_) -> str:
    return ".".join(str(p) for p in path)


def load_yaml(file: str | Path) -> tuple[dict, Marks]:
    """Parse one YAML file into plain data plus the mark of every key."""
    file = Path(file)
    text = read_text_bounded(file, "scenario")
    node = compose_bounded(text, str(file))
    marks = Marks({(): Mark(str(file), 1)})
    if node is None:
        return {}, marks
    data = _to_python(node, (), str(file), marks, SafeConstructor())
    if not isinstance(data, dict):
        raise InputError("a scenario must be a YAML mapping (key: value lines)", path=str(file), line=1)
    return data, marks


def _to_python(node, path: Path_, file: str, marks: Marks, ctor: SafeConstructor) -> Any:
    if isinstance(node, MappingNode):
        out: dict = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if not isinstance(key_node, ScalarNode):
                raise InputError("keys must be plain words", path=file, line=line, field=dotted(path))
            key = ctor.construct_object(key_node)
            if key == "<<":
                raise InputError("YAML merge keys (<<) are not supported; use `extends:`", path=file,
                                 line=line, field=dotted(path))
            if key in out:
                raise InputError(f"duplicate key {key!r}", path=file, line=line, field=dotted(path + (key,)))
            marks[path + (key,)] = Mark(file, line)
            out[key] = _to_python(value_node, path + (key,), file, marks, ctor)
        return out
    if isinstance(node, SequenceNode):
        items = []
        for i, item in enumerate(node.value):
            marks.setdefault(path + (i,), Mark(file, item.start_mark.line + 1))
            items.append(_to_python(item, path + (i,), file, marks, ctor))
        return items
    return ctor.construct_object(node)


def load_scenario_source(file: str | Path, _chain: tuple[Path, ...] = ()) -> tuple[dict, Marks]:
    """Load a scenario and everything it `extends:` (relative paths resolve against the file)."""
    file = Path(file).resolve()
    if file in _chain:
        cycle = " -> ".join(p.name for p in (*_chain, file))
        raise InputError(f"`extends:` cycle: {cycle}", path=str(file), field="extends")
    data, marks = load_yaml(file)
    parents = data.pop("extends", None)
    if parents is None:
        return data, marks
    if isinstance(parents, str):
        parents = [parents]
    if not isinstance(parents, list) or not all(isinstance(p, str) for p in parents):
        raise marks.error("expected a file name or a list of file names", ("extends",))
    merged, merged_marks = {}, Marks()
    for parent in parents:  # later parents override earlier ones, the file itself overrides all
        target = (file.parent / parent).resolve()
        if not target.is_file():
            raise marks.error(f"extended scenario {parent!r} not found (looked at {target})", ("extends",))
        p_data, p_marks = load_scenario_source(target, (*_chain, file))
        merged, merged_marks = deep_merge(_drop_replaced(merged, p_data), merged_marks, p_data, p_marks)
    return deep_merge(_drop_replaced(merged, data), merged_marks, data, marks)


def _drop_replaced(base: dict, over: dict) -> dict:
    """A `workload:` that names its source (trace, generator or bench) replaces the inherited workload
    instead of merging into it: a trace's options mean nothing to a generator and vice versa."""
    wl = over.get("workload")
    if isinstance(wl, dict) and ({"trace", "generator", "bench"} & set(wl)) and "workload" in base:
        return {k: v for k, v in base.items() if k != "workload"}
    return base


def deep_merge(base: dict, base_marks: Marks, over: dict, over_marks: Marks) -> tuple[dict, Marks]:
    """`over` on top of `base`: mappings merge key by key, anything else is replaced."""
    out = copy.deepcopy(base)

    def merge(dst: dict, src: dict) -> None:
        for key, value in src.items():
            if isinstance(value, dict) and isinstance(dst.get(key), dict):
                merge(dst[key], value)
            else:
                dst[key] = copy.deepcopy(value)

    merge(out, over)
    marks = Marks(base_marks)
    marks.update(over_marks)
    return out, marks
