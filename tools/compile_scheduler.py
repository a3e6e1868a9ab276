"""Compile scheduler/ with mypyc into build/mypyc/ (run by `make`; `--force` rebuilds).

Why a staging tree: mypyc names a module by its path, and the folder scheduler/ is imported as
servesim.scheduler. So the sources are copied to build/mypyc/servesim/scheduler/ and compiled
there; servesim/__init__.py's checkout finder imports servesim.scheduler from that tree when its
MANIFEST matches the current sources (servesim/_native.py). The pure-Python folder stays the
reference: SERVESIM_PURE_PYTHON=1 selects it, and so does a missing, failed or stale build.

What the staging copy adds, and why it is not in scheduler/ itself: compiled classes refuse
interpreted subclasses unless marked `@mypyc_attr(allow_interpreted_subclasses=True)`, and
mypy_extensions (which defines it) is third-party while scheduler/ is stdlib-only
(tests/test_import_boundary.py). Every class the scheduler defines may be subclassed from Python
(policies and queues as plug-ins, the P/D decode scheduler, test doubles), so the build marks each
compiled class in the copy, importing the marker under TYPE_CHECKING only: mypyc reads the
decorator at compile time, skips type-checking-only imports and never evaluates the decorators of
a native class, so the built modules import nothing but the stdlib either.

The engine's build (tools/compile_simulator.py, run first by `make`) compiles these same modules
with the engine, linked to it, and carries its own copy of this staging tree: while it is current,
the finder takes the scheduler from it and this build is not needed (nothing is built). This one
is the scheduler alone: for a checkout whose engine build failed or went stale.

Exit status 0 when the build is up to date or was built; 1 when mypyc or the C compiler failed
(the Makefile then goes on with the pure-Python scheduler and says so).
"""

from __future__ import annotations

import argparse
import ast
import compileall
import fcntl
import hashlib
import os
import re
import shutil
import sys
import time
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from servesim import _native  # noqa: E402  (after the path insert: run as a script)

# The modules compiled: the vLLM scheduling hot path (schedule(), update_from_output(), the KV
# cache manager, requests, outputs, the token source) and its bulk decode path (scheduler/bulk/:
# in this group, as it reads the scheduler's and KV manager's native attributes; SGLang's stays
# interpreted with SGLang, and so does the package's registry). The rest stays interpreted, still copied so
# the package is complete: cold code (config validation, step traces, invariants, registries),
# SGLang (typed too loosely for mypyc's runtime checks), hashing.py (its block hasher is a closure
# carrying an attribute; sha256 dominates it anyway) and the policies (scheduler/policies/: a few
# calls per step; registered by a class decorator, which keeps mypyc from making them native
# classes, and its compiled methods then refuse instances of interpreted subclasses, the very
# plug-ins the policies exist for; and a native class would shadow a subclass's `queue_type`).
COMPILED = (
    "_schedule.py", "scheduler.py", "async_scheduler.py", "request.py", "output.py", "queues.py",
    "pyset.py", "worker.py", "step_shape.py", "block_keys.py", "lazy_ids.py",
    "kv/block.py", "kv/block_pool.py", "kv/single_type.py", "kv/coordinator.py", "kv/manager.py",
    "kv/events.py", "bulk/interface.py", "bulk/kv.py", "bulk/vllm.py",
)
GROUP = "servesim.scheduler._native"  # one shared library, inside the package (no top-level name)
# Classes mypyc never makes native (nothing to mark): protocols, enums, named tuples, typed dicts.
_NOT_NATIVE_BASES = {"Protocol", "Enum", "IntEnum", "StrEnum", "NamedTuple", "TypedDict"}
_MIXIN_SELF = re.compile(r"^\s*def \w+\(self: (Scheduler|SGLangScheduler|Engine)\b[^#]*$")
_MARK = "@_mypyc_attr(allow_interpreted_subclasses=True)"
_IMPORT = ("from typing import TYPE_CHECKING as _TYPE_CHECKING\n"
           "if _TYPE_CHECKING:\n    from mypy_extensions import mypyc_attr as _mypyc_attr\n")


def _tool_digest() -> str:
    """A change to this build (what is compiled, how it is marked) rebuilds too."""
    return tool_digest()


def tool_digest(*others: Path) -> str:
    """sha256 of this file and `others` (another build that marks its modules with this one's
    transforms: tools/compile_simulator.py)."""
    h = hashlib.sha256(Path(__file__).read_bytes())
    for path in others:
        h.update(path.read_bytes())
    return h.hexdigest()


def _base_names(node: ast.ClassDef) -> set[str]:
    names = set()
    for base in node.bases:
        target = base.value if isinstance(base, ast.Subscript) else base
        names.add(target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", ""))
    return names


def _accept_mixin_self(line: str) -> str:
    """Silence mypy's "erased type of self" on a mixin method typed `self: Scheduler` (or `self: Engine`:
    tools/compile_simulator.py).

    schedule() lives in a mixin (scheduler/_schedule.py) whose methods declare the class they are
    mixed into; mypyc compiles them against that class, which is what runs.
    """
    if not _MIXIN_SELF.match(line):
        return line
    code, newline = line.rstrip("\n"), line[len(line.rstrip("\n")):]
    return f"{code}  # type: ignore[misc]{newline}"


def _decorator_name(node: ast.expr) -> str:
    target = node.func if isinstance(node, ast.Call) else node
    return target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")


def _is_native(node: ast.ClassDef) -> bool:
    """Whether mypyc compiles the class as a native class (which needs the mark).

    Any other decorator (a registry's `register`) makes a regular Python class, already open to
    subclasses, whose decorators run at import time: the mark must not be there.
    """
    if _base_names(node) & _NOT_NATIVE_BASES:
        return False
    return all(_decorator_name(d) in ("dataclass", "final") for d in node.decorator_list)


def _dataclass_call(node: ast.ClassDef) -> ast.Call | None:
    """The class's `@dataclass(...)` decorator call, when it lets dataclasses write __init__."""
    for dec in node.decorator_list:
        if isinstance(dec, ast.Call) and _decorator_name(dec) == "dataclass":
            flags = {k.arg: k.value for k in dec.keywords}
            if any(isinstance(flags.get(f), ast.Constant) and flags[f].value == value
                   for f, value in (("init", False), ("kw_only", True))):
                return None
            has_init = any(isinstance(b, ast.FunctionDef) and b.name == "__init__" for b in node.body)
            return None if has_init else dec
    return None


def _is_frozen(dec: ast.Call) -> bool:
    return any(k.arg == "frozen" and isinstance(k.value, ast.Constant) and k.value.value is True
               for k in dec.keywords)


def _init_source(node: ast.ClassDef, source: str, indent: str, frozen: bool) -> list[str]:
    """An explicit __init__ equal to the one dataclasses writes (fields in order, defaults,
    default factories, __post_init__). Frozen: the compiled __init__ sets the native attributes
    directly, as dataclasses' own does through object.__setattr__ (mypy, which knows the fields
    read-only, is told so on those lines); anything else assigning one still raises."""
    params, body = ["self"], []
    for stmt in node.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        name, annotation = stmt.target.id, ast.get_source_segment(source, stmt.annotation)
        if "ClassVar" in annotation:
            continue
        value = stmt.value
        factory = None
        if isinstance(value, ast.Call) and _decorator_name(value) == "field":
            args = {k.arg: k.value for k in value.keywords}
            factory, value = args.get("default_factory"), args.get("default")
        if factory is not None:  # a fresh object per instance, as dataclasses makes it
            params.append(f"{name}: {annotation} | None = None")
            body.append(f"self.{name} = {ast.get_source_segment(source, factory)}() if {name} is None else {name}")
            continue
        default = "" if value is None else f" = {ast.get_source_segment(source, value)}"
        params.append(f"{name}: {annotation}{default}")
        body.append(f"self.{name} = {name}")
    if any(isinstance(b, ast.FunctionDef) and b.name == "__post_init__" for b in node.body):
        body.append("self.__post_init__()")
    if frozen:
        body = [f"{line}  # type: ignore[misc]" if line.startswith("self.") and " = " in line else line
                for line in body]
    lines = [f"{indent}def __init__({', '.join(params)}) -> None:\n"]
    return lines + [f"{indent}    {line}\n" for line in body or ["pass"]]


def native_dataclass_inits(source: str) -> str:
    """The source with an explicit __init__ in each dataclass that dataclasses would give one.

    mypyc compiles a dataclass's methods natively but calls the __init__ that dataclasses
    generates as interpreted Python (through tp_init, with an argument tuple): about 1 us per
    object, and the scheduler builds several objects per request per step (RequestOutput,
    KVCacheBlocks, stats). The same __init__ written in the class is compiled; repr, eq and the
    fields stay the dataclass's. A frozen dataclass's own __init__ is slower still (an
    object.__setattr__ call per field: ~2 us for a two-field StepShape, ~0.26 us compiled).
    The pure-Python package keeps the plain dataclasses.
    """
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    edits: list[tuple[int, int, list[str]]] = []  # (line index, lines replaced, new lines)
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef) or (dec := _dataclass_call(node)) is None:
            continue
        indent = " " * node.body[0].col_offset
        edits.append((node.end_lineno, 0, _init_source(node, source, indent, _is_frozen(dec))))
        line = lines[dec.lineno - 1]
        edits.append((dec.lineno - 1, 1, [line.replace("dataclass(", "dataclass(init=False, ", 1)]))
    for index, count, new in sorted(edits, reverse=True):
        lines[index:index + count] = new
    return "".join(lines)


def mark_subclassable(source: str) -> str:
    """The source with every native top-level class marked for interpreted subclasses."""
    tree = ast.parse(source)
    lines = [_accept_mixin_self(line) for line in source.splitlines(keepends=True)]
    marks = [min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
             for node in tree.body if isinstance(node, ast.ClassDef) and _is_native(node)]
    for index in sorted(marks, reverse=True):
        lines.insert(index, _MARK + "\n")
    future = next(i for i, line in enumerate(lines) if line.startswith("from __future__ import"))
    lines.insert(future + 1, _IMPORT)
    return "".join(lines)


def stage(staging: Path) -> str:
    """Copy scheduler/ into a new staging tree, mark the compiled modules; the copied sources' digest."""
    if staging.exists():
        shutil.rmtree(staging)
    package = staging / _native.PACKAGE
    shutil.copytree(ROOT / "scheduler", package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (package.parent / "__init__.py").write_text("")  # only so mypy names the modules servesim.*
    digest = _native.sources_digest(package)  # of what is compiled, before marking
    for rel in COMPILED:
        path = package / rel
        path.write_text(mark_subclassable(native_dataclass_inits(path.read_text())))
    return digest


def build(staging: Path, jobs: int) -> None:
    compile_group(staging, [str(_native.PACKAGE / rel) for rel in COMPILED], GROUP, "servesim-scheduler-native", jobs)


def compile_group(src: Path, files: list[str], group: str, name: str, jobs: int) -> None:
    """mypyc `files` (paths under the staging tree `src`) into one shared library named `group`,
    the extension modules written beside their sources."""
    compile_groups(src, [(files, group)], name, jobs)


def compile_groups(src: Path, groups: list[tuple[list[str], str]], name: str, jobs: int) -> None:
    """mypyc each group's files (paths under the staging tree `src`) into one shared library named
    after the group, in one compilation: a later group's code reads an earlier group's native
    attributes and calls its functions directly (C calls, through a table the library exports),
    not through Python's attribute and call protocol (tools/compile_simulator.py: the engine
    linked to the scheduler). The libraries are built for each other: one is never loaded with
    another build of the other."""
    from mypyc.build import mypycify  # noqa: PLC0415 (only the build needs mypy)
    from setuptools import setup  # noqa: PLC0415

    cwd = os.getcwd()
    os.chdir(src)
    try:
        # follow_imports=silent: the interpreted modules are read for their types, not checked
        # (a missing third-party stub likewise). union-attr and operator stay unchecked: mypyc
        # compiles an attribute or operator on an Optional value as the generic Python
        # operation, so it fails exactly as the pure code does.
        options = ["--follow-imports=silent", "--ignore-missing-imports", "--disable-error-code=union-attr",
                   "--disable-error-code=operator", "--disable-error-code=annotation-unchecked"]
        files = [f for group_files, _ in groups for f in group_files]
        if len(groups) == 1:
            ext = mypycify([*options, *files], group_name=groups[0][1], multi_file=False, opt_level="3",
                           target_dir="c")
        else:
            ext = mypycify([*options, *files], separate=[(list(f), g) for f, g in groups], multi_file=False,
                           opt_level="3", target_dir="c")
        setup(name=name, ext_modules=ext,
              script_args=["-q", "build_ext", "--inplace", "--build-temp", "tmp", f"--parallel={jobs}"])
    finally:
        os.chdir(cwd)


def main() -> int:
    return run_build(ROOT / _native.STAGING, "mypyc.lock", _build_if_stale)


def run_build(live: Path, lock_name: str, build_if_stale) -> int:
    """Parse --force / --jobs, then build_if_stale(live, force, jobs) holding a lock: one build at
    a time (`make run` and `make test` in two terminals: the second waits, then finds the build up
    to date)."""
    ap = argparse.ArgumentParser(description=sys.modules["__main__"].__doc__.splitlines()[0])
    ap.add_argument("--force", action="store_true", help="rebuild even when the build is up to date")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel C compiles")
    args = ap.parse_args()
    live.parent.mkdir(parents=True, exist_ok=True)
    with open(live.parent / lock_name, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return build_if_stale(live, args.force, args.jobs)


def _build_if_stale(staging: Path, force: bool, jobs: int) -> int:
    manifest = _native.read_manifest(staging)
    digest_now = _native.sources_digest(ROOT / "scheduler")
    if (not force and manifest.get("sources") == digest_now
            and manifest.get("ext_suffix") == EXTENSION_SUFFIXES[0]
            and manifest.get("tool") == _tool_digest()):
        print("compiled scheduler: up to date")
        return 0
    if not force and _native.compiled_simulator(ROOT)[0] is not None:
        print(f"compiled scheduler: up to date (built with the engine: {ROOT / _native.SIM_STAGING})")
        return 0
    started = time.monotonic()
    print(f"compiling the scheduler with mypyc ({len(COMPILED)} modules, {jobs} jobs) ...", flush=True)
    # Built beside the live tree (left as it is if the build fails; the finder's digest check
    # decides whether it is used) and swapped in whole at the end: the live tree is never half-built.
    fresh = staging.with_name(staging.name + ".new")
    digest = stage(fresh)
    try:
        build(fresh, jobs)
    except (Exception, SystemExit) as e:  # mypy errors surface as SystemExit from setup()
        print(f"compiled scheduler: build failed ({type(e).__name__}: {e}); C sources in {fresh}", file=sys.stderr)
        return 1
    # The interpreted modules copied beside the extension get their bytecode now, written for
    # their final place: with PYTHONDONTWRITEBYTECODE set (or a read-only tree) every process
    # would otherwise compile them again at import.
    compileall.compile_dir(str(fresh / _native.PACKAGE), ddir=str(staging / _native.PACKAGE), quiet=1,
                           workers=1)
    _native.publish_build(fresh, staging, {"sources": digest, "tool": _tool_digest(), "modules": ",".join(COMPILED)})
    print(f"compiled scheduler: built in {time.monotonic() - started:.0f} s ({staging})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
