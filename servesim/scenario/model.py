"""Load a scenario: read (with `extends:`), apply `--set`, expand the sweep, validate every variant.

Everything here happens before anything runs. An unknown key anywhere stops the whole scenario;
an impossible value that only some sweep points have marks just those variants as failed (they are
reported, and the rest still run); if no variant is valid the first error is raised.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from servesim.scenario.schema import SCENARIO_KEYS, SchemaError, build_sim_config, field_names, unknown_key
from servesim.scenario.source import Mark, Marks, load_scenario_source
from servesim.scenario.sweep import Axis, apply_point, apply_sets, expand, parse_sets, parse_sweep, set_path
from servesim.scenario.workload import WorkloadSpec, parse_workload
from servesim.simulator.config import SimConfig, to_dict
from servesim.traces.errors import InputError

RESULT_VERSION = 1  # bump when a change makes old variant results stale (part of every hash)


@dataclass(slots=True)
class Variant:
    index: int  # position in sweep order
    params: dict[str, Any]  # swept values of this variant: dotted key -> value
    cfg: SimConfig | None  # None when the variant is invalid
    workload: WorkloadSpec | None
    error: str | None = None  # validation error: the variant is reported, never run
    key: str = ""  # hash of the resolved configuration (the result folder's identity)
    name: str = ""  # result folder name: readable parameters + hash

    def resolved(self, scenario: Scenario) -> dict[str, Any]:
        """This variant as a stand-alone scenario (saved as variant.yaml next to the results):
        `servesim run variant.yaml` reproduces it, and loads to the same hash."""
        out: dict[str, Any] = {"name": scenario.name, "description": f"variant: {_describe(self.params) or 'base'}"}
        if self.cfg is None:
            return out
        sim = to_dict(self.cfg)
        if self.cfg.derive_num_gpu_blocks:
            sim["cache"].pop("num_gpu_blocks")  # derived from GPU memory at run time
        reps = {"replicates": scenario.base["replicates"]} if "replicates" in scenario.base else {}
        return {**out, "workload": _plain(self.workload.to_scenario()), **reps, **sim}


@dataclass(slots=True)
class Scenario:
    name: str
    description: str
    source: str | None  # the scenario file (None for a dict)
    axes: list[Axis]
    variants: list[Variant]
    smoke: bool = False
    notes: list[str] = field(default_factory=list)  # e.g. "--set pins a swept key"
    base: dict[str, Any] = field(default_factory=dict)  # the tree after extends and --set, sweep aside
    # `replicates:` (servesim/replicates.py): each variant run over this many derived seeds and
    # cost-model draws, its summary the mean with intervals (docs/UNCERTAINTY.md)
    replicates: int = 1
    perturb_cost_model: bool = True

    def tree(self) -> dict[str, Any]:
        """The scenario as resolved (extends merged, --set applied), sweep included."""
        sweep: dict[str, Any] = {}
        zips = [a for a in self.axes if len(a.keys) > 1]
        for axis in self.axes:
            if len(axis.keys) == 1:
                sweep[axis.keys[0]] = [p[0] for p in axis.points]
        if zips:
            sweep["zip"] = [{k: [p[i] for p in a.points] for i, k in enumerate(a.keys)} for a in zips]
        out = {"name": self.name, "description": self.description, **_plain(self.base)}
        return {**out, "sweep": _plain(sweep)} if sweep else out

    @property
    def failed(self) -> list[Variant]:
        return [v for v in self.variants if v.error is not None]


def load_scenario(src: str | Path | dict, sets: list[str] | dict | None = None, smoke: bool = False) -> Scenario:
    if isinstance(src, dict):
        data, marks, source = copy.deepcopy(src), Marks({(): Mark("<scenario dict>", None)}), None
        data.pop("extends", None)
    else:
        from servesim.scenario.library import resolve_scenario

        src = resolve_scenario(src)  # a file, or a name of the shipped library
        data, marks = load_scenario_source(src)
        source = str(Path(src).resolve())
    _check_top_level(data, marks)
    axes = parse_sweep(data.pop("sweep", None), marks)
    axes, notes = apply_sets(data, marks, axes, parse_sets(sets))
    smoke_sets = data.pop("smoke", None) or {}
    if smoke and smoke_sets:
        if not isinstance(smoke_sets, dict):
            raise marks.error("expected a mapping of dotted keys to values", ("smoke",))
        for key, value in smoke_sets.items():
            set_path(data, key, value)
            marks[tuple(key.split("."))] = marks.near(("smoke", key))
    default_name = Path(source).stem if source else "scenario"
    name = _check_name(data.pop("name", default_name), marks)
    description = str(data.pop("description", ""))
    replicates, perturb = _replicates(data.get("replicates", 1), marks)
    extra_key = {"replicates": [replicates, perturb]} if replicates > 1 else {}  # 1: the plain run's hash
    built = [_variant(i, data, marks, combo, smoke, extra_key) for i, combo in enumerate(expand(axes))]
    if all(exc is not None for _, exc in built):
        raise built[0][1]  # nothing could run: this is an error in the scenario, not in a variant
    variants = [v for v, _ in built]
    return Scenario(name, description, source, axes, variants, smoke, notes, copy.deepcopy(data), replicates, perturb)


def _replicates(value: Any, marks: Marks) -> tuple[int, bool]:
    """`replicates: N` or `replicates: {num_replicates: N, perturb_cost_model: BOOL}`."""
    from servesim.replicate_summary import replicate_setting

    try:
        return replicate_setting(value, "replicates")
    except InputError as exc:
        raise marks.error(exc.detail, ("replicates",), allowed=exc.allowed) from None


SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+=,-]{0,99}")


def _check_name(name: Any, marks: Marks) -> str:
    """The default output folder is runs/<name>: a name must stay one folder inside runs/."""
    text = str(name)
    if not SAFE_NAME.fullmatch(text) or ".." in text:
        raise marks.error(f"scenario name {text!r} cannot be a folder name inside runs/", ("name",),
                          allowed="1-100 letters, digits and . _ + = , - (no '/', no '..', not starting with '.')")
    return text


def _check_top_level(data: dict, marks: Marks) -> None:
    valid = [*SCENARIO_KEYS, *field_names(SimConfig)]
    for key in data:
        if key not in valid:
            raise unknown_key(key, valid, (), marks)
    if "workload" not in data:
        raise marks.error("a scenario needs a `workload:` section (trace: FILE, generator: NAME or bench: {...})", ())


def _resolve(data: dict, marks: Marks, combo, smoke: bool) -> tuple[dict, SimConfig, WorkloadSpec]:
    vdata, vmarks, params = apply_point(data, marks, combo)
    try:
        cfg = build_sim_config(vdata, vmarks)
        wl = parse_workload(vdata.get("workload"), cfg.seed, vmarks)
    except SchemaError:
        raise
    except InputError as exc:
        if params:
            raise InputError(f"{exc.detail} [sweep point: {_describe(params)}]", path=exc.path, line=exc.line,
                             field=exc.field, allowed=exc.allowed) from None
        raise
    return params, cfg, wl.smoke() if smoke else wl


def _variant(index: int, data: dict, marks: Marks, combo, smoke: bool,
             extra_key: dict | None = None) -> tuple[Variant, InputError | None]:
    params = {key: value for axis, i in combo for key, value in zip(axis.keys, axis.points[i])}
    try:
        params, cfg, wl = _resolve(data, marks, combo, smoke)
    except SchemaError:
        raise
    except InputError as exc:
        key = _hash({"invalid": _plain(params), "smoke": smoke})
        return Variant(index, params, None, None, str(exc), key, _folder(params, key)), exc
    key = _hash({"version": RESULT_VERSION, "sim": to_dict(cfg), "workload": wl.to_dict(), **(extra_key or {})})
    return Variant(index, params, cfg, wl, None, key, _folder(params, key)), None


def _hash(obj: Any) -> str:
    text = json.dumps(_plain(obj), sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _plain(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


def _describe(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={_short(v)}" for k, v in params.items())


def _short(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_short(v) for v in value) + "]"
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def _folder(params: dict[str, Any], key: str) -> str:
    """Readable and unique: "block_size=16_policy=fcfs-3f2a9c1d0b4e"."""
    slug = "_".join(f"{k.rsplit('.', 1)[-1]}={_short(v) if v != [] else 'none'}" for k, v in params.items())
    slug = slug or "run"
    slug = re.sub(r"[^A-Za-z0-9_.=,+-]+", "", slug)[:60]
    return f"{slug}-{key}"


describe_params = _describe


def short_label(params: dict[str, Any]) -> str:
    """"block_size=16, policy=fcfs": the last part of each key (for tables and legends)."""
    return ", ".join(f"{k.rsplit('.', 1)[-1]}={_short(v)}" for k, v in params.items())
