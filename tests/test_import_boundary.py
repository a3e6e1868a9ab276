"""scheduler/ (servesim.scheduler) imports nothing third-party and nothing of simulator/ or gpu_runner/; reads no clock."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAPPED = ("scheduler", "simulator", "gpu_runner", "traces")  # installed as servesim.<folder>


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [_layer(a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(_layer(node.module))
    return names


def _layer(module: str) -> str:
    """'servesim.scheduler.kv' -> 'scheduler'; 'servesim.cli' -> 'servesim'; 'numpy.linalg' -> 'numpy'."""
    parts = module.split(".")
    if parts[0] == "servesim" and len(parts) > 1 and parts[1] in MAPPED:
        return parts[1]
    return parts[0]


def test_scheduler_imports_only_stdlib_and_itself():
    bad = []
    for path in (ROOT / "scheduler").rglob("*.py"):
        for name in _imports(path):
            if name == "scheduler" or name in sys.stdlib_module_names or name == "__future__":
                continue
            bad.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not bad, bad


def test_scheduler_reads_no_wall_clock():
    for path in (ROOT / "scheduler").rglob("*.py"):
        text = path.read_text()
        for call in ("time.time(", "time.monotonic(", "time.perf_counter(", "datetime.now("):
            assert call not in text, f"{path.relative_to(ROOT)} reads a clock ({call})"


def test_simulator_and_gpu_runner_do_not_import_each_other_or_the_cli():
    for pkg, banned in (("simulator", {"gpu_runner", "servesim"}), ("gpu_runner", {"servesim"})):
        for path in (ROOT / pkg).rglob("*.py"):
            hits = set(_imports(path)) & banned
            assert not hits, f"{path.relative_to(ROOT)} imports {hits}"
