"""Write the bytecode of every Python module a replay imports (`make` runs it after installing).

`pip install` normally byte-compiles what it installs, and Python caches the bytecode of whatever
else it imports. With PYTHONDONTWRITEBYTECODE set (as on some CI machines and sandboxes), neither
happens: each `servesim` process then compiles ~250 modules (rich, typer, pydantic, simpy, servesim
itself) from source again, about a quarter of a second of every command. This runs a tiny replay
in-process, so the modules loaded are exactly what a replay loads, lazy imports included, and
byte-compiles each one whose cache is missing or stale (compileall writes it explicitly, whatever
the environment says). Running it again is a cheap no-op.

    python tools/precompile.py [--quiet]
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import io
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def loaded_sources() -> list[str]:
    """Source files of the modules loaded now (extension modules and frozen ones have none)."""
    files = []
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and path.endswith(".py"):
            files.append(path)
    return sorted(set(files))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quiet", action="store_true", help="print nothing on success")
    args = ap.parse_args()
    from servesim.cli import main as cli_main  # noqa: PLC0415 (imported by the run it measures)

    with tempfile.TemporaryDirectory(prefix="servesim-precompile-") as tmp:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            sys.argv = ["servesim", "replay", "--max-requests", "5", "--out", str(Path(tmp) / "run")]
            try:
                cli_main()
            except SystemExit as e:
                if e.code not in (0, None):
                    print(out.getvalue(), file=sys.stderr)
                    print(f"precompile: the tiny replay failed (exit {e.code})", file=sys.stderr)
                    return 1
    files = loaded_sources()
    # A module in a read-only place (a system Python's standard library) keeps what it has.
    written = sum(bool(compileall.compile_file(f, quiet=2)) for f in files)
    if not args.quiet:
        print(f"precompile: bytecode current for {written} of the {len(files)} modules a replay imports")
    return 0


if __name__ == "__main__":
    sys.exit(main())
