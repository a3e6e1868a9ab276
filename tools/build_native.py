"""Compile servesim's hot path with mypyc: one build, build/native/ (run by `make`; `--force` rebuilds).

COMPILED below is the one list to edit. All listed modules are compiled in one mypyc compilation,
one shared library per folder (servesim.<folder>._native__mypyc), linked: the engine reads the
scheduler's native attributes as struct fields and calls its functions as C functions. The
libraries are built for each other, so the build is used whole or not at all.

Why a staging tree: mypyc names a module by its path, and the folder scheduler/ is imported as
servesim.scheduler. So STAGED_FOLDERS (whose types mypy reads; follow_imports=silent checks only the
compiled modules) are copied as a `servesim` package into build/native.work/src/, and the copies of
the listed modules, only they, are transformed (the folders stay stdlib-only and plain): native
classes marked for interpreted subclasses (mark_subclassable), dataclass __init__s written out
(native_dataclass_inits), `self: Scheduler`/`self: Engine` mixin methods accepted.

Two consumers, one recipe (stage(), then extensions()):
- a checkout (`make compile`, main()): compiled in the staging tree, then the extension modules
  alone are published to build/native/servesim/<folder>/ with a MANIFEST written last (the folders,
  each one's sources digest, the extension suffix, this script's digest); servesim/_native.py's
  select_build uses it while it matches, and the checkout finder searches it ahead of each folder;
- a wheel (`pip wheel .`, `pip install .`: setup.py's build_ext calls wheel_extensions()): setuptools
  compiles the same extensions into the wheel beside the .py files, where Python imports them first.

Exit status 0 when the build is up to date or was built; 1 when a listed module is missing or mypyc
or the C compiler failed (the Makefile then goes on with the pure-Python modules and says so).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib.util
import os
import re
import shlex
import shutil
import sys
import sysconfig
import time
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from setuptools import Extension

# ---------------------------------------------------------------------------------------------
# What is compiled: the one list to edit. Keys are repository folders (installed as
# servesim.<folder>), in dependency order; values are module paths inside the folder. A listed
# module that does not exist stops the build with an error naming it.
# ---------------------------------------------------------------------------------------------
COMPILED: dict[str, tuple[str, ...]] = {
    # The vLLM and SGLang scheduling hot paths and their bulk decode paths (scheduler/bulk/: each
    # reads its scheduler's and memory's native attributes, so it is compiled with them). SGLang's
    # radix trees are compiled together (HiRadixCache and MambaRadixCache subclass RadixCache).
    # Interpreted on purpose: cold code (config validation, step traces, invariants, registries,
    # SGLang's HiCache controller and configs), hashing.py (its block hasher is a closure carrying
    # an attribute) and the policies, vLLM's and SGLang's orderings (registered by a decorator at
    # import, which keeps mypyc from making them native classes; a native class would refuse the
    # interpreted subclasses the policies exist for).
    "scheduler": (
        "_schedule.py", "scheduler.py", "async_scheduler.py", "request.py", "output.py", "queues.py",
        "pyset.py", "worker.py", "step_shape.py", "block_keys.py", "lazy_ids.py",
        "kv/block.py", "kv/block_pool.py", "kv/single_type.py", "kv/coordinator.py", "kv/manager.py",
        "kv/events.py", "bulk/interface.py", "bulk/kv.py", "bulk/heads.py", "bulk/joins.py",
        "bulk/sampled_update.py", "bulk/vllm.py", "bulk/spec.py", "bulk/spec_plan.py", "bulk/spec_join.py", "bulk/pd.py",
        "prefix_lookup.py",  # a prefix-aware router's lookup, on every replica at every decision
        "kv/root_set.py",  # the KV manager's key roots, at every arrival
        "sglang/radix_cache.py", "sglang/hiradix_cache.py", "sglang/mamba_radix_cache.py", "sglang/memory.py",
        "sglang/prefill_adder.py", "sglang/output.py", "sglang/batching.py", "sglang/scheduler.py",
        "bulk/sglang_memory.py", "bulk/sglang.py",
    ),
    # The engine (the reference core and the objects it owns) around every scheduler call, what it
    # calls at every step (step table, request records, the simulated executor), the fast path's
    # planner (simulator/fastpath/) and the numeric kernels (simulator/kernels.py). The cost
    # models, metrics built after the run, router proofs and SimPy stay interpreted.
    "simulator": (
        "step_table.py", "request_records.py", "finished_records.py", "executor.py", "request_factory.py", "step_book.py",
        "watchdog.py", "deadlines.py", "engine.py", "kernels.py",
        "fastpath/timeline.py", "fastpath/through.py", "fastpath/runs.py", "fastpath/deferred.py",
        "fastpath/planner.py", "fastpath/spec_runs.py", "fastpath/spec_rows.py", "fastpath/run_length.py",
        "fastpath/planned_reads.py",  # a state-reading router's reads, on every replica at every decision
        "client.py",  # the clients' send loop, at every arrival
        # the engine's own parts it calls per step or per request (split out of engine.py)
        "request_ends.py", "idle_wait.py", "workload_replay.py",
        # P/D: the schedulers and engines subclass the compiled ones natively (their calls on
        # themselves stay vtable calls), the connectors are consulted per request. pd_keys.py stays
        # interpreted (once per hand-off; tests spy on it).
        "cluster/pd_connectors.py", "cluster/pd_schedulers.py", "cluster/pd.py",
        # ... and what each P/D request passes through once or twice: its hand-off and transfer
        # callbacks, and the link's events.
        "cluster/pd_handoffs.py", "cluster/link.py",
    ),
}
# Staged for mypy to read the types of whatever the compiled modules import (not compiled).
STAGED_FOLDERS = ("scheduler", "simulator", "traces")

ROOT = Path(__file__).resolve().parent.parent
_NOT_NATIVE_BASES = {"Protocol", "Enum", "IntEnum", "StrEnum", "NamedTuple", "TypedDict"}
_MIXIN_SELF = re.compile(r"^\s*def \w+\(self: (Scheduler|SGLangScheduler|Engine)\b[^#]*$")
_MARK = "@_mypyc_attr(allow_interpreted_subclasses=True)"
_IMPORT = ("from typing import TYPE_CHECKING as _TYPE_CHECKING\n"
           "if _TYPE_CHECKING:\n    from mypy_extensions import mypyc_attr as _mypyc_attr\n")
# follow_imports=silent: the interpreted modules are read for their types, not checked (a missing
# third-party stub likewise). union-attr and operator stay unchecked: mypyc compiles an attribute or
# operator on an Optional value as the generic Python operation, so it fails as the pure code does.
_MYPY_OPTIONS = ("--follow-imports=silent", "--ignore-missing-imports", "--disable-error-code=union-attr",
                 "--disable-error-code=operator", "--disable-error-code=annotation-unchecked")


class BuildError(Exception):
    """The build cannot be made (a listed module is missing, mypyc or the compiler failed)."""


def _manifest_module() -> ModuleType:
    """servesim/_native.py, the MANIFEST's reader (digests, names), loaded by path: importing the
    servesim package would install its checkout finder in the build's process."""
    name = "_servesim_native_for_build"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "servesim" / "_native.py")
        sys.modules[name] = importlib.util.module_from_spec(spec)  # dataclasses look the module up
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def compiler_missing() -> str | None:
    """What this machine lacks to build (mypyc, a C compiler), or None (cheap: no compiling)."""
    if importlib.util.find_spec("mypyc") is None:
        return "mypyc is not installed"
    cc = sysconfig.get_config_var("CC") or "cc"
    if shutil.which(shlex.split(cc)[0]) is None:
        return f"no C compiler ({cc})"
    return None


def listed_modules() -> list[str]:
    """Every listed module as a repository path, e.g. 'scheduler/kv/block.py'."""
    return [f"{folder}/{rel}" for folder, rels in COMPILED.items() for rel in rels]


def check_listed(root: Path) -> None:
    missing = [rel for rel in listed_modules() if not (root / rel).is_file()]
    if missing:
        raise BuildError(f"listed for compiling but not found: {', '.join(missing)} "
                         "(edit COMPILED at the top of tools/build_native.py)")


def tool_digest() -> str:
    """A change to this build (what is compiled, how it is marked) makes the build stale."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


# --- the staging copy's transforms -----------------------------------------------------------

def _base_names(node: ast.ClassDef) -> set[str]:
    names = set()
    for base in node.bases:
        target = base.value if isinstance(base, ast.Subscript) else base
        names.add(target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", ""))
    return names


def _accept_mixin_self(line: str) -> str:
    """Silence mypy's "erased type of self" on a mixin method typed `self: Scheduler` (or Engine):
    mypyc compiles it against the class it is mixed into, which is what runs."""
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
    """The source with every native top-level class marked for interpreted subclasses.

    The marker's import goes after `from __future__ import annotations`, which every compiled
    module starts with (mypyc must not evaluate annotations naming TYPE_CHECKING-only types)."""
    tree = ast.parse(source)
    lines = [_accept_mixin_self(line) for line in source.splitlines(keepends=True)]
    marks = [min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
             for node in tree.body if isinstance(node, ast.ClassDef) and _is_native(node)]
    for index in sorted(marks, reverse=True):
        lines.insert(index, _MARK + "\n")
    future = next((i for i, line in enumerate(lines) if line.startswith("from __future__ import")), None)
    if future is None:
        raise BuildError("a compiled module must start with `from __future__ import annotations`")
    lines.insert(future + 1, _IMPORT)
    return "".join(lines)


# --- the recipe: stage, then extensions ------------------------------------------------------

def stage(root: Path, src: Path) -> dict[str, str]:
    """A new staging tree `src`: a servesim package of STAGED_FOLDERS' .py files, the listed modules
    transformed; the MANIFEST's digest of each compiled folder, taken from the folder itself."""
    check_listed(root)
    native = _manifest_module()
    if src.exists():
        shutil.rmtree(src)

    def not_python(folder: str, names: list[str]) -> set[str]:  # data files, caches: mypy needs neither
        return {n for n in names if n == "__pycache__" or (not n.endswith((".py", ".pyi"))
                                                           and not os.path.isdir(os.path.join(folder, n)))}

    for folder in STAGED_FOLDERS:
        shutil.copytree(root / folder, src / "servesim" / folder, ignore=not_python)
    (src / "servesim" / "__init__.py").write_text("")  # only so mypy names the modules servesim.*
    for rel in listed_modules():
        path = src / "servesim" / rel
        try:
            path.write_text(mark_subclassable(native_dataclass_inits(path.read_text())))
        except BuildError as e:
            raise BuildError(f"{rel}: {e}") from None
    return {f"{folder}_sources": native.sources_digest(root / folder) for folder in COMPILED}


def extensions(src: Path, c_dir: Path) -> list[Extension]:
    """mypyc the listed modules of the staging tree `src` (C written to c_dir): the extension
    modules to compile, one shared library per folder (all in one compilation, linked), with
    absolute source paths (setuptools may compile them from any directory)."""
    from mypyc.build import mypycify  # noqa: PLC0415 (only the build needs mypy)

    groups = [([f"servesim/{folder}/{rel}" for rel in rels], f"servesim.{folder}._native")
              for folder, rels in COMPILED.items()]
    files = [f for group_files, _ in groups for f in group_files]
    cwd = os.getcwd()
    os.chdir(src)  # mypy names each module by its path: servesim/scheduler/x.py is servesim.scheduler.x
    try:
        return mypycify([*_MYPY_OPTIONS, *files], separate=groups, multi_file=False, opt_level="3",
                        target_dir=str(c_dir.resolve()))
    except SystemExit as e:  # mypy's type errors and mypyc's failures exit
        raise BuildError(f"mypyc failed: {e}") from None
    finally:
        os.chdir(cwd)


def wheel_extensions(root: Path, work: Path) -> list[Extension]:
    """For setup.py's build_ext: stage `root` in `work` and return the extensions to compile."""
    stage(root, work / "src")
    return extensions(work / "src", work / "c")


def expected_outputs() -> dict[str, set[str]]:
    """Per compiled folder, the extension modules a build makes (paths without the suffix)."""
    return {folder: {rel.removesuffix(".py") for rel in rels} | {"_native__mypyc"}
            for folder, rels in COMPILED.items()}


# --- a checkout's build ----------------------------------------------------------------------

def _compile(exts: list[Extension], work: Path, jobs: int) -> Path:
    """Compile `exts` into work/lib (objects in work/tmp); the folder. Both are kept between builds:
    a C file mypyc wrote unchanged keeps its time, so its objects and extension are not rebuilt."""
    from setuptools import setup  # noqa: PLC0415

    cwd = os.getcwd()
    os.chdir(work)  # setuptools reads a pyproject.toml in its working directory: none here
    try:
        setup(name="servesim-native", ext_modules=exts, packages=[],
              script_args=["-q", "build_ext", "--build-lib", "lib", "--build-temp", "tmp", f"--parallel={jobs}"])
    except SystemExit as e:  # the compiler's failure
        raise BuildError(f"the C compiler failed: {e}") from None
    finally:
        os.chdir(cwd)
    return work / "lib"


def _publish(lib: Path, fresh: Path, live: Path, fields: dict[str, str]) -> None:
    """Lay out `fresh` (the extension modules alone, per folder, from the build's `lib`), write its MANIFEST last, and put it
    in the place of `live`: a reader finds the old build or the new one, never half of one."""
    import mypy.version  # noqa: PLC0415

    suffix = EXTENSION_SUFFIXES[0]
    if fresh.exists():
        shutil.rmtree(fresh)
    for folder, expected in expected_outputs().items():
        missing = [rel for rel in sorted(expected) if not (lib / "servesim" / folder / (rel + suffix)).is_file()]
        if missing:
            raise BuildError(f"build incomplete in {folder}/: missing {missing}")
        for rel in expected:  # (lib may hold modules an earlier list compiled)
            (fresh / "servesim" / folder / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(lib / "servesim" / folder / (rel + suffix), fresh / "servesim" / folder / (rel + suffix))
    fields = {**fields, "ext_suffix": suffix, "mypy": mypy.version.__version__}
    (fresh / "MANIFEST").write_text("".join(f"{key}={value}\n" for key, value in fields.items()))
    old = live.with_name(live.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if live.exists():
        live.rename(old)
    fresh.rename(live)
    shutil.rmtree(old, ignore_errors=True)


def build_checkout(root: Path, force: bool, jobs: int) -> int:
    """Build root's build/native/ unless its MANIFEST says it is current (then a no-op)."""
    native = _manifest_module()
    live = root / native.BUILD
    try:
        check_listed(root)
    except BuildError as e:
        print(f"compiled build: {e}", file=sys.stderr)
        return 1
    manifest = native.read_manifest(live)
    current = {f"{folder}_sources": native.sources_digest(root / folder) for folder in COMPILED}
    wanted = {**current, "packages": ",".join(COMPILED), "ext_suffix": EXTENSION_SUFFIXES[0], "tool": tool_digest()}
    if not force and all(manifest.get(key) == value for key, value in wanted.items()):
        print("compiled build: up to date")
        return 0
    started = time.monotonic()
    print(f"compiling with mypyc ({len(listed_modules())} modules of {', '.join(COMPILED)}, {jobs} jobs) ...",
          flush=True)
    work = live.with_name(live.name + ".work")  # staging tree, C sources, objects, extensions
    try:
        digests = stage(root, work / "src")
        lib = _compile(extensions(work / "src", work / "c"), work, jobs)
        _publish(lib, live.with_name(live.name + ".new"), live,
                 {"packages": ",".join(COMPILED), **digests, "tool": tool_digest(),
                  "modules": ",".join(listed_modules())})
    except BuildError as e:
        print(f"compiled build: failed ({e}); the staging tree and C sources are in {work}", file=sys.stderr)
        return 1
    print(f"compiled build: built in {time.monotonic() - started:.0f} s ({live})")
    return 0


def main() -> int:
    import fcntl  # noqa: PLC0415 (the lock is the script's; setup.py imports this module on any OS)

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--force", action="store_true", help="rebuild even when the build is up to date")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel C compiles")
    args = ap.parse_args()
    (ROOT / "build").mkdir(exist_ok=True)
    # One build at a time (`make run` and `make test` in two terminals: the second waits, then
    # finds the build up to date).
    with open(ROOT / "build" / "native.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return build_checkout(ROOT, args.force, args.jobs)


if __name__ == "__main__":
    sys.exit(main())
