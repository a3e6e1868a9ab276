"""The module import graph of our five packages (every import, also the lazy ones inside functions).

Why: issue 14 — `servesim.api` is a facade, the packages are layered
(scheduler < traces < gpu_runner < simulator < servesim), and no module cycle hides behind a lazy import.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("scheduler", "traces", "gpu_runner", "simulator", "servesim")
# Cycles we accept (each a set of modules, with the reason): none. A new cycle fails the test; if one
# must ever be accepted, list it here with its reason (a listed cycle that is gone fails too).
KNOWN_CYCLES: dict[frozenset[str], str] = {}


def _module_name(path: Path) -> str:
    """The installed name: scheduler/kv.py is servesim.scheduler.kv (setup.py maps the folders)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    if parts[0] != "servesim":
        parts.insert(0, "servesim")
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def _resolve(node: ast.ImportFrom, mod: str, is_pkg: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _targets(name: str, mods: dict[str, Path]) -> str | None:
    """The longest module of ours that `name` names (a `from m import f` names m.f, which may be a symbol)."""
    while name:
        if name in mods:
            return name
        name = name.rpartition(".")[0]
    return None


def _is_type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _runtime_nodes(tree: ast.AST):
    """Every node that can run, lazy imports inside functions included; `if TYPE_CHECKING:` bodies are
    skipped (annotations only, never executed, so never a cycle at import time). Their `else:` still counts."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(node, mod, is_pkg)
                names = [f"{base}.{a.name}" for a in node.names] or [base]
            for name in names:
                target = _targets(name, mods)
                if target and target != mod:
                    graph[mod].add(target)
    return graph


def _top(mod: str) -> str:
    """The layer a module belongs to: its folder (scheduler, traces, ...), or servesim for the rest."""
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in PACKAGES[:-1] else "servesim"


def _edges_into(graph, src_pred, dst_pred) -> list[str]:
    return sorted(f"{s} -> {d}" for s, ds in graph.items() if src_pred(s) for d in ds if dst_pred(d))


def _sccs(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's strongly connected components, iterative (the graph has hundreds of modules)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[set[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    comp.add(member)
                    if member == node:
                        break
                out.append(comp)
    return out


GRAPH = _graph()


def test_the_graph_sees_lazy_imports():
    # Guard against a parser that silently finds nothing: servesim.cli must reach the scheduler somehow.
    assert GRAPH["servesim.cli"], "servesim.cli imports nothing?"
    assert len(GRAPH) > 50


def test_api_is_a_facade_nothing_below_imports_it():
    bad = _edges_into(GRAPH, lambda s: s != "servesim.api", lambda d: d == "servesim.api")
    assert not bad, bad


def test_scheduler_imports_nothing_of_ours_outside_itself():
    bad = _edges_into(GRAPH, lambda s: _top(s) == "scheduler", lambda d: _top(d) != "scheduler")
    assert not bad, bad


def test_traces_imports_no_simulator_gpu_runner_or_servesim():
    banned = {"simulator", "gpu_runner", "servesim"}
    bad = _edges_into(GRAPH, lambda s: _top(s) == "traces", lambda d: _top(d) in banned)
    assert not bad, bad


def test_gpu_runner_imports_no_simulator_or_servesim():
    banned = {"simulator", "servesim"}
    bad = _edges_into(GRAPH, lambda s: _top(s) == "gpu_runner", lambda d: _top(d) in banned)
    assert not bad, bad


def test_simulator_imports_nothing_from_servesim():
    bad = _edges_into(GRAPH, lambda s: _top(s) == "simulator", lambda d: _top(d) == "servesim")
    assert not bad, bad


def test_no_module_cycles_except_the_listed_ones():
    cycles = [frozenset(c) for c in _sccs(GRAPH) if len(c) > 1]
    unexpected = [sorted(c) for c in cycles if c not in KNOWN_CYCLES]
    assert not unexpected, unexpected
    gone = [sorted(c) for c in KNOWN_CYCLES if c not in cycles]
    assert not gone, f"fixed cycles still listed in KNOWN_CYCLES (delete the rows): {gone}"


def test_no_cycle_spans_two_packages():
    # The layering tests above forbid the downward edges; this also catches a cycle between two packages that
    # the layering does not order, and keeps KNOWN_CYCLES from ever excusing one.
    for cycle in _sccs(GRAPH):
        assert len({_top(m) for m in cycle}) == 1, sorted(cycle)


def test_the_cycle_finder_finds_a_cycle():
    assert {frozenset(c) for c in _sccs({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})} == {
        frozenset("abc"), frozenset("d")}
