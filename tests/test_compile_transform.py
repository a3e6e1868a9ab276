"""The compiled build's source transform: explicit dataclass __init__ methods equal dataclasses' own.

tools/build_native.py writes an __init__ into each dataclass of a compiled module (mypyc then
compiles it instead of calling the interpreted one dataclasses generates). Each transformed class
must construct exactly what the original does: same fields in the same order, same defaults, a
fresh object from each default factory, __post_init__ run. A frozen dataclass gets one too: its
assignments are native attribute stores once compiled (no __setattr__), checked here with the
frozen guard lifted.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import build_native  # noqa: E402

MODULES = build_native.listed_modules()  # every compiled module, e.g. 'scheduler/kv/block.py'


def _transformed(rel: str) -> tuple[types.ModuleType, types.ModuleType]:
    name = "servesim." + rel.removesuffix(".py").replace("/", ".")
    original = importlib.import_module(name)
    source = (ROOT / rel).read_text()
    module = types.ModuleType(name + "_transformed")
    module.__dict__["__name__"] = name  # dataclasses resolve string annotations through sys.modules
    exec(compile(build_native.native_dataclass_inits(source), rel, "exec"), module.__dict__)
    return original, module


def _classes(module) -> list[type]:
    return [c for c in vars(module).values() if isinstance(c, type) and dataclasses.is_dataclass(c)
            and c.__module__ == module.__name__]


@pytest.mark.parametrize("rel", MODULES)
def test_each_dataclass_init_matches_the_generated_one(rel):
    original, module = _transformed(rel)
    for cls in _classes(original):
        new = getattr(module, cls.__name__)
        params = inspect.signature(cls).parameters
        assert list(inspect.signature(new).parameters) == list(params), cls
        required = {n: object() for n, p in params.items() if p.default is inspect.Parameter.empty}
        if cls.__name__ == "SamplingParams":  # __post_init__ validates: give it valid values
            required = {}
        try:
            want = cls(**required)
        except (TypeError, ValueError):  # a __post_init__ rejecting the placeholders: skip the class
            continue
        if new.__dataclass_params__.frozen:
            # The written __init__ assigns the fields, which compiled code does directly (a native
            # attribute); run here as Python, the frozen class's own __setattr__ would refuse it.
            new.__setattr__ = object.__setattr__
        got = new(**required)
        for f in dataclasses.fields(cls):
            a, b = getattr(want, f.name), getattr(got, f.name)
            assert a is b or a == b, (cls, f.name)
            if f.default_factory is not dataclasses.MISSING:  # a fresh object per instance
                assert getattr(new(**required), f.name) is not b


def test_only_classes_dataclasses_would_give_an_init_are_changed():
    src = (
        "from __future__ import annotations\n"
        "from dataclasses import dataclass, field\n"
        "@dataclass(slots=True, frozen=True)\nclass Frozen:\n    a: int\n"
        "@dataclass(slots=True)\nclass Own:\n    a: int\n    def __init__(self) -> None:\n        self.a = 1\n"
        "@dataclass(slots=True)\nclass Plain:\n    a: int\n    b: list[int] = field(default_factory=list)\n"
    )
    out = build_native.native_dataclass_inits(src)
    assert out.count("def __init__") == 3 and out.count("init=False") == 2
    assert "self.a = a  # type: ignore[misc]" in out  # only the frozen class's: mypy knows it read-only
    assert out.count("type: ignore") == 1
    ns: dict = {}
    exec(out, ns)
    assert ns["Plain"](3).b == [] and ns["Plain"](3, [1]).b == [1]
    with pytest.raises(dataclasses.FrozenInstanceError):  # interpreted, still frozen
        ns["Frozen"](1)


def test_a_compiled_module_must_defer_its_annotations():
    # The marker is imported under TYPE_CHECKING: annotations naming it must never be evaluated.
    with pytest.raises(build_native.BuildError, match="from __future__ import annotations"):
        build_native.mark_subclassable("class A:\n    pass\n")
