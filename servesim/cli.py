"""The `servesim` command line (typer). Each command lives in its own module under servesim/commands."""

from __future__ import annotations

import sys

import typer

from traces.errors import InputError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="servesim: simulate LLM serving engines.")

# Every command module registers itself with @app.command() on import.
COMMANDS = ("replay", "steptrace", "fit", "calibrate", "calibrate_frontend", "validate", "validate_stages",
            "validate_bench", "run", "plot", "plan", "cluster")


@app.callback()
def _root() -> None:
    """servesim: simulate LLM serving engines (vLLM V1 scheduler) on a SimPy clock or a GPU."""


def _register() -> None:
    for name in COMMANDS:
        try:
            __import__(f"servesim.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"servesim.commands.{name}":
                _broken(name, e)
        except Exception as e:  # a broken command must not take the others down with it
            _broken(name, e)


def _broken(name: str, err: Exception) -> None:
    @app.command(name, help=f"(unavailable: {err})")
    def _unavailable() -> None:
        typer.secho(f"error: the '{name}' command failed to load: {err!r}", fg="red", err=True)
        sys.exit(2)


def main() -> None:
    _register()
    try:
        app()
    except InputError as e:
        typer.secho(f"error: {e}", fg="red", err=True)
        sys.exit(2)
