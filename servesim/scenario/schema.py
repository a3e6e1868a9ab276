"""The scenario schema is the configuration dataclasses themselves: a YAML section is valid when its
keys are the fields of the matching dataclass and its values have the fields' types.

Two kinds of error, because they are handled differently in a sweep:
  * `SchemaError` (an unknown key): the file is wrong for every variant, so nothing runs;
  * any other `InputError` (wrong type, impossible value): only the variants with that value fail.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from functools import cache
from pathlib import Path
from typing import Any

from servesim.scenario.source import Marks, dotted
from servesim.simulator.config import SimConfig
from servesim.scheduler.registry import did_you_mean, unknown_name_message
from servesim.traces.errors import InputError
from servesim.traces.synthetic_config import dataclass_in

# Scenario-level keys besides the SimConfig fields.
SCENARIO_KEYS = ("name", "description", "workload", "sweep", "smoke", "replicates")


class SchemaError(InputError):
    """An unknown key: structural, reported before anything runs, whatever the sweep."""


def unknown_key(key: Any, valid: list[str], path: tuple, marks: Marks) -> SchemaError:
    near = difflib.get_close_matches(str(key), valid, n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(near)}?" if near else ""
    where = f" in '{dotted(path)}'" if path else " at the top level"
    mark = marks.near(path + (key,))
    return SchemaError(f"unknown key {key!r}{where}{hint}", path=mark.file if mark else None,
                       line=mark.line if mark else None, field=dotted(path + (key,)),
                       allowed=", ".join(valid))


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def check_keys(data: dict, cls: type, path: tuple, marks: Marks) -> None:
    """Every key of `data` (recursively) must be a field of `cls`; values that are not mappings
    (e.g. a bare number for a distribution) are left to the dataclass to judge."""
    if not isinstance(data, dict):
        return  # the type check reports it
    valid = field_names(cls)
    for key, value in data.items():
        if key not in valid:
            raise unknown_key(key, valid, path, marks)
        sub = dataclass_in(_hints(cls)[key])
        if sub is not None and isinstance(value, dict):
            check_keys(value, sub, path + (key,), marks)


def convert(value: Any, hint: Any, path: tuple, marks: Marks) -> Any:
    """Check `value` against a type hint; return it in canonical form (floats, tuples)."""
    ok, out = _convert(value, hint)
    if not ok:
        raise marks.error(f"expected {_type_name(hint)}, got {value!r}", path)
    return out


def _convert(value: Any, hint: Any) -> tuple[bool, Any]:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True, value
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            ok, out = _convert(value, arg)
            if ok:
                return True, out
        return False, value
    if hint is type(None):
        return value is None, value
    if hint is bool:
        return isinstance(value, bool), value
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        return ok, float(value) if ok else value
    if hint is str:
        return isinstance(value, str), value
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            return False, value
        item = args[0] if args else Any
        items = [_convert(v, item) for v in value]
        return all(ok for ok, _ in items), tuple(v for _, v in items)
    if origin is dict or hint is dict:
        return isinstance(value, dict), value
    return True, value  # dataclasses are built by the caller


def _type_name(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in args)
    if hint is type(None):
        return "null"
    if origin in (tuple, list):
        return f"a list of {_type_name(args[0]) if args else 'values'}"
    if origin is dict or hint is dict:
        return "a mapping"
    if dataclasses.is_dataclass(hint):
        return f"a mapping (keys of {hint.__name__})"
    return {bool: "true/false", int: "an integer", float: "a number", str: "a string"}.get(hint, str(hint))


def build(default: Any, data: Any, path: tuple, marks: Marks) -> Any:
    """A copy of the dataclass instance `default` with the fields in `data` set and validated."""
    cls = type(default)
    if not isinstance(data, dict):
        raise marks.error(f"expected a mapping (keys of {cls.__name__}), got {data!r:.60}", path,
                          allowed=", ".join(field_names(cls)))
    hints, kwargs = _hints(cls), {}
    for key, value in data.items():
        if key not in hints:
            raise unknown_key(key, field_names(cls), path, marks)
        sub = dataclass_in(hints[key])
        if sub is not None and value is not None:
            kwargs[key] = build(getattr(default, key), value, path + (key,), marks)
        else:
            kwargs[key] = convert(value, hints[key], path + (key,), marks)
    try:
        return dataclasses.replace(default, **kwargs)
    except (ValueError, TypeError) as exc:  # InputError is a ValueError
        raise _blame(exc, data, path, marks) from None


def _blame(exc: Exception, data: dict, path: tuple, marks: Marks) -> InputError:
    """Point a constructor's complaint at the key it is about (its `field`, or a key it names)."""
    detail = exc.detail if isinstance(exc, InputError) else str(exc)
    allowed = exc.allowed if isinstance(exc, InputError) else None
    named = getattr(exc, "field", None) or ""
    parts = tuple(named.split(".")) if named else ()
    if parts and _has_path(data, parts):  # e.g. SimConfig's "spec_decode.acceptance"
        return marks.error(detail, path + parts, allowed=allowed)
    key = parts[-1] if parts else None
    if key not in data:  # the scheduler's ValueErrors name the field in the message
        key = next((k for k in data if str(k) in detail), None)
    target = path + (key,) if key is not None else path
    return marks.error(detail, target, allowed=allowed)


def _has_path(data: Any, parts: tuple) -> bool:
    for part in parts:
        if not isinstance(data, dict) or part not in data:
            return False
        data = data[part]
    return True


def build_sim_config(data: dict, marks: Marks) -> SimConfig:
    """SimConfig from the scenario's top-level sections (workload/sweep/... are ignored here)."""
    sections = {k: v for k, v in data.items() if k not in SCENARIO_KEYS}
    explicit_blocks = isinstance(sections.get("cache"), dict) and "num_gpu_blocks" in sections["cache"]
    if explicit_blocks:
        if sections.get("derive_num_gpu_blocks") is True:
            raise marks.error("cache.num_gpu_blocks is set, so it cannot also be derived from GPU memory",
                              ("derive_num_gpu_blocks",), allowed="drop one of the two")
        sections["derive_num_gpu_blocks"] = False  # an explicit pool size wins, as with --set
    _paths_near_their_files(sections, marks)
    cfg = build(SimConfig(), sections, (), marks)
    check_feasible(cfg, marks)
    return cfg


def _paths_near_their_files(sections: dict, marks: Marks) -> None:
    """hardware.model (a config.json) and the files of cost_model.params (a fitted model, host
    collectives: PARAM_FILES) relative to the scenario file that wrote each, as trace paths are;
    --set values stay as given."""
    from servesim.simulator.cluster.config import PARAM_FILES
    from servesim.simulator.specs.models import file_near, model_path_near

    files = [(("cost_model", "params", key), file_near) for key in PARAM_FILES]
    for keys, near in [(("hardware", "model"), model_path_near), *files]:
        mark = marks.near(keys)
        if mark is None or mark.line is None:
            continue
        parent = sections  # copied along the way: the scenario's own mappings stay as read
        for key in keys[:-1]:
            child = parent.get(key)
            if not isinstance(child, dict):
                break
            parent[key] = parent = dict(child)
        else:
            if keys[-1] in parent:
                parent[keys[-1]] = near(parent[keys[-1]], Path(mark.file).parent)


def check_feasible(cfg: SimConfig, marks: Marks) -> None:
    """What only a scenario can name by line: engine and cost model availability. vLLM's start-up
    refusals (pool, budget, max_model_len, ...) already ran when SimConfig was built
    (simulator/startup.py), the same checks `--set` and the Python API get."""
    from servesim.simulator.cost_model import available_cost_models, run_cost_model
    from servesim.simulator.scheduler_kinds import available_engines

    if cfg.engine not in available_engines():
        guess = did_you_mean(cfg.engine, available_engines())
        raise marks.error(f"engine {cfg.engine!r} is not available here" + (f"; did you mean {guess!r}?" if guess else ""),
                          ("engine",),
                          allowed=", ".join(available_engines()))
    if cfg.cost_model.name not in available_cost_models():
        raise marks.error(unknown_name_message("cost model", cfg.cost_model.name, available_cost_models()),
                          ("cost_model", "name"),
                          allowed=", ".join(available_cost_models()))
    try:
        run_cost_model(cfg)
    except InputError as exc:
        raise marks.error(exc.detail, ("cost_model",), allowed=exc.allowed) from None
