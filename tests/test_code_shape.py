"""The house's small rooms, checked on the source (by its syntax tree; nothing is imported).

- A file is at most 400 lines (a file boundary is an ownership boundary: a file that grows past
  it holds more than one owner); the files still over it are listed, each to be split.
- A function (def line to last line, its decorators not counted) is at most 80 lines.
- A class lives in at most two files: its own and the files of the classes of ours it inherits
  from, contracts (Protocols, ABCs, interface classes) not counted. A mixin in another file
  counts, so a class put together from two mixins in two more files is three.
- A chain of our own classes is at most two deep below a contract or ``object``.

Each rule is also run on a small made-up tree that breaks it, so none of them can pass vacuously.
"""

from __future__ import annotations

import ast
import functools
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from servesim._layout import MAPPED_FOLDERS

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("scheduler", "simulator", "servesim", "traces", "gpu_runner", "tools", "benchmarks")
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 80
MAX_CLASS_FILES = 2
MAX_CHAIN_DEPTH = 2

# Classes exempt from the rules, each with its reason: none.
ALLOWED_CLASSES: frozenset[str] = frozenset()
# Classes allowed one level deeper (and one file more) than MAX_CHAIN_DEPTH, each with its reason;
# unlike ALLOWED_CLASSES this exempts neither their other rules nor their bases. The async P/D
# schedulers are native compiled classes (the compiled scheduler's calls on itself stay vtable
# calls), and mypyc takes a class's one native base as written: AsyncScheduler, itself below
# Scheduler; their stall behaviour is an object they own (simulator/cluster/pd_schedulers.py).
NATIVE_DEEP_CLASSES: frozenset[str] = frozenset({
    "servesim.simulator.cluster.pd_schedulers.PrefillAsyncScheduler",
    "servesim.simulator.cluster.pd_schedulers.DecodeAsyncScheduler",
})
# Files over MAX_FILE_LINES not yet split by ownership (an entry goes once its file is under).
LONG_FILES: frozenset[str] = frozenset({
    "scheduler/request.py", "scheduler/oracle_trace.py", "scheduler/scheduler.py",
    "simulator/cost_model/roofline.py", "simulator/fastpath/spec_runs.py", "tools/build_native.py",
})

_PROTOCOLS = frozenset({"typing.Protocol", "typing_extensions.Protocol", "abc.ABC"})


@dataclass(slots=True)
class _Module:
    name: str
    path: Path
    tree: ast.Module
    imports: dict[str, str] = field(default_factory=dict)  # local name -> dotted target
    classes: dict[str, ast.ClassDef] = field(default_factory=dict)  # qualname in the module -> node


def _module_name(root: Path, path: Path, mapped: tuple[str, ...]) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["servesim", *parts] if parts[0] in mapped else parts)


def _parse(root: Path, path: Path, mapped: tuple[str, ...]) -> _Module:
    mod = _Module(_module_name(root, path, mapped), path, ast.parse(path.read_text(), str(path)))
    package = mod.name if path.name == "__init__.py" else mod.name.rpartition(".")[0]
    for node in ast.walk(mod.tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: up level - 1 packages from this module's package
                up = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            mod.imports.update((a.asname or a.name, f"{base}.{a.name}") for a in node.names)
        elif isinstance(node, ast.Import):
            mod.imports.update((a.asname, a.name) if a.asname else (a.name.split(".")[0],) * 2
                               for a in node.names)

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                mod.classes[prefix + node.name] = node
                visit(node.body, f"{prefix}{node.name}.")

    visit(mod.tree.body, "")
    return mod


def _dotted(expr: ast.expr) -> str | None:
    if isinstance(expr, ast.Subscript):  # Generic[T], Protocol[T]
        expr = expr.value
    parts: list[str] = []
    while isinstance(expr, ast.Attribute):
        parts.append(expr.attr)
        expr = expr.value
    return ".".join([expr.id, *reversed(parts)]) if isinstance(expr, ast.Name) else None


class Classes:
    """Every class of the tree by dotted name, with its bases resolved through imports and
    re-exports; a base that resolves to no class of ours keeps its dotted name (typing.Protocol)."""

    def __init__(self, modules: dict[str, _Module]) -> None:
        self.modules = modules
        self.nodes = {f"{m.name}.{q}": (m, n) for m in modules.values() for q, n in m.classes.items()}
        self.bases = {q: [self._base(m, q, b) for b in n.bases] for q, (m, n) in self.nodes.items()}
        self._contracts = {q: self._is_contract(q) for q in self.nodes}

    def _base(self, mod: _Module, qual: str, expr: ast.expr) -> str:
        dotted = _dotted(expr) or "?"
        head, _, rest = dotted.partition(".")
        scope = qual[len(mod.name) + 1:].rpartition(".")[0]  # the enclosing class of a nested one
        if scope and f"{scope}.{head}" in mod.classes:
            target = f"{mod.name}.{scope}.{dotted}"
        elif head in mod.classes:
            target = f"{mod.name}.{dotted}"
        elif head in mod.imports:
            target = mod.imports[head] + (f".{rest}" if rest else "")
        else:
            target = dotted
        return self._resolve(target, set())

    def _resolve(self, dotted: str, seen: set[str]) -> str:
        module, _, attr = dotted.rpartition(".")
        mod = self.modules.get(module)
        if dotted in self.nodes or dotted in seen or mod is None or attr not in mod.imports:
            return dotted
        seen.add(dotted)
        return self._resolve(mod.imports[attr], seen)  # a re-export: follow it

    def is_contract(self, q: str) -> bool:
        return self._contracts[q]

    def _is_contract(self, q: str) -> bool:
        """A Protocol or an ABC (a direct subclass of either), or an interface class: every
        method it defines, dunders aside, only raises NotImplementedError (vLLM's abstract bases,
        written without abc)."""
        if any(b in _PROTOCOLS for b in self.bases[q]):
            return True
        methods = [n for n in self.nodes[q][1].body if isinstance(n, ast.FunctionDef)
                   and not (n.name.startswith("__") and n.name.endswith("__"))]
        return bool(methods) and all(_only_raises_not_implemented(f) for f in methods)

    def own_bases(self, q: str) -> list[str]:
        """Bases that are classes of ours and not contracts."""
        return [b for b in self.bases[q] if b in self.nodes and not self.is_contract(b)]

    def ancestors(self, q: str, stop: frozenset[str] = frozenset()) -> list[str]:
        """Own bases, transitively; a class in ``stop`` is included but not looked through."""
        out: list[str] = []
        for b in self.own_bases(q):
            out += [b] if b in stop else [b, *self.ancestors(b, stop)]
        return out

    def depth(self, q: str, stop: frozenset[str] = frozenset()) -> int:
        """1 for a class with no own bases; a class in ``stop`` counts as 1."""
        if q in stop:
            return 1
        return 1 + max((self.depth(b, stop) for b in self.own_bases(q)), default=0)


def _only_raises_not_implemented(fn: ast.FunctionDef) -> bool:
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    return len(body) == 1 and isinstance(body[0], ast.Raise) and body[0].exc is not None and \
        _dotted(body[0].exc.func if isinstance(body[0].exc, ast.Call) else body[0].exc) == "NotImplementedError"


def load(root: Path, folders: tuple[str, ...] = FOLDERS, mapped: tuple[str, ...] = MAPPED_FOLDERS) -> Classes:
    modules = {}
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            if "__pycache__" not in path.parts:
                mod = _parse(root, path, mapped)
                modules[mod.name] = mod
    return Classes(modules)


def _allowed(classes: Classes, allowed: frozenset[str]) -> frozenset[str]:
    """The allow-listed classes and every class of ours they inherit from (their mixins)."""
    out = set(allowed)
    for q in allowed & classes.nodes.keys():
        out.update(classes.ancestors(q))
    return frozenset(out)


def line_counts(root: Path, folders: tuple[str, ...] = FOLDERS) -> dict[str, int]:
    """Lines of each source file, by its path under root."""
    return {path.relative_to(root).as_posix(): len(path.read_text().splitlines())
            for folder in folders for path in sorted((root / folder).rglob("*.py"))
            if "__pycache__" not in path.parts}


def long_files(counts: dict[str, int], allowed: frozenset[str] = LONG_FILES) -> list[str]:
    """``path (n lines)`` of each file over the limit, the listed ones aside."""
    return [f"{p} ({n} lines)" for p, n in counts.items() if n > MAX_FILE_LINES and p not in allowed]


def long_functions(classes: Classes, allowed: frozenset[str] = ALLOWED_CLASSES) -> list[str]:
    """``path:line name (n lines)`` of each function over the limit, methods of allowed classes aside."""
    exempt = {id(classes.nodes[q][1]) for q in _allowed(classes, allowed)}
    out = []
    for mod in classes.modules.values():
        skip = {id(f) for c in ast.walk(mod.tree) if id(c) in exempt for f in ast.walk(c)}
        for node in ast.walk(mod.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and id(node) not in skip:
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    out.append(f"{mod.path}:{node.lineno} {node.name} ({lines} lines)")
    return out


def spread_classes(classes: Classes, allowed: frozenset[str] = ALLOWED_CLASSES,
                   deeper: frozenset[str] = NATIVE_DEEP_CLASSES) -> list[str]:
    """Classes in more than two files or more than two deep; allowed classes (and their mixins)
    aside, and not looked through when a class of ours inherits from one; a class in `deeper` may
    be one deeper and in one file more."""
    stop = frozenset(allowed & classes.nodes.keys())
    exempt = _allowed(classes, allowed)
    out = []
    for q in sorted(classes.nodes.keys() - exempt):
        if classes.is_contract(q):
            continue
        files = {classes.nodes[a][0].path for a in [q, *classes.ancestors(q, stop)]}
        depth = classes.depth(q, stop)
        extra = 1 if q in deeper else 0
        if len(files) > MAX_CLASS_FILES + extra or depth > MAX_CHAIN_DEPTH + extra:
            out.append(f"{q}: {len(files)} files, {depth} deep (bases {classes.own_bases(q)})")
    return out


@functools.cache
def _repository() -> Classes:
    return load(ROOT)  # parsed once for the three tests below (~1 s)


def test_no_file_over_400_lines():
    assert long_files(line_counts(ROOT)) == []


def test_the_long_file_list_names_files_still_over_the_limit():
    """So a file split under the limit leaves the list (and is checked from then on)."""
    counts = line_counts(ROOT)
    assert sorted(p for p in LONG_FILES if counts.get(p, 0) <= MAX_FILE_LINES) == []


def test_no_function_over_80_lines():
    assert long_functions(_repository()) == []


def test_no_class_over_two_files_or_two_deep():
    assert spread_classes(_repository()) == []


def test_the_allow_list_names_classes_that_exist():
    """So an entry cannot outlive its class unnoticed (a renamed class would be checked again)."""
    assert ALLOWED_CLASSES | NATIVE_DEEP_CLASSES <= _repository().nodes.keys()


# ---- the checks themselves, on a made-up tree that breaks each rule ----------------------------
def _tree(tmp_path: Path, files: dict[str, str]) -> Classes:
    for name, text in files.items():
        path = tmp_path / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return load(tmp_path, ("pkg",), ("pkg",))


def _function(name: str, num_lines: int, indent: str = "") -> str:
    """A def of exactly ``num_lines`` lines."""
    body = "".join(f"{indent}    x{i} = {i}\n" for i in range(num_lines - 1))
    return f"{indent}def {name}():\n{body}\n"


def test_a_long_file_is_found(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "ok.py").write_text("x = 1\n" * MAX_FILE_LINES)
    (tmp_path / "pkg" / "long.py").write_text("x = 1\n" * (MAX_FILE_LINES + 1))
    counts = line_counts(tmp_path, ("pkg",))
    assert long_files(counts, frozenset()) == [f"pkg/long.py ({MAX_FILE_LINES + 1} lines)"]
    assert long_files(counts, frozenset({"pkg/long.py"})) == []


def test_a_long_function_is_found(tmp_path):
    classes = _tree(tmp_path, {"__init__.py": "", "a.py": _function("ok", 80) + _function("too_long", 81)
                               + "class C:\n" + _function("method", 81, "    ")})
    found = long_functions(classes, frozenset())
    assert [f.split(" ", 1)[1] for f in found] == ["too_long (81 lines)", "method (81 lines)"]
    assert len(long_functions(classes, frozenset({"servesim.pkg.a.C"}))) == 1  # an allowed class's method


def test_a_class_from_mixins_in_other_files_and_a_deep_chain_are_found(tmp_path):
    classes = _tree(tmp_path, {
        "__init__.py": "from .m1 import M1 as Exported\n",
        "m1.py": "class M1:\n    def f(self):\n        return 1\n",
        "m2.py": "class M2:\n    def g(self):\n        return 2\n",
        "c.py": """\
            import typing
            from . import Exported
            from .m2 import M2
            from .iface import Iface

            class Spread(Exported, M2):  # three files
                pass

            class Two(M2):  # two files
                pass

            class Contract(typing.Protocol):
                def f(self) -> int: ...

            class A(Iface):  # the interface is a contract: not counted
                def f(self): ...

            class B(A):
                pass

            class Deep(B):  # A, B, Deep: three deep
                pass
            """,
        "iface.py": """\
            class Iface:
                __slots__ = ()

                def f(self):
                    '''A contract.'''
                    raise NotImplementedError

                def __bool__(self):
                    return True
            """,
    })
    assert classes.bases["servesim.pkg.c.Spread"] == ["servesim.pkg.m1.M1", "servesim.pkg.m2.M2"]
    assert classes.is_contract("servesim.pkg.iface.Iface") and not classes.is_contract("servesim.pkg.c.A")
    found = [f.split(":")[0] for f in spread_classes(classes, frozenset())]
    assert found == ["servesim.pkg.c.Deep", "servesim.pkg.c.Spread"]
    # an allowed class is neither checked nor looked through
    assert [f.split(":")[0] for f in spread_classes(classes, frozenset({"servesim.pkg.c.B"}))] == \
        ["servesim.pkg.c.Spread"]
    # a class allowed one level deeper is checked at that depth, and nothing else is exempted
    assert [f.split(":")[0] for f in spread_classes(classes, frozenset(), frozenset({"servesim.pkg.c.Deep"}))] == \
        ["servesim.pkg.c.Spread"]
    assert [f.split(":")[0] for f in spread_classes(classes, frozenset(), frozenset({"servesim.pkg.c.B"}))] == \
        ["servesim.pkg.c.Deep", "servesim.pkg.c.Spread"]
